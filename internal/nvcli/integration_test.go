package nvcli

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/ldcache"
)

// The integration tests run this test binary as nvidia-container-cli: when
// it is started under that name it is the entry point, not the tests.
func init() {
	if filepath.Base(os.Args[0]) == Name {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
}

// probeSrc dlopens libcuda.so.1 by SONAME, as CUDA programs do, so the
// container's loader (and its ld.so.cache) must find the injected library.
const probeSrc = `#include <dlfcn.h>
#include <stdio.h>
int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
	int (*get)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
	int v = 0;
	if (!get || get(&v) != 0) { printf("cuDriverGetVersion failed\n"); return 1; }
	printf("cuda %d\n", v);
	return 0;
}
`

// cliDir returns a world-readable directory holding nvidia-container-cli, a
// copy of this test binary (the LXC hook runs it from a user namespace, which
// cannot enter go test's private build directory).
func cliDir(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := worldDir(t)
	copyTo(t, self, filepath.Join(dir, Name), 0o755)
	return dir
}

// worldDir is a temporary directory others may read and search.
func worldDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func copyTo(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// needTools skips the test when a program it drives is missing.
func needTools(t *testing.T, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (containers, mounts, device nodes)")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s not installed (scripts/deps.sh --test installs it)", tool)
		}
	}
}

