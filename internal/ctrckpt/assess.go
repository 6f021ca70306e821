package ctrckpt

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// Finding is one reason a container's checkpoint would fail or lose state,
// from the driver's documented limits (cuda-checkpoint's README: x86-64
// only, no UVM or IPC memory, no error recovery; MPS clients; several
// processes sharing GPU memory, as NCCL's do).
type Finding struct {
	// Refuse: the checkpoint is refused before anything is done (the
	// driver cannot checkpoint it, or would lose the process). Else a
	// warning: the checkpoint is tried, and a failure leaves the container
	// running (the undo restores and unlocks it).
	Refuse bool
	PID    int
	What   string
}

func (f Finding) String() string {
	kind := "warning"
	if f.Refuse {
		kind = "refused"
	}
	if f.PID > 0 {
		return fmt.Sprintf("%s: process %d: %s", kind, f.PID, f.What)
	}
	return kind + ": " + f.What
}

// procView is what Assess reads of one process (kernel data, never the
// image's files, except the MPS pipe it stats inside the container's root).
type procView struct {
	PID  int
	Use  CUDAUse
	NCCL bool // maps libnccl
	UVM  bool // holds /dev/nvidia-uvm
	// MPSPipe is the MPS pipe directory the process would use
	// (CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps) when a socket named
	// control is there in the container's root.
	MPSPipe string
}

// Assess examines the container whose init is initPID (its processes from
// its cgroup, each checked to be in it and the init's mount namespace: see
// Processes) and the models of its GPUs (models: one entry per GPU), and
// says why its checkpoint would fail.
func Assess(initPID int, models []string) ([]Finding, error) {
	pids, err := Processes(initPID)
	if err != nil {
		return nil, err
	}
	root, err := rootfs.Open(filepath.Join(procRoot, strconv.Itoa(initPID), "root"))
	if err != nil {
		return nil, fmt.Errorf("the container's root: %w", err)
	}
	defer root.Close()
	var views []procView
	for _, pid := range pids {
		u, err := InspectCUDA(pid)
		if err != nil || !u.Uses() {
			continue
		}
		v := procView{PID: pid, Use: u, NCCL: mapsLib(pid, "libnccl.so")}
		for _, f := range u.DeviceFiles {
			if f == "/dev/nvidia-uvm" {
				v.UVM = true
			}
		}
		dir := environValue(pid, "CUDA_MPS_PIPE_DIRECTORY")
		if dir == "" {
			dir = "/tmp/nvidia-mps"
		}
		if st, err := root.Lstat(path.Join(dir, "control")); err == nil && st.Mode().Type() == os.ModeSocket {
			v.MPSPipe = dir
		}
		views = append(views, v)
	}
	out := assess(views, models, runtime.GOARCH)
	if len(views) > 0 {
		own, err := ownNetns(initPID)
		if err != nil {
			return nil, err
		}
		if f := networkLock(own, exec.LookPath, CRIUNetworkLockSet(CRIUConfigs)); f != nil {
			out = append(out, *f)
		}
	}
	return out, nil
}

// CRIUConfigs are the files CRIU takes options from when runc runs it
// (runc's own, then CRIU's default for every caller).
var CRIUConfigs = []string{"/etc/criu/runc.conf", "/etc/criu/default.conf"}

// ownNetns says whether the process is in a network namespace of its own,
// not the one this runtime runs in (the engine's, the host's).
func ownNetns(pid int) (bool, error) {
	var ct, self unix.Stat_t
	if err := unix.Stat(filepath.Join(procRoot, strconv.Itoa(pid), "ns", "net"), &ct); err != nil {
		return false, fmt.Errorf("the container's network namespace: %w", err)
	}
	if err := unix.Stat(filepath.Join(procRoot, "self", "ns", "net"), &self); err != nil {
		return false, fmt.Errorf("this runtime's network namespace: %w", err)
	}
	return ct.Ino != self.Ino || ct.Dev != self.Dev, nil
}

// CRIUNetworkLockSet says whether one of the CRIU configuration files
// chooses the network lock (a network-lock line): then CRIU does what it
// says, and networkLock does not guess.
func CRIUNetworkLockSet(files []string) bool {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimLeft(strings.TrimSpace(l), "-"), "network-lock") {
				return true
			}
		}
	}
	return false
}

