//go:build linux

package engines

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/ctrckpt"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// counterName is the CUDA counter's path in the checkpoint tests' image.
const counterName = "/usr/bin/cuda-counter"

// counterSrc is the checkpointed containers' program: it loads
// libcuda.so.1 (the fake driver's, whose copy in the process keeps the
// process's CUDA checkpoint state, so a CUDA call made on another pid than
// the container's finds nothing) and counts, writing the count to
// /tmp/count, until killed. A restored container counts on from the count
// it had.
const counterSrc = `#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
	if (!dlopen("libcuda.so.1", RTLD_NOW)) { fprintf(stderr, "%s\n", dlerror()); return 1; }
	for (unsigned long n = 1;; n++) {
		char b[32];
		int len = snprintf(b, sizeof b, "%lu\n", n);
		int fd = open("/tmp/count.new", O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) { (void)!write(fd, b, len); close(fd); rename("/tmp/count.new", "/tmp/count"); }
		usleep(20000);
	}
}
`

// ckptFixture is what the engine checkpoint tests share: a fake driver
// whose libcuda records the CUDA checkpoint calls in ckdir, a Gantry
// configuration on it, and an image with the counter.
type ckptFixture struct {
	f      *fixture
	dir    string
	ckdir  string
	config string // GANTRY_CONFIG: the fixture's, on the recording driver
	driver *fakedriver.Result
	image  string // OCI archive of the counter image
	name   string // its name
}

// criuSkip returns why CRIU cannot checkpoint here, or "".
func criuSkip() string { return ctrckpt.FindCRIU().Problem }

