package shim

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/createproto"
	"github.com/gantry-gpu/gantry/internal/ctrckpt"
	"github.com/gantry-gpu/gantry/internal/cudackpt"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

// counterSrc is the container's CUDA program: it loads libcuda.so.1 (the
// fake driver's, whose copy in the process holds its checkpoint state) and
// counts, writing the count to /tmp/count, until killed.
const counterSrc = `#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
int main(int argc, char **argv) {
	if (!(argc > 1 && !strcmp(argv[1], "nocuda")))
		dlopen("libcuda.so.1", RTLD_NOW); /* none in a container without GPUs */
	if (argc > 1 && !strcmp(argv[1], "mps")) {
		/* An MPS control socket, as the daemon's pipe directory mounted in. */
		struct sockaddr_un a = {AF_UNIX, "/tmp/nvidia-mps/control"};
		int s = socket(AF_UNIX, SOCK_STREAM, 0);
		mkdir("/tmp/nvidia-mps", 0755);
		if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1)) return 1;
		open("/dev/nvidia-uvm", O_RDWR); /* as the CUDA runtime does */
	}
	for (unsigned long n = 1;; n++) {
		char b[32];
		int len = snprintf(b, sizeof b, "%lu\n", n);
		int fd = open("/tmp/count.new", O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) { (void)!write(fd, b, len); close(fd); rename("/tmp/count.new", "/tmp/count"); }
		usleep(20000);
	}
}
`

// criuWorks reports why checkpoints cannot run here, or "".
func criuWorks() string { return ctrckpt.FindCRIU().Problem }

// ckptContainer is a GPU container running counterSrc on a fake driver
// whose libcuda records its checkpoint calls in ckdir.
type ckptContainer struct {
	*container
	ckdir, image, work string
	spec               []byte // config.json as the engine wrote it
}

