package ctrckpt

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The findings from what /proc shows, each kind and its weight: an MPS
// client and a non-x86-64 host refuse; /dev/nvidia-uvm, several CUDA
// processes, NCCL and GPUs of several models warn.
func TestAssess(t *testing.T) {
	one := []procView{{PID: 10, Use: CUDAUse{PID: 10, MapsLibcuda: true}}}
	if fs := assess(one, []string{"H100"}, "amd64"); len(fs) != 0 {
		t.Errorf("one plain CUDA process: %v", fs)
	}
	mps := []procView{{PID: 10, MPSPipe: "/tmp/nvidia-mps"}}
	if fs := assess(mps, nil, "amd64"); len(fs) != 1 || !fs[0].Refuse || !strings.Contains(fs[0].What, "MPS client") || Refusals(fs) == "" {
		t.Errorf("MPS client: %v", fs)
	}
	if fs := assess(one, nil, "arm64"); len(fs) != 1 || !fs[0].Refuse || !strings.Contains(fs[0].What, "x86-64") {
		t.Errorf("arm64: %v", fs)
	}
	if fs := assess(nil, nil, "arm64"); len(fs) != 0 {
		t.Errorf("no CUDA process on arm64: %v", fs)
	}
	uvm := []procView{{PID: 10, UVM: true}}
	if fs := assess(uvm, nil, "amd64"); len(fs) != 1 || fs[0].Refuse || !strings.Contains(fs[0].What, "managed memory") {
		t.Errorf("uvm: %v", fs)
	}
	multi := []procView{{PID: 10, NCCL: true}, {PID: 11, NCCL: true}}
	if fs := assess(multi, nil, "amd64"); len(fs) != 1 || fs[0].Refuse || !strings.Contains(fs[0].What, "2 CUDA processes [10 11]") || !strings.Contains(fs[0].What, "map NCCL") {
		t.Errorf("two NCCL processes: %v", fs)
	}
	if fs := assess([]procView{{PID: 10, NCCL: true}}, nil, "amd64"); len(fs) != 1 || fs[0].Refuse || !strings.Contains(fs[0].What, "NVLS") {
		t.Errorf("one NCCL process: %v", fs)
	}
	if fs := assess(one, []string{"H100", "H100", "L4"}, "amd64"); len(fs) != 1 || fs[0].Refuse || !strings.Contains(fs[0].What, "2 models (H100, L4)") {
		t.Errorf("mixed models: %v", fs)
	}
	if Refusals(assess(multi, []string{"H100", "L4"}, "amd64")) != "" {
		t.Error("warnings refused")
	}
}

// A container in its own network namespace is refused before the CUDA
// lock when CRIU's default network lock (iptables-restore and
// ip6tables-restore from PATH) cannot run; not when it shares the
// runtime's namespace, when both programs are there, or when a CRIU
// configuration file picks the lock.
func TestNetworkLock(t *testing.T) {
	have := func(progs ...string) func(string) (string, error) {
		return func(p string) (string, error) {
			for _, q := range progs {
				if p == q {
					return "/usr/sbin/" + p, nil
				}
			}
			return "", exec.ErrNotFound
		}
	}
	if f := networkLock(true, have(), false); f == nil || !f.Refuse ||
		!strings.Contains(f.What, "iptables-restore and ip6tables-restore are not in PATH") || !strings.Contains(f.What, "apt-get install iptables") {
		t.Errorf("own namespace, no iptables: %+v", f)
	}
	if f := networkLock(true, have("iptables-restore"), false); f == nil || !strings.Contains(f.What, "and ip6tables-restore is not in PATH") {
		t.Errorf("own namespace, no ip6tables-restore: %+v", f)
	}
	for name, f := range map[string]*Finding{
		"host namespace":   networkLock(false, have(), false),
		"both programs":    networkLock(true, have("iptables-restore", "ip6tables-restore"), false),
		"lock in a config": networkLock(true, have(), true),
	} {
		if f != nil {
			t.Errorf("%s: %+v, want none", name, f)
		}
	}

	dir := t.TempDir()
	none, set, dashed := filepath.Join(dir, "none.conf"), filepath.Join(dir, "set.conf"), filepath.Join(dir, "dashed.conf")
	os.WriteFile(none, []byte("tcp-established\n# network-lock nftables\n"), 0o644)
	os.WriteFile(set, []byte("tcp-established\n  network-lock nftables\n"), 0o644)
	os.WriteFile(dashed, []byte("--network-lock skip\n"), 0o644)
	if CRIUNetworkLockSet([]string{filepath.Join(dir, "missing"), none}) {
		t.Error("a comment or no file read as a network-lock line")
	}
	if !CRIUNetworkLockSet([]string{none, set}) || !CRIUNetworkLockSet([]string{dashed}) {
		t.Error("a network-lock line not seen")
	}
}