func newCkptFixture(t *testing.T, f *fixture) *ckptFixture {
	t.Helper()
	if why := criuSkip(); why != "" {
		t.Skip(why)
	}
	c := &ckptFixture{f: f, dir: t.TempDir(), name: "docker.io/gantry-test/cuda-counter:1"}
	c.ckdir = filepath.Join(c.dir, "cuda-calls")
	if err := os.Mkdir(c.ckdir, 0o755); err != nil {
		t.Fatal(err)
	}
	var err error
	c.driver, err = fakedriver.Build(filepath.Join(c.dir, "driver"), fakedriver.Options{GPUs: 8, DeviceNodes: true, Version: "580.159.04", CheckpointDir: c.ckdir})
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile(f.config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.NewReplacer(
		fmt.Sprintf("driver-root = %q", f.driver.Root), fmt.Sprintf("driver-root = %q", c.driver.Root),
		fmt.Sprintf("cache-dir = %q", filepath.Join(f.dir, "cache")), fmt.Sprintf("cache-dir = %q", filepath.Join(c.dir, "cache")),
		fmt.Sprintf("driver-tree-dir = %q", filepath.Join(f.dir, "trees")), fmt.Sprintf("driver-tree-dir = %q", filepath.Join(c.dir, "trees")),
	).Replace(string(base))
	if !strings.Contains(cfg, c.driver.Root) {
		t.Fatalf("the fixture's configuration names no driver root:\n%s", base)
	}
	c.config = filepath.Join(c.dir, "gantry.toml")
	if err := os.WriteFile(c.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// The image: the test image's tree and the counter, built with the
	// host's gcc and glibc (which the tree has).
	root := filepath.Join(c.dir, "image")
	if out, err := exec.Command("cp", "-a", f.rootfs, root).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	src := filepath.Join(c.dir, "counter.c")
	if err := os.WriteFile(src, []byte(counterSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-O2", "-o", filepath.Join(root, counterName), src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("gcc counter: %v\n%s", err, out)
	}
	if err := copyLibs(filepath.Join(root, counterName), root, map[string]bool{}); err != nil {
		t.Fatal(err)
	}
	layer, err := tarTree(root)
	if err != nil {
		t.Fatal(err)
	}
	c.image = filepath.Join(c.dir, "counter-oci.tar")
	if err := writeImageArchive(c.image, layer, c.name, []string{counterName}); err != nil {
		t.Fatal(err)
	}
	return c
}

// calls returns the fake driver's record since the last call, and resets it.
func (c *ckptFixture) calls() string {
	p := filepath.Join(c.ckdir, "calls")
	b, _ := os.ReadFile(p)
	os.Remove(p)
	return string(b)
}

// ckptLines is the record the fake libcuda keeps of ops on pid.
func ckptLines(pid int, ops ...string) string {
	var b strings.Builder
	for _, op := range ops {
		name, detail, _ := strings.Cut(op, " ")
		b.WriteString(name + " " + strconv.Itoa(pid) + " " + detail + "\n")
	}
	return b.String()
}

// count is what the counter in the container whose init is host pid wrote
// last, read through the process's root.
func count(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/root/tmp/count", pid))
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// waitCount waits until the counter of pid counted to at least n.
func waitCount(t *testing.T, pid, n int) int {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		if c := count(pid); c >= n {
			return c
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the container (pid %d) did not count to %d in 90 s (at %d)", pid, n, count(pid))
	return 0
}

// checkImageSealed checks a checkpoint image directory: directories 0700,
// files 0600, and Gantry's record of the GPUs there.
func checkImageSealed(t *testing.T, dir string, gpuMinor int) {
	t.Helper()
	n := 0
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if perm := fi.Mode().Perm(); fi.IsDir() && perm != 0o700 || fi.Mode().IsRegular() && perm != 0o600 {
			t.Errorf("%s: mode %v, want 0700 directories and 0600 files", p, perm)
		}
		n++
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	rec, found, err := ctrckpt.ReadRecord(dir)
	if err != nil || !found || rec.CUDAProcesses != 1 || len(rec.GPUs) != 1 || rec.GPUs[0].Minor != gpuMinor {
		t.Errorf("%s: record %+v %v %v: want 1 CUDA process on GPU minor %d", dir, rec, found, err, gpuMinor)
	}
}

// checkArchive checks an exported checkpoint archive (tar, gzip or not):
// the file itself 0600, and every file of the CRIU image in it 0600 with
// Gantry's record among them.
func checkArchive(t *testing.T, path string) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		t.Errorf("checkpoint archive %s: mode %v, readable by others", path, perm)
	}
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var r io.Reader = fh
	if zr, err := gzip.NewReader(fh); err == nil {
		r = zr
	} else if _, err := fh.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(r)
	var record, pages bool
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		if !strings.HasPrefix(name, "checkpoint/") || h.Typeflag != tar.TypeReg {
			continue
		}
		if perm := h.FileInfo().Mode().Perm(); perm != 0o600 {
			t.Errorf("%s: %s mode %v in the archive, want 0600", path, name, perm)
		}
		record = record || name == "checkpoint/"+ctrckpt.RecordFile
		pages = pages || strings.HasPrefix(name, "checkpoint/pages-")
	}
	if !record || !pages {
		t.Errorf("%s: the archive lacks the CRIU image (pages %v) or Gantry's record (%v)", path, pages, record)
	}
}

// criuLogIn is the end of the CRIU log an engine's error names ("log
// file: PATH"), for a failure's message.
func criuLogIn(out string) string {
	_, rest, ok := strings.Cut(out, "log file: ")
	if !ok {
		return ""
	}
	path := strings.FieldsFunc(rest, func(r rune) bool { return r == '"' || r == '\\' || r == ' ' || r == '\n' })[0]
	return "\n" + path + ":\n" + tail(path, 3000)
}

// argsRecorder is a runtime that records its arguments and the names of
// its environment variables, one line per call, in log, then runs runtime
// with them and GANTRY_CONFIG=config: what an engine passes. (Podman runs
// the runtime's checkpoint with PATH and XDG_RUNTIME_DIR alone, so the
// runtime reads the default configuration file, which the tests must not
// write.)
func argsRecorder(t *testing.T, dir, runtime, config string) (path, log string) {
	t.Helper()
	d := filepath.Join(dir, "recorder")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(d, filepath.Base(runtime))
	log = filepath.Join(dir, "runtime-args.log")
	script := fmt.Sprintf(`#!/bin/sh
echo "$* [env: $(env | sed 's/=.*//' | sort | tr '\n' ' ')]" >> %q
export GANTRY_CONFIG=%q
exec %q "$@"
`, log, config, runtime)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, log
}

// removeRestoreCopies removes the copies of checkpoint images that
// containerd (1.6 and 2.4) makes for a restore in $XDG_RUNTIME_DIR or the
// temporary directory (ctrd-checkpoint*) and leaves behind: the ones the
// recorded restores of this test name.
func removeRestoreCopies(t *testing.T, log string) {
	for _, l := range recordedCalls(log, "restore") {
		f := strings.Fields(l)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "--image-path" && strings.HasPrefix(filepath.Base(f[i+1]), "ctrd-checkpoint") {
				if _, err := os.Stat(f[i+1]); err == nil {
					t.Logf("containerd left its copy of the checkpoint %s: removed", f[i+1])
					os.RemoveAll(f[i+1])
				}
			}
		}
	}
}

// recordedCalls returns the recorded runtime calls of the commands named.
func recordedCalls(log string, commands ...string) []string {
	b, _ := os.ReadFile(log)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, f := range strings.Fields(l) {
			if slices.Contains(commands, f) {
				out = append(out, l)
				break
			}
		}
	}
	return out
}