func newCkptContainer(t *testing.T, args ...string) *ckptContainer {
	t.Helper()
	if why := criuWorks(); why != "" {
		t.Skip(why)
	}
	dir := t.TempDir()
	ckdir := filepath.Join(dir, "cuda-calls")
	if err := os.Mkdir(ckdir, 0o755); err != nil {
		t.Fatal(err)
	}
	sys, err := sim.Load("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	var ids []fakedriver.Identity
	for _, d := range sys.Devices {
		ids = append(ids, fakedriver.Identity{Minor: d.Minor, UUID: d.UUID, Name: d.Name})
	}
	drv, err := fakedriver.Build(filepath.Join(dir, "driver"), fakedriver.Options{GPUs: 8, DeviceNodes: true, Version: "580.159.04", CheckpointDir: ckdir, Identities: ids})
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "counter.c")
	if err := os.WriteFile(src, []byte(counterSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newContainer(t, opts{
		env:  []string{"NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"},
		args: append([]string{"/bin/counter"}, args...),
		mutate: func(rootfs string) {
			if err := run("gcc", "-O2", "-o", filepath.Join(rootfs, "bin/counter"), src, "-ldl"); err != nil {
				t.Fatal(err)
			}
		},
	})
	cfg, err := os.ReadFile(c.config)
	if err != nil {
		t.Fatal(err)
	}
	old := "driver-root = " + strconv.Quote(c.f.driver.Root)
	if !strings.Contains(string(cfg), old) {
		t.Fatalf("no %s in %s", old, cfg)
	}
	cfg = []byte(strings.Replace(string(cfg), old, "driver-root = "+strconv.Quote(drv.Root), 1))
	if err := os.WriteFile(c.config, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	k := &ckptContainer{container: c, ckdir: ckdir, image: filepath.Join(dir, "image"), work: filepath.Join(dir, "work"),
		spec: c.configJSON()}
	t.Cleanup(func() { c.runtime("delete", "--force", c.id) })
	return k
}

// start runs the container detached, its stdio on /dev/null (CRIU dumps a
// file outside the container's mounts only as a file it cannot find again;
// runc hands its own stdio to a restore).
func (k *ckptContainer) start() {
	k.t.Helper()
	cmd := exec.Command(k.f.runtime, "--root", k.state, "run", "--detach", "--bundle", k.bundle, k.id)
	cmd.Env = append(os.Environ(), "GANTRY_CONFIG="+k.config, createproto.ServerSocketEnv+"="+filepath.Join(k.f.dir, "no-create-server.sock"))
	if err := cmd.Run(); err != nil {
		k.t.Fatalf("gantry-runtime run --detach: %v (run it by hand for runc's message)", err)
	}
	k.waitCount(3)
}

func (k *ckptContainer) count() int {
	b, _ := os.ReadFile(filepath.Join(k.rootfs, "tmp/count"))
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// waitCount waits until the container counted to at least n.
func (k *ckptContainer) waitCount(n int) int {
	k.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if c := k.count(); c >= n {
			return c
		}
		time.Sleep(20 * time.Millisecond)
	}
	k.t.Fatalf("the container did not count to %d in 60 s (at %d)", n, k.count())
	return 0
}

func (k *ckptContainer) status() string {
	out, _, err := k.runtime("state", k.id)
	if err != nil {
		return "gone"
	}
	var s struct{ Status string }
	json.Unmarshal([]byte(out), &s)
	return s.Status
}

func (k *ckptContainer) initPID() int {
	out, _, err := k.runtime("state", k.id)
	if err != nil {
		k.t.Fatal(err)
	}
	var s struct{ Pid int }
	json.Unmarshal([]byte(out), &s)
	return s.Pid
}

// calls returns the fake driver's record since the last call, and resets it.
func (k *ckptContainer) calls() string {
	p := filepath.Join(k.ckdir, "calls")
	b, _ := os.ReadFile(p)
	os.Remove(p)
	return string(b)
}

// callsOf is calls() of process pid only (the probe's own process makes
// calls too).
func (k *ckptContainer) callsOf(pid int) string {
	var out strings.Builder
	for _, l := range strings.SplitAfter(k.calls(), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out.WriteString(l)
		}
	}
	return out.String()
}

func (k *ckptContainer) fail(line string) {
	p := filepath.Join(k.ckdir, "fail")
	if line == "" {
		os.Remove(p)
		return
	}
	if err := os.WriteFile(p, []byte(line+"\n"), 0o644); err != nil {
		k.t.Fatal(err)
	}
}

// refusedUnchanged checks what a checkpoint refused before the CUDA lock
// leaves: no CUDA call, no runc checkpoint, the container counting on.
func (k *ckptContainer) refusedUnchanged() {
	k.t.Helper()
	if got := k.calls(); got != "" {
		k.t.Errorf("a refused checkpoint made CUDA calls:\n%s", got)
	}
	if _, err := os.Stat(filepath.Join(k.image, "inventory.img")); err == nil {
		k.t.Error("runc checkpoint ran for a refused checkpoint")
	}
	k.waitCount(k.count() + 5)
}

func (k *ckptContainer) checkpoint(extra ...string) (string, error) {
	args := append([]string{"checkpoint", "--image-path", k.image, "--work-path", k.work}, extra...)
	_, stderr, err := k.runtime(append(args, k.id)...)
	return stderr + criuLog(k.work, "dump.log"), err
}

// criuLog is the end of CRIU's log, when there is one, for a failure's message.
func criuLog(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Error") || strings.Contains(l, "rror (") {
			keep = append(keep, l)
		}
	}
	ls := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(ls) > 15 {
		ls = ls[len(ls)-15:]
	}
	return "\n" + name + " errors:\n" + strings.Join(keep, "\n") + "\n" + name + " end:\n" + strings.Join(ls, "\n")
}

func (k *ckptContainer) restore() (string, error) {
	_, stderr, err := k.runtime("restore", "--detach", "--bundle", k.bundle, "--image-path", k.image, "--work-path", k.work, k.id)
	if err != nil {
		stderr += criuLog(k.work, "restore.log")
	}
	return stderr, err
}

// setRequest puts the engine's config.json back with another GPU request,
// as an engine hands a restore its own bundle.
func (k *ckptContainer) setRequest(devices string) {
	s := strings.Replace(string(k.spec), "NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES="+devices, 1)
	if err := os.WriteFile(filepath.Join(k.bundle, "config.json"), []byte(s), 0o644); err != nil {
		k.t.Fatal(err)
	}
}

func lines(pid int, ops ...string) string {
	var b strings.Builder
	for _, op := range ops {
		b.WriteString(op[:strings.IndexByte(op, ' ')] + " " + strconv.Itoa(pid) + op[strings.IndexByte(op, ' '):] + "\n")
	}
	return b.String()
}

func uuidHex(t *testing.T, minor int) string {
	sys, err := sim.Load("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range sys.Devices {
		if d.Minor == minor {
			return strings.ReplaceAll(strings.TrimPrefix(d.UUID, "GPU-"), "-", "")
		}
	}
	t.Fatalf("no minor %d", minor)
	return ""
}

// TestCheckpointRestoreGPUContainer checkpoints and restores a GPU
// container through gantry-runtime with real runc and CRIU, the CUDA step
// against the fake driver's libcuda, which keeps each process's state in
// the process (so it goes through CRIU) and records every call:
//   - a CUDA checkpoint that fails after the lock is undone (unlock), runc
//     is not run, and the container goes on counting;
//   - a checkpoint with --leave-running: lock, checkpoint, runc checkpoint,
//     restore, unlock; the container goes on; the image is root's only;
//   - a checkpoint that stops the container: lock and checkpoint only;
//   - a restore whose request names two GPUs is refused before runc runs;
//   - a restore onto another GPU of the same model: runc restore, then
//     restore (with the GPU UUID pair) and unlock of the restored process,
//     which counts on from where it was.
func TestCheckpointRestoreGPUContainer(t *testing.T) {
	k := newCkptContainer(t)
	k.start()
	pid := k.initPID()

	k.fail("checkpoint")
	stderr, err := k.checkpoint("--leave-running")
	if err == nil || !strings.Contains(stderr, "CUDA checkpoint") {
		t.Fatalf("checkpoint with a failing CUDA checkpoint: %v\n%s", err, stderr)
	}
	if got, want := k.calls(), lines(pid, "lock ok timeout=30000", "checkpoint fail injected", "unlock ok"); got != want {
		t.Errorf("CUDA calls of the failed checkpoint:\n%s\nwant:\n%s", got, want)
	}
	if _, err := os.Stat(filepath.Join(k.image, "inventory.img")); err == nil {
		t.Error("runc checkpoint ran after the CUDA checkpoint failed")
	}
	n := k.count()
	k.waitCount(n + 5)
	if s := k.status(); s != "running" {
		t.Fatalf("after the failed checkpoint the container is %s", s)
	}
	k.fail("")

	stderr, err = k.checkpoint("--leave-running")
	if err != nil {
		t.Fatalf("checkpoint --leave-running: %v\n%s", err, stderr)
	}
	if got, want := k.calls(), lines(pid, "lock ok timeout=30000", "checkpoint ok", "restore ok", "unlock ok"); got != want {
		t.Errorf("CUDA calls of checkpoint --leave-running:\n%s\nwant:\n%s", got, want)
	}
	k.waitCount(k.count() + 5)
	checkSealed(t, k.image)
	rec, found, err := ctrckpt.ReadRecord(k.image)
	if err != nil || !found || rec.CUDAProcesses != 1 || len(rec.GPUs) != 1 || rec.GPUs[0].Minor != 1 {
		t.Errorf("record %+v %v %v: want 1 CUDA process, GPU minor 1", rec, found, err)
	}
	// The phases, in the record and the log (the bench reads them).
	if tm := rec.Timings; tm == nil || tm.CUDALockMS <= 0 || tm.CUDACheckpointMS <= 0 || tm.RuntimeMS <= 0 || tm.CUDARestoreMS <= 0 || tm.CUDAUnlockMS <= 0 ||
		tm.GPUIdleMS < tm.CUDALockMS+tm.CUDACheckpointMS+tm.RuntimeMS+tm.CUDARestoreMS || tm.TotalMS < tm.GPUIdleMS {
		t.Errorf("checkpoint --leave-running timings %+v: want every phase, GPU idle from lock to unlock", rec.Timings)
	}
	if b, _ := os.ReadFile(filepath.Join(filepath.Dir(k.config), "gantry.log")); !strings.Contains(string(b), `"timings":{"cudaLockMs":`) {
		t.Errorf("the log file has no checkpoint timings:\n%s", b)
	}
	os.RemoveAll(k.image)
	os.RemoveAll(k.work)

	stderr, err = k.checkpoint()
	if err != nil {
		t.Fatalf("checkpoint: %v\n%s", err, stderr)
	}
	if got, want := k.calls(), lines(pid, "lock ok timeout=30000", "checkpoint ok"); got != want {
		t.Errorf("CUDA calls of checkpoint:\n%s\nwant:\n%s", got, want)
	}
	if s := k.status(); s != "gone" && s != "stopped" {
		t.Fatalf("after checkpoint the container is %s", s)
	}
	k.runtime("delete", k.id)
	at := k.count()
	checkSealed(t, k.image)

	k.setRequest("2,3")
	stderr, err = k.restore()
	if err == nil || !strings.Contains(stderr, "refusing to restore") || !strings.Contains(stderr, "2 (") {
		t.Fatalf("restore onto two GPUs: %v\n%s", err, stderr)
	}
	if s := k.status(); s != "gone" {
		t.Errorf("a refused restore left the container %s", s)
	}
	if got := k.calls(); got != "" {
		t.Errorf("a refused restore made CUDA calls:\n%s", got)
	}

	// A driver that cannot restore onto another GPU (the fake's switch):
	// the probe says so and the restore is refused before runc restore,
	// naming the GPUs, the driver and the fix; the verdict is kept.
	k.setRequest("2")
	k.fail("remap")
	stderr, err = k.restore()
	for _, w := range []string{"refusing to restore", "580.159.04", "CUDA_ERROR_NOT_SUPPORTED", "NVIDIA_VISIBLE_DEVICES=GPU-"} {
		if err == nil || !strings.Contains(stderr, w) {
			t.Errorf("restore onto GPU 2 with a driver that cannot remap: %v, want %q in:\n%s", err, w, stderr)
		}
	}
	if s := k.status(); s != "gone" {
		t.Errorf("a refused restore left the container %s", s)
	}
	if _, err := os.Stat(filepath.Join(k.work, "restore.log")); err == nil {
		t.Error("runc restore ran (CRIU's restore.log) although the driver cannot remap")
	}
	pair := "pairs=" + uuidHex(t, 1) + ">" + uuidHex(t, 2)
	if calls := k.calls(); !strings.Contains(calls, "restore") || strings.Contains(calls, pair+"\n") {
		t.Errorf("want the probe's calls only (its pairs name every GPU), not the container's restore (%s):\n%s", pair, calls)
	}
	k.fail("")
	cache := filepath.Join(filepath.Dir(k.config), "cache")
	if stderr, err := k.restore(); err == nil || !strings.Contains(stderr, "kept in "+cache) {
		t.Errorf("restore with the verdict kept: %v\n%s", err, stderr)
	}
	if got := k.calls(); got != "" {
		t.Errorf("a kept verdict made CUDA calls:\n%s", got)
	}
	os.Remove(cudackpt.CacheFile(cache, "580.159.04"))

	stderr, err = k.restore()
	if err != nil {
		t.Fatalf("restore: %v\n%s", err, stderr)
	}
	npid := k.initPID()
	if got, want := k.callsOf(npid), lines(npid, "restore ok "+pair, "unlock ok"); got != want {
		t.Errorf("CUDA calls of restore:\n%s\nwant:\n%s", got, want)
	}
	if rec, _, _ := ctrckpt.ReadRecord(k.image); rec.LastRestore == nil || rec.LastRestore.ProbeMS <= 0 || rec.LastRestore.RuntimeMS <= 0 || rec.LastRestore.DevNodesMS <= 0 ||
		rec.LastRestore.CUDARestoreMS <= 0 || rec.LastRestore.CUDAUnlockMS <= 0 {
		t.Errorf("restore timings %+v: want probe, runtime, /dev nodes, CUDA restore and unlock", rec.LastRestore)
	}
	if c := k.waitCount(at + 5); c < at {
		t.Errorf("restored container counts from %d, was at %d", c, at)
	}
	// CRIU restored the checkpoint's /dev (GPU 1's node); the CUDA restore
	// onto GPU 2 needs GPU 2's node there, and GPU 1's must be gone.
	devDir := filepath.Join("/proc", strconv.Itoa(npid), "root", "dev")
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(devDir, "nvidia2"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Minor(st.Rdev) != 2 {
		t.Errorf("the restored container has no /dev/nvidia2 node 195:2: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(devDir, "nvidia1")); err == nil {
		t.Error("the restored container keeps /dev/nvidia1, a GPU its request does not name")
	}
	spec := string(k.configJSON())
	if !strings.Contains(spec, `"/dev/nvidia2"`) || strings.Contains(spec, `"/dev/nvidia1"`) {
		t.Errorf("the restored container's config.json does not have exactly the requested GPU 2")
	}
}

// checkSealed checks the image directory is root's alone.
func checkSealed(t *testing.T, dir string) {
	t.Helper()
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Error(err)
			return nil
		}
		if perm := fi.Mode().Perm(); fi.IsDir() && perm != 0o700 || !fi.IsDir() && fi.Mode().IsRegular() && perm != 0o600 {
			t.Errorf("%s: mode %v, want 0700 directories and 0600 files", p, perm)
		}
		return nil
	})
}