// networkLock is the refusal of a container in a network namespace of its
// own (every Kubernetes pod, a bridged Podman or Docker container) when
// CRIU's default network lock cannot run: its dump runs iptables-restore
// and ip6tables-restore from its PATH (this runtime's: runc hands CRIU its
// environment), and without them fails "Locking network failed" only after
// the CUDA checkpoint. Nil when it can, or when a CRIU configuration file
// picks the lock.
func networkLock(ownNetns bool, lookPath func(string) (string, error), configured bool) *Finding {
	if !ownNetns {
		return nil
	}
	missing := NetworkLockMissing(lookPath, configured)
	if len(missing) == 0 {
		return nil
	}
	verb := "is"
	if len(missing) > 1 {
		verb = "are"
	}
	return &Finding{Refuse: true, What: fmt.Sprintf("the container has a network namespace of its own, which CRIU's dump locks with iptables-restore and ip6tables-restore (its default network lock), and %s %s not in PATH (%s): the dump would fail after the CUDA checkpoint; install iptables (Debian, Ubuntu: apt-get install iptables) where the engine runs, or choose CRIU's network lock with a network-lock line in /etc/criu/runc.conf",
		strings.Join(missing, " and "), verb, os.Getenv("PATH"))}
}

// NetworkLockPrograms are what CRIU's default network lock (iptables) runs
// from its PATH when it dumps a process in a network namespace of its own.
var NetworkLockPrograms = []string{"iptables-restore", "ip6tables-restore"}

// NetworkLockMissing is which of NetworkLockPrograms lookPath cannot find
// (exec.LookPath, or a lookup in the engine's PATH), in that order: what
// CRIU's default network lock lacks. Nil when it has them all, or when a
// CRIU configuration file picks the lock (configured: CRIUNetworkLockSet).
func NetworkLockMissing(lookPath func(string) (string, error), configured bool) []string {
	if configured {
		return nil
	}
	var missing []string
	for _, prog := range NetworkLockPrograms {
		if _, err := lookPath(prog); err != nil {
			missing = append(missing, prog)
		}
	}
	return missing
}

// assess turns what was read into findings.
func assess(views []procView, models []string, arch string) []Finding {
	var out []Finding
	if arch != "amd64" && len(views) > 0 {
		out = append(out, Finding{Refuse: true, What: "the CUDA checkpoint API is x86-64 only (on " + arch + " the driver answers CUDA_ERROR_NOT_SUPPORTED)"})
	}
	for _, v := range views {
		if v.MPSPipe != "" {
			out = append(out, Finding{Refuse: true, PID: v.PID, What: fmt.Sprintf("an MPS client (an MPS control socket at %s/control in the container, which the CUDA driver connects to): the driver cannot checkpoint MPS clients; stop MPS sharing for this container", v.MPSPipe)})
		}
		if v.UVM {
			out = append(out, Finding{PID: v.PID, What: "holds /dev/nvidia-uvm (every CUDA runtime process does): if it allocated managed memory (cudaMallocManaged), the CUDA checkpoint fails with CUDA_ERROR_NOT_SUPPORTED and the container goes on"})
		}
	}
	var cuda, nccl []int
	for _, v := range views {
		cuda = append(cuda, v.PID)
		if v.NCCL {
			nccl = append(nccl, v.PID)
		}
	}
	if len(cuda) > 1 {
		w := fmt.Sprintf("%d CUDA processes %v: if they share GPU memory (CUDA IPC, cuMemExportToShareableHandle handles, NCCL between processes), the driver checkpoints them but a process that imported another's memory fails to restore and cannot be unlocked (lost after the commit point); tear down such sharing (NCCL communicators) before a checkpoint", len(cuda), cuda)
		if len(nccl) > 0 {
			w += fmt.Sprintf("; processes %v map NCCL", nccl)
		}
		out = append(out, Finding{What: w})
	} else if len(nccl) == 1 {
		out = append(out, Finding{PID: nccl[0], What: "maps NCCL: NVLS (NVLink SHARP) communicators cannot be checkpointed; run with NCCL_NVLS_ENABLE=0"})
	}
	seen := map[string]bool{}
	var distinct []string
	for _, m := range models {
		if !seen[m] {
			seen[m] = true
			distinct = append(distinct, m)
		}
	}
	if len(distinct) > 1 {
		out = append(out, Finding{What: fmt.Sprintf("GPUs of %d models (%s): a restore onto other GPUs needs each of the same model as the one it replaces", len(distinct), strings.Join(distinct, ", "))})
	}
	return out
}

// Refusals is the findings that refuse the checkpoint, joined, or "".
func Refusals(fs []Finding) string {
	var r []string
	for _, f := range fs {
		if f.Refuse {
			r = append(r, f.String())
		}
	}
	return strings.Join(r, "; ")
}

// mapsLib reports whether pid maps a file whose name starts with lib.
func mapsLib(pid int, lib string) bool {
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "maps"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if i := bytes.IndexByte(line, '/'); i >= 0 && strings.HasPrefix(filepath.Base(string(line[i:])), lib) {
			return true
		}
	}
	return false
}

// environValue is NAME's value in pid's environment (/proc/PID/environ,
// bounded; the image's value, used only to look for a file).
func environValue(pid int, name string) string {
	fd, err := unix.Open(filepath.Join(procRoot, strconv.Itoa(pid), "environ"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	f := os.NewFile(uintptr(fd), "environ")
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	for _, kv := range bytes.Split(b, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok && k == name {
			return v
		}
	}
	return ""
}