// podmanCkptCase is one podman container checkpointed and restored through
// gantry-runtime: podman is the command that runs podman with the case's
// global flags (and, for CDI, in withCDI's namespace); opts are run's GPU
// options; minor the GPU they name.
type podmanCkptCase struct {
	e       *podmanEngine
	c       *ckptFixture
	podman  func(args ...string) (string, error)
	opts    []string
	minor   int
	argsLog string
}

func (k podmanCkptCase) inspect(t *testing.T, name, format string) string {
	t.Helper()
	out, err := k.podman("inspect", "--format", format, name)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// podman warns on stderr (the fake driver's device numbers, which the
	// host's /dev lacks); the answer is the last line.
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func (k podmanCkptCase) pid(t *testing.T, name string) int {
	t.Helper()
	s := k.inspect(t, name, "{{.State.Pid}}")
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 {
		t.Fatalf("podman inspect %s: pid %q", name, s)
	}
	return pid
}

// run checkpoints a running GPU container with --leave-running (when
// leave), then without, exports each, removes the container and restores
// it from the archive, checking the CUDA calls, the container's count and
// the archives.
func (k podmanCkptCase) run(t *testing.T, name string, leave bool) {
	e, c := k.e, k.c
	args := slices.Concat([]string{"run", "-d", "--name", name, "--network", "none", "--cgroup-parent", e.cgroupParent}, k.opts)
	if apparmorUnusable() {
		args = append(args, "--security-opt", "apparmor=unconfined")
	}
	if out, err := k.podman(append(args, c.name)...); err != nil {
		t.Fatalf("%v\n%s\n%s", err, out, e.f.runtimeLogTail())
	}
	t.Cleanup(func() { k.podman("rm", "--force", name) })
	pid := k.pid(t, name)
	waitCount(t, pid, 3)
	c.calls()
	dir := t.TempDir()

	if leave {
		archive := filepath.Join(dir, "leave-running.tar.gz")
		if out, err := k.podman("container", "checkpoint", "--leave-running", "--compress", "gzip", "--export", archive, name); err != nil {
			t.Fatalf("podman container checkpoint --leave-running: %v\n%s%s\n%s", err, out, criuLogIn(out), e.f.runtimeLogTail())
		}
		if got, want := c.calls(), ckptLines(pid, "lock ok timeout=30000", "checkpoint ok", "restore ok", "unlock ok"); got != want {
			t.Errorf("CUDA calls of podman container checkpoint --leave-running:\n%s\nwant:\n%s", got, want)
		}
		if s := k.inspect(t, name, "{{.State.Status}}"); s != "running" {
			t.Fatalf("after checkpoint --leave-running the container is %s", s)
		}
		waitCount(t, pid, count(pid)+5)
		checkArchive(t, archive)
	}

	archive := filepath.Join(dir, "checkpoint.tar.gz")
	waitCount(t, pid, 50)
	before := count(pid)
	if out, err := k.podman("container", "checkpoint", "--compress", "gzip", "--export", archive, name); err != nil {
		t.Fatalf("podman container checkpoint: %v\n%s%s\n%s", err, out, criuLogIn(out), e.f.runtimeLogTail())
	}
	if got, want := c.calls(), ckptLines(pid, "lock ok timeout=30000", "checkpoint ok"); got != want {
		t.Errorf("CUDA calls of podman container checkpoint:\n%s\nwant:\n%s", got, want)
	}
	if s := k.inspect(t, name, "{{.State.Status}}"); s != "exited" {
		t.Errorf("after checkpoint the container is %s, want exited", s)
	}
	checkArchive(t, archive)
	if out, err := k.podman("rm", name); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}

	if out, err := k.podman("container", "restore", "--import", archive); err != nil {
		t.Fatalf("podman container restore --import: %v\n%s%s\n%s", err, out, criuLogIn(out), e.f.runtimeLogTail())
	}
	npid := k.pid(t, name)
	if got, want := c.calls(), ckptLines(npid, "restore ok", "unlock ok"); got != want {
		t.Errorf("CUDA calls of podman container restore --import:\n%s\nwant:\n%s", got, want)
	}
	if s := k.inspect(t, name, "{{.State.Status}}"); s != "running" {
		t.Fatalf("after restore the container is %s", s)
	}
	// The restored process counts on from where it was: it never started
	// again (a fresh one would count from 1).
	if n := waitCount(t, npid, before+5); n < before {
		t.Errorf("the restored container counts from %d, was at %d", n, before)
	}
	if n := count(npid); n < before {
		t.Errorf("the restored container's count %d is below the checkpoint's %d: it started afresh", n, before)
	}
	ckpt := filepath.Join(k.inspect(t, name, "{{.StaticDir}}"), "checkpoint")
	if _, err := os.Stat(ckpt); err == nil {
		checkImageSealed(t, ckpt, k.minor)
	}
	// What podman ran: checkpoint with the image and work paths under the
	// container's directory (and --leave-running twice, podman 4.3), with
	// PATH and XDG_RUNTIME_DIR alone in its environment; restore through
	// conmon with --detach and --pid-file.
	var sawRestore bool
	for _, l := range recordedCalls(k.argsLog, "checkpoint", "restore") {
		if !strings.Contains(l, "--image-path") {
			continue // podman's feature check, checkpoint --help
		}
		t.Logf("podman ran: gantry-runtime %s", l)
		if strings.Contains(l, " restore ") {
			sawRestore = true
			if !strings.Contains(l, " --detach ") || !strings.Contains(l, " --pid-file ") {
				t.Errorf("podman's restore lacks --detach or --pid-file: %s", l)
			}
		}
	}
	if !sawRestore {
		t.Errorf("no restore recorded in %s", k.argsLog)
	}
	os.Remove(k.argsLog)
}

