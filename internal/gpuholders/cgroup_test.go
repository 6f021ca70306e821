package gpuholders

import (
	"os"
	"path/filepath"
	"testing"
)

// podRunning over cgroup trees laid out as the kubelet lays them out:
// cgroupfs and systemd drivers, v2 (cgroup.events) and v1 (cgroup.procs
// under a controller), a pod with no process, and a host with no kubepods.
func TestPodRunning(t *testing.T) {
	const uid = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"
	write := func(root, rel, file, content string) {
		t.Helper()
		d := filepath.Join(root, rel)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if file != "" {
			if err := os.WriteFile(filepath.Join(d, file), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		name string
		make func(root string)
		want bool
	}{
		{"v2 cgroupfs running", func(r string) {
			write(r, "kubepods/besteffort/pod"+uid, "cgroup.events", "populated 1\nfrozen 0\n")
		}, true},
		{"v2 cgroupfs stopped", func(r string) {
			write(r, "kubepods/burstable/pod"+uid, "cgroup.events", "populated 0\nfrozen 0\n")
		}, false},
		{"v2 systemd running", func(r string) {
			write(r, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_aaaa_bbbb_cccc_123456789abc.slice", "cgroup.events", "populated 1\n")
		}, true},
		{"v1 under a controller, process in a container cgroup", func(r string) {
			write(r, "pids/kubepods/pod"+uid, "cgroup.procs", "")
			write(r, "pids/kubepods/pod"+uid+"/ctr1", "cgroup.procs", "4242\n")
		}, true},
		{"v1 empty pod", func(r string) {
			write(r, "pids/kubepods/pod"+uid+"/ctr1", "cgroup.procs", "")
		}, false},
		{"pod gone, kubepods there", func(r string) {
			write(r, "kubepods/besteffort/podother", "cgroup.events", "populated 1\n")
		}, false},
		{"no kubepods at all: cannot tell", func(r string) {
			write(r, "system.slice", "cgroup.events", "populated 1\n")
		}, true},
	} {
		root := t.TempDir()
		c.make(root)
		if got := podRunning(root, uid); got != c.want {
			t.Errorf("%s: podRunning = %v, want %v", c.name, got, c.want)
		}
	}
}