// A container without GPUs goes through untouched: runc's checkpoint and
// restore, no CUDA call, no record.
func TestCheckpointWithoutGPU(t *testing.T) {
	k := newCkptContainer(t)
	k.spec = []byte(strings.Replace(string(k.spec), "NVIDIA_VISIBLE_DEVICES=1", "HOME=/", 1))
	k.setRequest("")
	k.start()
	if stderr, err := k.checkpoint(); err != nil {
		t.Fatalf("checkpoint: %v\n%s", err, stderr)
	}
	k.runtime("delete", k.id)
	if _, err := os.Stat(filepath.Join(k.image, ctrckpt.RecordFile)); err == nil {
		t.Error("a checkpoint of a container without GPUs has a GPU record")
	}
	at := k.count()
	if stderr, err := k.restore(); err != nil {
		t.Fatalf("restore: %v\n%s", err, stderr)
	}
	k.waitCount(at + 3)
	if got := k.calls(); got != "" {
		t.Errorf("CUDA calls for a container without GPUs:\n%s", got)
	}
}

// A restore without --detach (runc then waits for the container): the CUDA
// restore happens once runc has restored the processes (its pid file), and
// gantry-runtime returns when the container ends.
func TestRestoreForeground(t *testing.T) {
	k := newCkptContainer(t)
	k.start()
	if stderr, err := k.checkpoint(); err != nil {
		t.Fatalf("checkpoint: %v\n%s", err, stderr)
	}
	k.runtime("delete", k.id)
	k.calls()
	at := k.count()
	done := make(chan error, 1)
	go func() {
		_, _, err := k.runtime("restore", "--bundle", k.bundle, "--image-path", k.image, "--work-path", k.work, k.id)
		done <- err
	}()
	k.waitCount(at + 5)
	// The fake driver does not stop the process while it is checkpointed:
	// wait for the calls.
	callsFile := filepath.Join(k.ckdir, "calls")
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(callsFile); strings.Contains(string(b), "unlock") {
			break
		}
	}
	npid := k.initPID()
	if got, want := k.calls(), lines(npid, "restore ok", "unlock ok"); got != want {
		t.Errorf("CUDA calls of a foreground restore:\n%s\nwant:\n%s", got, want)
	}
	select {
	case err := <-done:
		t.Fatalf("restore returned while the container runs: %v", err)
	default:
	}
	k.runtime("kill", k.id, "KILL")
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("restore did not return after the container was killed")
	}
}