// cdiHolder starts a process that holds a mount namespace set up as
// withCDI's, until the test ends, and returns its namespace's path for
// nsenter.
func (e *podmanEngine) cdiHolder(t *testing.T) string {
	t.Helper()
	cmd, err := e.cdiCmd("sleep", "100000")
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid)); strings.TrimSpace(string(comm)) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the CDI namespace's holder did not start")
		}
	}
	return fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid)
}

// TestPodmanCheckpoint checkpoints GPU containers with `podman container
// checkpoint --export` and restores them with `podman container restore
// --import`, through gantry-runtime as podman's --runtime, with real runc
// and CRIU; the CUDA step runs against the fake driver's libcuda, which
// keeps each process's checkpoint state in the process and records every
// call. Two containers: one asking by NVIDIA_VISIBLE_DEVICES, one given
// its GPU by Gantry's CDI spec (--device nvidia.com/gpu=0), which
// gantry-runtime finds by its /dev/nvidia0 node. For each: lock and
// checkpoint of the container's pid before runc checkpoint (with restore
// and unlock after --leave-running), restore and unlock of the restored
// pid after runc restore, the container counting on from where it was,
// and the checkpoint's files 0600 in the archive.
func TestPodmanCheckpoint(t *testing.T) {
	e := startPodman(t)
	f := e.f
	c := newCkptFixture(t, f)
	if out, err := e.podman("load", "-i", c.image); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lowLevel, err := e.podman("info", "--format", "{{.Host.OCIRuntime.Path}}")
	lowLevel = strings.TrimSpace(lowLevel)
	if err != nil || !filepath.IsAbs(lowLevel) {
		t.Fatalf("podman info: its OCI runtime: %q %v", lowLevel, err)
	}
	base, err := os.ReadFile(c.config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(base), "[runtime]\n", fmt.Sprintf("[runtime]\n  low-level = %q\n", lowLevel), 1)
	if err := os.WriteFile(c.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// podman, conmon (conmon_env_vars) and so the runtime read the
	// recording driver's configuration.
	saved := e.env
	t.Cleanup(func() { e.env = saved })
	e.env = append(slices.Clone(saved), "GANTRY_CONFIG="+c.config)
	conf := filepath.Join(e.dir, "containers.conf")
	old, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(conf, old, 0o644) })
	if err := os.WriteFile(conf, []byte(strings.ReplaceAll(string(old), "GANTRY_CONFIG="+f.config, "GANTRY_CONFIG="+c.config)), 0o644); err != nil {
		t.Fatal(err)
	}
	rt, argsLog := argsRecorder(t, c.dir, f.runtime, c.config)
	global := []string{"--runtime", rt}

	t.Run("Env", func(t *testing.T) {
		k := podmanCkptCase{e: e, c: c, opts: []string{"-e", "NVIDIA_VISIBLE_DEVICES=1"}, minor: 1, argsLog: argsLog,
			podman: func(args ...string) (string, error) {
				return command(e.env, slices.Concat([]string{"podman"}, e.global, global, args)...)
			}}
		k.run(t, "ckpt-env", true)
	})

	t.Run("CDI", func(t *testing.T) {
		spec := "/var/run/cdi/nvidia.yaml"
		if out, err := e.withCDI(f.gantry, "--config", c.config, "cdi", "generate", "--output", spec); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		// Every podman command in one namespace: podman mounts the
		// container's root file system in the namespace it runs in, and
		// runc's checkpoint resolves the mounts' destinations in it (a
		// destination under /lib, a link in the image, must be resolved
		// for CRIU to know the mount as external).
		ns := e.cdiHolder(t)
		k := podmanCkptCase{e: e, c: c, opts: []string{"--device", "nvidia.com/gpu=0"}, minor: 0, argsLog: argsLog,
			podman: func(args ...string) (string, error) {
				return command(e.env, slices.Concat([]string{"nsenter", "--mount=" + ns, "--", "podman"}, e.global, global, args)...)
			}}
		k.run(t, "ckpt-cdi", false)
	})
}