// imageRoot makes a minimal container image at dir: a static busybox as
// /bin/sh, and /probe with the host's glibc (the files ldd names, copied to
// the same paths) and an ld.so.cache for them written by `ldconfig -r`. No
// NVIDIA file is in it.
func imageRoot(t *testing.T, dir string) {
	t.Helper()
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("skipping: busybox not installed (busybox-static)")
	}
	if out, err := exec.Command("file", "-L", busybox).Output(); err == nil && !bytes.Contains(out, []byte("statically linked")) {
		t.Skipf("skipping: %s is not statically linked (install busybox-static)", busybox)
	}
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "etc", "usr/lib/x86_64-linux-gnu"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyTo(t, busybox, filepath.Join(dir, "bin/busybox"), 0o755)
	for _, l := range []string{"sh", "ls", "cat", "echo"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", l)); err != nil {
			t.Fatal(err)
		}
	}
	src := filepath.Join(t.TempDir(), "probe.c")
	if err := os.WriteFile(src, []byte(probeSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	probe := filepath.Join(dir, "probe")
	if out, err := exec.Command("gcc", "-o", probe, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	conf, err := fakedriver.CopyLoaderDeps(probe, dir)
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/ld.so.conf"), []byte(strings.Join(conf, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ldconfig", "-r", dir).CombinedOutput(); err != nil {
		t.Fatalf("ldconfig -r: %v\n%s", err, out)
	}
}

// insideScript runs in the container and reports what it sees.
const insideScript = `ls /dev | grep nvidia | sort | tr '\n' ' '; echo
cat /dev/nvidia1 2>&1 | sed 's/^/open: /'
/probe
/usr/bin/nvidia-smi -L
`

// checkInside judges insideScript's output: GPU 1 only, its node usable as
// far as the device cgroup goes, libcuda found by the loader.
func checkInside(t *testing.T, out string, cudaVersion int, cgroup bool) {
	t.Helper()
	lines := strings.Split(out, "\n")
	devs := strings.Fields(lines[0])
	want := map[string]bool{"nvidia1": true, "nvidiactl": true, "nvidia-uvm": true, "nvidia-uvm-tools": true}
	for _, d := range devs {
		if strings.HasPrefix(d, "nvidia") && d != "nvidia-caps" && !want[d] {
			t.Errorf("container has /dev/%s, which was not asked for (all: %q)", d, devs)
		}
		delete(want, d)
	}
	if len(want) > 0 {
		t.Errorf("container lacks %v in /dev (has %q)\n%s", want, devs, out)
	}
	if !strings.Contains(out, "cuda "+strconv.Itoa(cudaVersion)+"\n") {
		t.Errorf("the probe did not load the injected libcuda (want cuda %d):\n%s", cudaVersion, out)
	}
	if cgroup {
		// No NVIDIA kernel module here: a granted open fails with ENXIO;
		// the device cgroup refusing it would be EPERM.
		if !strings.Contains(out, "No such device or address") {
			t.Errorf("opening /dev/nvidia1 did not get past the device cgroup:\n%s", out)
		}
	}
}

// readCache returns the SONAMEs in the image's ld.so.cache.
func cacheNames(t *testing.T, rootDir string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rootDir, "etc/ld.so.cache"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ldcache.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, e := range c.Entries {
		if _, ok := names[e.Name]; !ok {
			names[e.Name] = e.Path
		}
	}
	return names
}

// runcBundle writes a bundle around an image at dir/rootfs whose process runs
// script, with one prestart hook.
func runcBundle(t *testing.T, dir, script string, hook map[string]any) {
	t.Helper()
	cmd := exec.Command("runc", "spec")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v\n%s", err, out)
	}
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/bin/sh", "-c", script}
	spec["root"] = map[string]any{"path": "rootfs", "readonly": false}
	spec["hooks"] = map[string]any{"prestart": []any{hook}}
	if b, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// hookScript is a prestart hook doing what NVIDIA's legacy runtime hook does:
// read the container's pid from the state on stdin and run
// `nvidia-container-cli configure --pid=PID ... ROOTFS`.
const hookScript = `#!/bin/sh
pid=$(sed -n 's/.*"pid": *\([0-9]*\).*/\1/p')
exec nvidia-container-cli --debug="$LOG" configure --pid="$pid" --ldconfig=@/sbin/ldconfig "$@" "$ROOTFS"
`

// A real runc container configured from its prestart hook, as NVIDIA's legacy
// hook drives nvidia-container-cli: GPU 1 and its driver appear, the loader
// finds libcuda through the cache we wrote, the device cgroup lets the node
// be opened; a failed requirement stops the container before it runs.
func TestConfigureRuncContainer(t *testing.T) {
	needTools(t, "runc", "gcc", "ldd", "ldconfig")
	fd := simHost(t)
	bin := cliDir(t)

	startWith := func(t *testing.T, script string, args ...string) (string, string, error) {
		bundle := t.TempDir()
		rootDir := filepath.Join(bundle, "rootfs")
		imageRoot(t, rootDir)
		hook := filepath.Join(bundle, "hook.sh")
		if err := os.WriteFile(hook, []byte(hookScript), 0o755); err != nil {
			t.Fatal(err)
		}
		log := filepath.Join(bundle, "nvidia.log")
		runcBundle(t, bundle, script, map[string]any{
			"path": hook,
			"args": append([]string{"hook.sh"}, args...),
			"env": []string{
				"PATH=" + bin + ":/usr/sbin:/usr/bin:/sbin:/bin",
				"GANTRY_CONFIG=" + os.Getenv("GANTRY_CONFIG"),
				"ROOTFS=" + rootDir,
				"LOG=" + log,
			},
		})
		id := "nvcli-" + strconv.Itoa(os.Getpid()) + "-" + filepath.Base(bundle)
		out, err := exec.Command("runc", "run", "--bundle", bundle, id).CombinedOutput()
		exec.Command("runc", "delete", "--force", id).Run()
		return string(out), rootDir, err
	}

	start := func(t *testing.T, args ...string) (string, string, error) {
		return startWith(t, insideScript, args...)
	}

	t.Run("gpu 1", func(t *testing.T) {
		out, rootDir, err := start(t, "--device=1", "--compute", "--utility", "--require=cuda>=12.0")
		if err != nil {
			t.Fatalf("runc run: %v\n%s", err, out)
		}
		t.Logf("inside the container:\n%s", out)
		checkInside(t, out, fd.CUDAVersion, fd.RealDeviceNodes)
		names := cacheNames(t, rootDir)
		if p := names["libcuda.so.1"]; p != "/usr/local/nvidia/lib64/libcuda.so.1" {
			t.Errorf("ld.so.cache maps libcuda.so.1 to %q", p)
		}
		if _, ok := names["libc.so.6"]; !ok {
			t.Error("the image's own entries were dropped from ld.so.cache")
		}
		// The mounts were made in the container's namespace only.
		if _, err := os.Lstat(filepath.Join(rootDir, "usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04")); err == nil {
			if b, _ := os.ReadFile("/proc/self/mountinfo"); bytes.Contains(b, []byte(rootDir)) {
				t.Error("a mount of the container shows in the host's mount namespace")
			}
		}
	})

	t.Run("no cgroups", func(t *testing.T) {
		if !fd.RealDeviceNodes {
			t.Skip("skipping: the fake driver has no real device nodes")
		}
		out, _, err := start(t, "--device=1", "--utility", "--no-cgroups")
		if err != nil {
			t.Fatalf("runc run: %v\n%s", err, out)
		}
		// runc's default device rules deny the node we did not grant.
		if !strings.Contains(out, "open: cat: can't open '/dev/nvidia1': Operation not permitted") {
			t.Errorf("with --no-cgroups the device cgroup should refuse /dev/nvidia1:\n%s", out)
		}
	})

	// NVIDIA's runtime hook passes NVIDIA_IMEX_CHANNELS on as
	// --imex-channel: the channel's node is made and granted, the others
	// are not given.
	t.Run("imex channel", func(t *testing.T) {
		if !fd.RealDeviceNodes {
			t.Skip("skipping: the fake driver has no real device nodes")
		}
		dir := filepath.Join(fd.Root, "dev/nvidia-caps-imex-channels")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		// A major no driver here registers: a granted open is ENXIO.
		for i, n := range []string{"channel0", "channel1"} {
			if err := unix.Mknod(filepath.Join(dir, n), unix.S_IFCHR|0o666, int(unix.Mkdev(509, uint32(i)))); err != nil {
				t.Fatal(err)
			}
		}
		script := "ls /dev/nvidia-caps-imex-channels | tr '\\n' ' '; echo\ncat /dev/nvidia-caps-imex-channels/channel1 2>&1 | sed 's/^/open: /'\n"
		out, _, err := startWith(t, script, "--device=1", "--utility", "--imex-channel=1")
		if err != nil {
			t.Fatalf("runc run: %v\n%s", err, out)
		}
		if first, _, _ := strings.Cut(out, "\n"); strings.TrimSpace(first) != "channel1" {
			t.Errorf("the container's IMEX channels are %q, want channel1 alone:\n%s", first, out)
		}
		if !strings.Contains(out, "open: cat: can't open '/dev/nvidia-caps-imex-channels/channel1': No such device or address") {
			t.Errorf("opening the channel did not get past the device cgroup:\n%s", out)
		}
	})

	t.Run("requirement fails", func(t *testing.T) {
		out, _, err := start(t, "--device=1", "--compute", "--require=cuda>=99.0")
		if err == nil {
			t.Fatalf("the container ran although its requirement fails:\n%s", out)
		}
		if !strings.Contains(out, "requirements not met on this host: --require") || !strings.Contains(out, "cuda>=99.0") {
			t.Errorf("runc output lacks the requirement error:\n%s", out)
		}
		if strings.Contains(out, "cuda ") {
			t.Errorf("the container process ran:\n%s", out)
		}
	})
}

// lxcConfig is an unprivileged container (root maps to 100000) that runs
// LXC's own nvidia hook at mount time.
const lxcConfig = `lxc.uts.name = gpu
lxc.rootfs.path = dir:ROOT
lxc.idmap = u 0 100000 65536
lxc.idmap = g 0 100000 65536
lxc.net.0.type = empty
lxc.mount.auto = proc:mixed sys:ro
lxc.apparmor.profile = unconfined
lxc.environment = NVIDIA_VISIBLE_DEVICES=1
lxc.environment = NVIDIA_DRIVER_CAPABILITIES=compute,utility
lxc.environment = NVIDIA_REQUIRE_CUDA=cuda>=12.0
lxc.hook.mount = HOOK
`

// LXC's nvidia hook (Debian's liblxc-common), unmodified, with this
// binary as the nvidia-container-cli it finds in PATH: an unprivileged
// container asking for GPU 1 gets /dev/nvidia1 and a loadable libcuda.
func TestLXCHook(t *testing.T) {
	const hook = "/usr/share/lxc/hooks/nvidia"
	needTools(t, "lxc-execute", "gcc", "ldd", "ldconfig")
	if _, err := os.Stat(hook); err != nil {
		t.Skipf("skipping: %s not installed (Debian's lxc package)", hook)
	}
	fd := simHost(t)
	bin := cliDir(t)
	dir := worldDir(t)
	rootDir := filepath.Join(dir, "gpu", "rootfs")
	imageRoot(t, rootDir)
	if out, err := exec.Command("chown", "-R", "100000:100000", rootDir).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v\n%s", err, out)
	}
	// First without the hook: a host where LXC cannot start an unprivileged
	// container at all (no cgroup it may use, no user namespaces) skips.
	plain := strings.NewReplacer("ROOT", rootDir, "lxc.hook.mount = HOOK\n", "").Replace(lxcConfig)
	if err := os.WriteFile(filepath.Join(dir, "gpu", "config"), []byte(plain), 0o644); err != nil {
		t.Fatal(err)
	}
	plainLog := filepath.Join(dir, "lxc-plain.log")
	if out, err := exec.Command("lxc-execute", "-P", dir, "-n", "gpu", "-l", "ERROR", "-o", plainLog, "--", "/bin/sh", "-c", "exit 0").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(plainLog)
		t.Skipf("skipping: LXC cannot start an unprivileged container on this host: %v: %s %s", err, lastLines(string(out), 1), lastLines(string(log), 3))
	}
	cfg := strings.NewReplacer("ROOT", rootDir, "HOOK", hook).Replace(lxcConfig)
	if err := os.WriteFile(filepath.Join(dir, "gpu", "config"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(dir, "lxc.log")
	cmd := exec.Command("lxc-execute", "-P", dir, "-n", "gpu", "-l", "DEBUG", "-o", logFile, "--", "/bin/sh", "-c", insideScript)
	cmd.Env = append(os.Environ(), "PATH="+bin+":/usr/sbin:/usr/bin:/sbin:/bin")
	out, err := cmd.CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("lxc-execute: %v\n%s\nLXC log:\n%s", err, out, lastLines(string(log), 30))
	}
	t.Logf("inside the container:\n%s", out)
	// --no-cgroups (the hook passes it): LXC's own device rules apply.
	checkInside(t, string(out), fd.CUDAVersion, false)
	if p := cacheNames(t, rootDir)["libcuda.so.1"]; p != "/usr/local/nvidia/lib64/libcuda.so.1" {
		t.Errorf("ld.so.cache maps libcuda.so.1 to %q", p)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