// A restore handed the config.json Gantry already injected at the create
// (GPU 1's node, the injection mark) whose request now names GPU 2: the
// spec would give the container GPU 1, which its request no longer names.
// Refused before runc restore, naming both GPUs. The same spec with its
// request unchanged restores (onto GPU 1, as checkpointed).
func TestRestoreAlreadyInjectedSpec(t *testing.T) {
	k := newCkptContainer(t)
	k.start()
	if stderr, err := k.checkpoint(); err != nil {
		t.Fatalf("checkpoint: %v\n%s", err, stderr)
	}
	k.runtime("delete", k.id)
	at := k.count()
	injectedSpec := string(k.configJSON())
	if !strings.Contains(injectedSpec, "io.github.gantry-gpu.injected") || !strings.Contains(injectedSpec, `"/dev/nvidia1"`) {
		t.Fatalf("the create's config.json is not injected with GPU 1:\n%s", injectedSpec)
	}
	changed := strings.Replace(injectedSpec, "NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=2", 1)
	if err := os.WriteFile(filepath.Join(k.bundle, "config.json"), []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	sys, err := sim.Load("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := k.restore()
	for _, w := range []string{"refusing to restore", "carries Gantry's injection", sys.Devices[1].UUID, sys.Devices[2].UUID} {
		if err == nil || !strings.Contains(stderr, w) {
			t.Errorf("restore of an injected spec whose request changed: %v, want %q in:\n%s", err, w, stderr)
		}
	}
	if s := k.status(); s != "gone" {
		t.Errorf("a refused restore left the container %s", s)
	}
	if _, err := os.Stat(filepath.Join(k.work, "restore.log")); err == nil {
		t.Error("runc restore ran for a refused restore")
	}
	k.calls()
	if err := os.WriteFile(filepath.Join(k.bundle, "config.json"), []byte(injectedSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	if stderr, err := k.restore(); err != nil {
		t.Fatalf("restore of the injected spec, request unchanged: %v\n%s", err, stderr)
	}
	npid := k.initPID()
	if got, want := k.callsOf(npid), lines(npid, "restore ok", "unlock ok"); got != want {
		t.Errorf("CUDA calls of restore:\n%s\nwant:\n%s", got, want)
	}
	k.waitCount(at + 5)
}

// A container whose CUDA process is an MPS client (an MPS control socket
// in its /tmp/nvidia-mps, where the driver looks) is refused before the
// CUDA lock: no CUDA call, no image, and it goes on counting.
func TestCheckpointRefusesMPSClient(t *testing.T) {
	k := newCkptContainer(t, "mps")
	k.start()
	k.calls()
	stderr, err := k.checkpoint("--leave-running")
	if err == nil || !strings.Contains(stderr, "refusing to checkpoint") || !strings.Contains(stderr, "MPS client") {
		t.Fatalf("checkpoint of an MPS client: %v\n%s", err, stderr)
	}
	k.refusedUnchanged()
}

// TestCheckpointRefusesWithoutNetworkLock: a GPU container in a network
// namespace of its own (runc's default, as every Kubernetes pod), where the
// PATH gantry-runtime runs with (and hands runc and CRIU) has runc and criu
// but not iptables-restore, which CRIU's default network lock runs, is
// refused before the CUDA lock, naming the fix: no CUDA call, no runc
// checkpoint, and the container goes on. (Without the check the dump fails
// "Locking network failed" after the CUDA checkpoint; what a GPU host
// without iptables answered the kubelet.)
func TestCheckpointRefusesWithoutNetworkLock(t *testing.T) {
	if ctrckpt.CRIUNetworkLockSet(ctrckpt.CRIUConfigs) {
		t.Skipf("one of %v chooses CRIU's network lock", ctrckpt.CRIUConfigs)
	}
	k := newCkptContainer(t)
	k.start()
	k.calls()
	bin := t.TempDir()
	for _, prog := range []string{"runc", "criu", k.low} {
		if p, err := exec.LookPath(prog); err == nil {
			os.Symlink(p, filepath.Join(bin, filepath.Base(prog)))
		}
	}
	k.extraEnv = []string{"PATH=" + bin}
	stderr, err := k.checkpoint("--leave-running")
	if err == nil || !strings.Contains(stderr, "refusing to checkpoint") || !strings.Contains(stderr, "iptables-restore") ||
		!strings.Contains(stderr, "apt-get install iptables") {
		t.Fatalf("checkpoint without iptables-restore in PATH: %v\n%s", err, stderr)
	}
	k.refusedUnchanged()
	// With the programs back, the same container checkpoints.
	k.extraEnv = nil
	if stderr, err := k.checkpoint("--leave-running"); err != nil {
		t.Fatalf("checkpoint with iptables-restore in PATH: %v\n%s", err, stderr)
	}
	k.waitCount(k.count() + 5)
}

// A GPU container with no CUDA process, restored with its request changed
// from GPU 1 to GPU 2: no CUDA call, and its /dev gets GPU 2's node in
// place of the checkpoint's GPU 1 (CRIU restored the old /dev).
func TestRestoreWithoutCUDAMovesNodes(t *testing.T) {
	k := newCkptContainer(t, "nocuda")
	k.start()
	if stderr, err := k.checkpoint(); err != nil {
		t.Fatalf("checkpoint: %v\n%s", err, stderr)
	}
	k.runtime("delete", k.id)
	if rec, found, err := ctrckpt.ReadRecord(k.image); err != nil || !found || rec.CUDAProcesses != 0 || len(rec.GPUs) != 1 {
		t.Fatalf("record %+v %v %v: want GPU 1, no CUDA process", rec, found, err)
	}
	at := k.count()
	k.setRequest("2")
	if stderr, err := k.restore(); err != nil {
		t.Fatalf("restore: %v\n%s", err, stderr)
	}
	devDir := filepath.Join("/proc", strconv.Itoa(k.initPID()), "root", "dev")
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(devDir, "nvidia2"), &st); err != nil || unix.Minor(st.Rdev) != 2 {
		t.Errorf("the restored container has no /dev/nvidia2: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(devDir, "nvidia1")); err == nil {
		t.Error("the restored container keeps /dev/nvidia1, a GPU its request does not name")
	}
	if got := k.calls(); got != "" {
		t.Errorf("CUDA calls for a container without CUDA state:\n%s", got)
	}
	k.waitCount(at + 3)
}

// gantryCLI runs the gantry CLI (which runs the gantry-runtime beside it)
// with the container's configuration, and returns stdout, stderr and the
// exit code.
func (k *ckptContainer) gantryCLI(args ...string) (string, string, int) {
	k.t.Helper()
	cmd := exec.Command(k.f.gantry, append([]string{"--config", k.config}, args...)...)
	cmd.Env = append(os.Environ(), createproto.ServerSocketEnv+"="+filepath.Join(k.f.dir, "no-create-server.sock"))
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		k.t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

// TestGantryCheckpointRestoreCLI: gantry checkpoint and gantry restore,
// for users without an engine that checkpoints, on a real runc container
// with CRIU and the fake driver's libcuda: a usage error names the missing
// flag and changes nothing; --leave-running does the CUDA steps around
// runc's checkpoint and the container goes on; a checkpoint that stops it,
// then gantry restore, and it counts on from where it was with its CUDA
// state restored and unlocked. Each prints the phases from the record.
func TestGantryCheckpointRestoreCLI(t *testing.T) {
	k := newCkptContainer(t)
	k.start()
	pid := k.initPID()

	if _, stderr, code := k.gantryCLI("checkpoint", "--root", k.state, k.id); code != 2 || !strings.Contains(stderr, "--image-path is required") {
		t.Errorf("gantry checkpoint without --image-path: exit %d, want 2 and the flag named:\n%s", code, stderr)
	}
	if got := k.calls(); got != "" || k.status() != "running" {
		t.Fatalf("a usage error made CUDA calls (%q) or left the container %s", got, k.status())
	}

	out, stderr, code := k.gantryCLI("checkpoint", "--root", k.state, "--image-path", k.image, "--work-path", k.work, "--leave-running", k.id)
	if code != 0 {
		t.Fatalf("gantry checkpoint --leave-running: exit %d\n%s%s", code, stderr, criuLog(k.work, "dump.log"))
	}
	if got, want := k.calls(), lines(pid, "lock ok timeout=30000", "checkpoint ok", "restore ok", "unlock ok"); got != want {
		t.Errorf("CUDA calls of gantry checkpoint --leave-running:\n%s\nwant:\n%s", got, want)
	}
	if !strings.Contains(out, "timings: CUDA lock ") || !strings.Contains(out, "CUDA unlock ") {
		t.Errorf("gantry checkpoint --leave-running printed no phases:\n%s", out)
	}
	k.waitCount(k.count() + 5)
	checkSealed(t, k.image)
	os.RemoveAll(k.image)
	os.RemoveAll(k.work)

	if _, stderr, code := k.gantryCLI("checkpoint", "--root", k.state, "--image-path", k.image, "--work-path", k.work, k.id); code != 0 {
		t.Fatalf("gantry checkpoint: exit %d\n%s%s", code, stderr, criuLog(k.work, "dump.log"))
	}
	if got, want := k.calls(), lines(pid, "lock ok timeout=30000", "checkpoint ok"); got != want {
		t.Errorf("CUDA calls of gantry checkpoint:\n%s\nwant:\n%s", got, want)
	}
	if s := k.status(); s != "gone" && s != "stopped" {
		t.Fatalf("after gantry checkpoint the container is %s", s)
	}
	k.runtime("delete", k.id)
	at := k.count()

	if _, stderr, code := k.gantryCLI("restore", "--root", k.state, "--image-path", k.image, k.id); code != 2 || !strings.Contains(stderr, "--bundle") {
		t.Errorf("gantry restore without --bundle: exit %d, want 2 and the flag named:\n%s", code, stderr)
	}
	out, stderr, code = k.gantryCLI("restore", "--root", k.state, "--image-path", k.image, "--work-path", k.work, "--bundle", k.bundle, k.id)
	if code != 0 {
		t.Fatalf("gantry restore: exit %d\n%s%s", code, stderr, criuLog(k.work, "restore.log"))
	}
	npid := k.initPID()
	if got, want := k.callsOf(npid), lines(npid, "restore ok", "unlock ok"); got != want {
		t.Errorf("CUDA calls of gantry restore:\n%s\nwant:\n%s", got, want)
	}
	if !strings.Contains(out, "timings: ") {
		t.Errorf("gantry restore printed no phases:\n%s", out)
	}
	if c := k.waitCount(at + 5); c < at {
		t.Errorf("the restored container counts from %d, was at %d", c, at)
	}
}