// ctrCkptVersion is one containerd release the checkpoint test runs.
type ctrCkptVersion struct {
	name, bin, ctr string
	shim           string // containerd-shim-runc-v2 of the release, first in the daemon's PATH; "" for PATH's
}

// TestContainerdCheckpoint checkpoints and restores a GPU container
// through containerd's runc v2 shim with gantry-runtime as its runc binary
// (ctr run --runc-binary, what a runtime entry's BinaryName makes it), with
// real runc and CRIU, on containerd 1.6 (Debian's) and 2.x (where
// scripts/build-containerd2.sh built it): ctr tasks checkpoint (the task
// goes on), ctr tasks checkpoint --exit --image-path (CRIU's files in a
// directory, 0600), and ctr containers checkpoint --task then ctr
// containers restore --live, the restored counter going on. containerd
// pauses the task (cgroup freezer) before every checkpoint, so
// gantry-runtime thaws it for the CUDA calls (which need the process
// running) and pauses it again before runc checkpoint.
func TestContainerdCheckpoint(t *testing.T) {
	f := need(t)
	if why := containerdSkip(); why != "" {
		t.Skip(why)
	}
	c := newCkptFixture(t, f)
	bin1, _ := exec.LookPath("containerd")
	versions := []ctrCkptVersion{{name: "1.6", bin: bin1, ctr: "ctr"}}
	if bin2, ctr2, why := containerd2(); why == "" {
		v := ctrCkptVersion{name: "2.x", bin: bin2, ctr: ctr2}
		if shim := filepath.Join(filepath.Dir(bin2), "containerd-shim-runc-v2"); fileExists(shim) {
			v.shim = shim
		}
		versions = append(versions, v)
	} else {
		t.Logf("containerd 2.x not run: %s", why)
	}
	for _, v := range versions {
		t.Run(v.name, func(t *testing.T) { containerdCheckpoint(t, f, c, v) })
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func containerdCheckpoint(t *testing.T, f *fixture, c *ckptFixture, v ctrCkptVersion) {
	hostDirsCleanup(t)
	dir := t.TempDir()
	env := f.daemonEnv()
	if v.shim != "" {
		shimDir := filepath.Join(dir, "shim")
		if err := os.MkdirAll(shimDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(v.shim, filepath.Join(shimDir, "containerd-shim-runc-v2")); err != nil {
			t.Fatal(err)
		}
		for i, kv := range env {
			if p, ok := strings.CutPrefix(kv, "PATH="); ok {
				env[i] = "PATH=" + shimDir + ":" + p
			}
		}
	}
	ns := fmt.Sprintf("gantry-ckpt-%d", os.Getpid())
	t.Cleanup(func() { removeCgroupDirs("/" + ns) })
	cdir := filepath.Join(dir, "containerd")
	if err := os.MkdirAll(cdir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(cdir, "containerd.sock")
	config := filepath.Join(cdir, "config.toml")
	cfg := fmt.Sprintf(containerdConfig, filepath.Join(cdir, "root"), filepath.Join(cdir, "state"), sock, sock+".ttrpc", filepath.Join(cdir, "opt"))
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	runCfg := fmt.Sprintf(containerdRunConfig, config)
	// 2.x's CRI plugins, off as 1.6's are (they would want CNI).
	runCfg = strings.Replace(runCfg, "disabled_plugins = [\n", "disabled_plugins = [\n  \"io.containerd.cri.v1.runtime\",\n  \"io.containerd.cri.v1.images\",\n", 1)
	runConfig := filepath.Join(cdir, "run.toml")
	if err := os.WriteFile(runConfig, []byte(runCfg), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, "containerd", filepath.Join(cdir, "containerd.log"), dir, env, v.bin, "--config", runConfig)
	d.waitReady(t, func() error {
		_, err := command(env, v.ctr, "--address", sock, "version")
		return err
	})
	ctr := func(args ...string) (string, error) {
		return command(env, slices.Concat([]string{v.ctr, "--address", sock, "--namespace", ns}, args)...)
	}
	if out, err := ctr("version"); err == nil {
		t.Logf("%s", strings.TrimSpace(out))
	}
	snapshotter := "native"
	if f.overlay {
		snapshotter = "overlayfs"
	}
	if out, err := ctr("images", "import", "--snapshotter", snapshotter, c.image); err != nil {
		t.Fatalf("%v\n%s\n%s", err, out, tail(d.log, 4000))
	}
	rt, argsLog := argsRecorder(t, dir, f.runtime, c.config)
	runcRoot := filepath.Join(dir, "runc")
	// runTask starts the GPU container id (GPU 1), removed at the test's end.
	runTask := func(id string) {
		t.Helper()
		if out, err := ctr("run", "-d", "--null-io", "--snapshotter", snapshotter, "--runc-binary", rt, "--runc-root", runcRoot,
			"--env", "NVIDIA_VISIBLE_DEVICES=1", c.name, id); err != nil {
			t.Fatalf("%v\n%s\n%s", err, out, f.runtimeLogTail())
		}
		t.Cleanup(func() {
			ctr("tasks", "kill", "-s", "KILL", id)
			time.Sleep(time.Second)
			ctr("tasks", "delete", "--force", id)
			ctr("containers", "delete", id)
		})
	}
	id := "ckpt"
	runTask(id)
	task := func() (pid int, status string) {
		out, err := ctr("tasks", "ls")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, l := range strings.Split(out, "\n") {
			if fs := strings.Fields(l); len(fs) == 3 && fs[0] == id {
				pid, _ = strconv.Atoi(fs[1])
				return pid, fs[2]
			}
		}
		return 0, "gone"
	}
	pid, _ := task()
	waitCount(t, pid, 3)
	c.calls()

	// ctr tasks checkpoint: into the content store, the task going on.
	if out, err := ctr("tasks", "checkpoint", id); err != nil {
		t.Fatalf("ctr tasks checkpoint: %v\n%s%s\n%s", err, out, criuLogIn(out), f.runtimeLogTail())
	} else {
		t.Logf("ctr tasks checkpoint: %s", strings.TrimSpace(out))
	}
	if got, want := c.calls(), ckptLines(pid, "lock ok timeout=30000", "checkpoint ok", "restore ok", "unlock ok"); got != want {
		t.Errorf("CUDA calls of ctr tasks checkpoint:\n%s\nwant:\n%s", got, want)
	}
	if p, s := task(); p != pid || s != "RUNNING" {
		t.Fatalf("after ctr tasks checkpoint the task is %d %s, want %d RUNNING", p, s, pid)
	}
	waitCount(t, pid, count(pid)+5)

	// ctr containers checkpoint --task, the task killed and the container
	// removed, then ctr containers restore --live.
	ref := "gantry-test/checkpoint:" + id
	waitCount(t, pid, 50)
	before := count(pid)
	if out, err := ctr("containers", "checkpoint", "--task", "--rw", id, ref); err != nil {
		t.Fatalf("ctr containers checkpoint --task: %v\n%s%s\n%s", err, out, criuLogIn(out), f.runtimeLogTail())
	}
	if got, want := c.calls(), ckptLines(pid, "lock ok timeout=30000", "checkpoint ok", "restore ok", "unlock ok"); got != want {
		t.Errorf("CUDA calls of ctr containers checkpoint --task:\n%s\nwant:\n%s", got, want)
	}
	if out, err := ctr("tasks", "kill", "-s", "KILL", id); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, s := task(); s == "STOPPED" || s == "gone" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the task did not stop on SIGKILL")
		}
	}
	for _, args := range [][]string{{"tasks", "delete", id}, {"containers", "delete", id}} {
		if out, err := ctr(args...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	index := checkpointIndex(t, ctr, ref)
	checkBlobModes(t, filepath.Join(cdir, "root"), index)
	out, err := ctr("containers", "restore", "--live", "--rw", id, ref)
	var npid int
	switch {
	case err != nil && v.name == "1.6" && strings.Contains(out, "media type not found") && !strings.Contains(index, "checkpoint.config.v1+proto"):
		// containerd 1.6's task service keeps no container spec in a
		// checkpoint (2.x's does), and ctr's restore needs one: it
		// fails so for every container. A new container goes on.
		t.Logf("containerd 1.6: ctr containers restore fails for any container: %s (the checkpoint index has no %s)", strings.TrimSpace(out), "application/vnd.containerd.container.checkpoint.config.v1+proto")
		id = "ckpt-again" // the failed restore left a snapshot named ckpt
		runTask(id)
		npid, _ = task()
		waitCount(t, npid, 3)
		c.calls()
	case err != nil:
		t.Fatalf("ctr containers restore --live: %v\n%s%s\n%s", err, out, criuLogIn(out), f.runtimeLogTail())
	default:
		var status string
		npid, status = task()
		if status != "RUNNING" {
			t.Fatalf("after ctr containers restore --live the task is %s", status)
		}
		if got, want := c.calls(), ckptLines(npid, "restore ok", "unlock ok"); got != want {
			t.Errorf("CUDA calls of ctr containers restore --live:\n%s\nwant:\n%s", got, want)
		}
		if n := waitCount(t, npid, before+5); n < before {
			t.Errorf("the restored task counts from %d, was at %d", n, before)
		}
	}

	// ctr tasks checkpoint --exit --image-path: CRIU's files in a
	// directory of the caller's, root's alone.
	image := filepath.Join(dir, "image")
	if out, err := ctr("tasks", "checkpoint", "--exit", "--image-path", image, "--work-path", filepath.Join(dir, "work"), id); err != nil {
		t.Fatalf("ctr tasks checkpoint --exit --image-path: %v\n%s%s\n%s", err, out, criuLogIn(out), f.runtimeLogTail())
	}
	if got, want := c.calls(), ckptLines(npid, "lock ok timeout=30000", "checkpoint ok"); got != want {
		t.Errorf("CUDA calls of ctr tasks checkpoint --exit:\n%s\nwant:\n%s", got, want)
	}
	checkImageSealed(t, image, 1)

	for _, l := range recordedCalls(argsLog, "checkpoint", "restore", "pause", "resume") {
		t.Logf("the shim ran: gantry-runtime %s", l)
	}
	removeRestoreCopies(t, argsLog)
}

// checkpointIndex is the OCI index of the checkpoint image ref in a
// private containerd, as JSON.
func checkpointIndex(t *testing.T, ctr func(...string) (string, error), ref string) string {
	t.Helper()
	out, err := ctr("images", "ls")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if fs := strings.Fields(l); len(fs) > 2 && fs[0] == ref {
			idx, err := ctr("content", "get", fs[2])
			if err != nil {
				t.Fatalf("%v\n%s", err, idx)
			}
			return idx
		}
	}
	t.Fatalf("no image %s in:\n%s", ref, out)
	return ""
}

// checkBlobModes reports the modes of the checkpoint's CRIU blob in the
// content store under root and of the directories above it.
func checkBlobModes(t *testing.T, root, index string) {
	t.Helper()
	var idx struct {
		Manifests []struct {
			MediaType, Digest string
		}
	}
	if err := json.Unmarshal([]byte(index[strings.Index(index, "{"):]), &idx); err != nil {
		t.Fatalf("the checkpoint index: %v\n%s", err, index)
	}
	for _, m := range idx.Manifests {
		if !strings.Contains(m.MediaType, "criu") {
			continue
		}
		p := filepath.Join(root, "io.containerd.content.v1.content", "blobs", strings.Replace(m.Digest, ":", "/", 1))
		var modes []string
		for q := p; q != root; q = filepath.Dir(q) {
			fi, err := os.Stat(q)
			if err != nil {
				t.Errorf("the checkpoint's CRIU blob: %v", err)
				return
			}
			modes = append(modes, fmt.Sprintf("%s %v", strings.TrimPrefix(q, root), fi.Mode().Perm()))
		}
		t.Logf("the checkpoint's CRIU image (%s) in containerd's content store: %s", m.MediaType, strings.Join(modes, ", "))
	}
}

// TestDockerCheckpoint drives Docker's checkpoint commands (experimental
// in Docker 20.10: daemon.json "experimental": true) on a GPU container of
// the nvidia runtime that `gantry runtime configure` registered: dockerd
// asks its containerd for the task's checkpoint, and the runc v2 shim runs
// gantry-runtime checkpoint. `docker checkpoint create --leave-running`:
// the CUDA lock, checkpoint, restore and unlock, and the container goes on;
// `docker checkpoint create` stops it after the lock and checkpoint; `docker
// start --checkpoint` restores it, its CUDA state restored and unlocked, and
// it counts on from where it was.
func TestDockerCheckpoint(t *testing.T) {
	f := need(t)
	c := newCkptFixture(t, f)
	dir := t.TempDir()
	rt, argsLog := argsRecorder(t, dir, f.runtime, c.config)
	e := startDockerWith(t, f.daemonEnv(), func(env []string, daemonJSON string) (string, error) {
		out, err := command(env, f.gantry, "runtime", "configure", "--runtime", "docker", "--config-file", daemonJSON, "--runtime-path", rt)
		if err != nil {
			return out, err
		}
		// Docker 20.10 has checkpoint and restore only as experimental.
		var m map[string]any
		b, err := os.ReadFile(daemonJSON)
		if err == nil {
			err = json.Unmarshal(b, &m)
		}
		if err != nil {
			return out, err
		}
		m["experimental"] = true
		b, _ = json.MarshalIndent(m, "", "  ")
		return out, os.WriteFile(daemonJSON, b, 0o644)
	})
	// The counter image: the fixture's image tree as one layer.
	layer, err := tarTree(filepath.Join(c.dir, "image"))
	if err != nil {
		t.Fatal(err)
	}
	layerTar := filepath.Join(dir, "counter.tar")
	if err := os.WriteFile(layerTar, layer, 0o644); err != nil {
		t.Fatal(err)
	}
	const image = "gantry-test/cuda-counter:1"
	if out, err := e.docker("import", layerTar, image); err != nil {
		t.Fatalf("docker import: %v\n%s", err, out)
	}
	name := "ckpt"
	args := []string{"run", "-d", "--name", name, "--runtime", "nvidia", "--network", "none", "-e", "NVIDIA_VISIBLE_DEVICES=1"}
	if apparmorUnusable() {
		args = append(args, "--security-opt", "apparmor=unconfined")
	}
	if out, err := e.docker(append(args, image, counterName)...); err != nil {
		t.Fatalf("docker run: %v\n%s\n%s", err, out, f.runtimeLogTail())
	}
	t.Cleanup(func() { e.docker("rm", "-f", name) })
	pidOf := func() int {
		out, _ := e.docker("inspect", "--format", "{{.State.Pid}}", name)
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	pid := pidOf()
	waitCount(t, pid, 3)
	c.calls()

	if out, err := e.docker("checkpoint", "create", "--leave-running", name, "cp1"); err != nil {
		t.Fatalf("docker checkpoint create --leave-running: %v\n%s%s\n%s\ndockerd log:\n%s", err, out, criuLogIn(out), f.runtimeLogTail(), tail(e.d.log, 3000))
	}
	if got, want := c.calls(), ckptLines(pid, "lock ok timeout=30000", "checkpoint ok", "restore ok", "unlock ok"); got != want {
		t.Errorf("CUDA calls of docker checkpoint create --leave-running:\n%s\nwant:\n%s", got, want)
	}
	if p := pidOf(); p != pid {
		t.Fatalf("after docker checkpoint create --leave-running the container's pid is %d, was %d", p, pid)
	}
	waitCount(t, pid, count(pid)+5)
	if out, err := e.docker("checkpoint", "ls", name); err != nil || !strings.Contains(out, "cp1") {
		t.Errorf("docker checkpoint ls: %v\n%s", err, out)
	}

	waitCount(t, pid, 50)
	if out, err := e.docker("checkpoint", "create", name, "cp2"); err != nil {
		t.Fatalf("docker checkpoint create: %v\n%s%s\n%s", err, out, criuLogIn(out), f.runtimeLogTail())
	}
	if got, want := c.calls(), ckptLines(pid, "lock ok timeout=30000", "checkpoint ok"); got != want {
		t.Errorf("CUDA calls of docker checkpoint create:\n%s\nwant:\n%s", got, want)
	}
	before := count(pid) // read through /proc/PID/root: 0 once it is gone
	if out, _ := e.docker("inspect", "--format", "{{.State.Running}}", name); strings.TrimSpace(out) != "false" {
		t.Fatalf("after docker checkpoint create the container runs: %s", out)
	}
	// What dockerd kept: CRIU's files and Gantry's record, under its
	// data root.
	var img string
	filepath.Walk(filepath.Join(e.dir, "docker", "data", "containers"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() && fi.Name() == "cp2" {
			img = p
		}
		return nil
	})
	if img == "" {
		t.Fatal("no checkpoint cp2 under dockerd's data root")
	}
	var files []string
	filepath.Walk(img, func(p string, fi os.FileInfo, err error) error {
		if err == nil && p != img {
			files = append(files, fmt.Sprintf("%s %v", strings.TrimPrefix(p, img+"/"), fi.Mode().Perm()))
		}
		return nil
	})
	t.Logf("dockerd's checkpoint %s: %s", img, strings.Join(files, ", "))
	if rec, found, err := ctrckpt.ReadRecord(img); err != nil || !found || rec.CUDAProcesses != 1 || len(rec.GPUs) != 1 || rec.GPUs[0].Minor != 1 {
		t.Errorf("Gantry's record in %s: %+v %v %v, want 1 CUDA process on GPU minor 1", img, rec, found, err)
	}

	out, err := e.docker("start", "--checkpoint", "cp2", name)
	if err != nil {
		t.Fatalf("docker start --checkpoint: %v\n%s%s\n%s\ndockerd log:\n%s", err, out, criuLogIn(out), f.runtimeLogTail(), tail(e.d.log, 3000))
	}
	npid := pidOf()
	if got, want := c.calls(), ckptLines(npid, "restore ok", "unlock ok"); got != want {
		t.Errorf("CUDA calls of docker start --checkpoint:\n%s\nwant:\n%s", got, want)
	}
	if n := waitCount(t, npid, 5); n < 50 {
		t.Errorf("the restored container counts from %d, was past 50 (%d through /proc)", n, before)
	}
	for _, l := range recordedCalls(argsLog, "checkpoint", "restore") {
		t.Logf("the shim ran: gantry-runtime %s", l)
	}
	removeRestoreCopies(t, argsLog)
}
