package docs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The sandbox doctest blocks run in.
//
// Every sandbox has simulated GPUs (sim:h100x8 in the file GANTRY_CONFIG
// names), a fake driver root, temporary HOME and TMPDIR, and a working
// directory laid out like a checkout: bin/ holds the binaries TestMain built
// from this tree (as `make build` and `make build-device-plugin` name them),
// and Makefile, scripts/, bench/ and deployments/ are the repository's.
//
// Blocks marked <!-- doctest: root --> write system paths (sudo make
// install, gantry runtime configure, cdi generate --output
// /var/run/cdi/...) and use fixed ports and /tmp paths. They run, as root,
// in a private mount and network namespace held by one locked OS thread:
//
//   - /run and /tmp are empty tmpfs (the sandbox's own directories, which
//     may live under /tmp, are bound back at their paths);
//   - /etc, /usr/bin, /usr/lib and /var are overlays whose writes go to a tmpfs; in
//     them the engines' and Gantry's configuration directories
//     (/etc/docker, /etc/containerd, /etc/crio, /etc/cdi, /etc/gantry),
//     /var/lib/kubelet, containerd's root and Podman's storage
//     (/var/lib/containerd, /var/lib/containers) are removed, so every
//     file the docs write starts from nothing, and doctor finds no
//     kubelet or Podman of the host's; /etc/nvidia-container-runtime/config.toml is the one
//     NVIDIA's toolkit 1.18 installs (internal/config/testdata), as on a host
//     being migrated;
//   - the network has only a loopback interface, so the docs' fixed ports
//     (3476, 9401) are free.
//
// What the docs' commands write (configuration under /etc, /var/run/cdi,
// /usr/bin links, servers on fixed ports) stays in the namespace. It is a
// guard against the docs' own lines, not a jail: /proc, the PID namespace,
// /dev, /sys and the rest of / are the host's. A file's blocks share one
// namespace, in order; when the test ends, its processes are killed and
// the namespace goes with the thread. Without root (or where namespaces
// cannot be made) the root blocks are skipped and say so; CI runs as root.
//
// The same sandbox defines two shell functions, because the docs are
// written for a user's shell and the sandbox's binaries come from TestMain:
//   - sudo runs its command as it is: the sandbox is root already, and a
//     real sudo would reset the sandbox's environment (GANTRY_CONFIG, PATH);
//   - make runs the real make with the targets build, build-device-plugin,
//     bundlesplit and deps taken as done (make -o): TestMain built the binaries from
//     this tree with the same go build, and the test's own prerequisites
//     are deps. Every other target (install, demo, gpu-e2e) runs its recipe.
type sandbox struct {
	root string // the sandbox's directory
	work string // the working directory of every block
	env  []string
	host *privateHost // nil: blocks run on the host, root blocks are skipped
	why  string       // why host is nil
}

// prelude is prepended to every block; see sandbox.
const prelude = `set -euo pipefail
sudo() { "$@"; }
make() { command make -o build -o build-device-plugin -o bundlesplit -o deps "$@"; }
`

func newSandbox(t *testing.T, wantRoot bool) *sandbox {
	t.Helper()
	root := t.TempDir()
	s := &sandbox{root: root, work: filepath.Join(root, "work")}
	home, tmp := filepath.Join(root, "home"), filepath.Join(root, "tmp")
	bin := filepath.Join(s.work, "bin")
	for _, d := range []string{s.work, home, tmp, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// bin/ is the sandbox's own (make gpu-e2e writes into it); its programs
	// are TestMain's.
	entries, err := os.ReadDir(binDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Symlink(filepath.Join(binDir, e.Name()), filepath.Join(bin, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	repo, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"Makefile", "scripts", "bench", "deployments"} {
		if err := os.Symlink(filepath.Join(repo, f), filepath.Join(s.work, f)); err != nil {
			t.Fatal(err)
		}
	}
	driverRoot := filepath.Join(root, "driver")
	if out, err := exec.Command(filepath.Join(binDir, "gantry"), "sim", "driver-root", driverRoot).CombinedOutput(); err != nil {
		t.Fatalf("gantry sim driver-root: %v\n%s", err, out)
	}

	if wantRoot {
		switch {
		case os.Geteuid() != 0:
			s.why = "not root: the blocks marked <!-- doctest: root --> need a private mount namespace (CI runs as root)"
		default:
			nvidiaConfig, err := os.ReadFile(filepath.Join(repo, "internal/config/testdata/nvidia/ctk-1.18.toml"))
			if err != nil {
				t.Fatal(err)
			}
			h, err := newPrivateHost([]string{root, filepath.Dir(binDir), repo}, nvidiaConfig)
			if err != nil {
				s.why = fmt.Sprintf("cannot make a private mount namespace: %v", err)
			} else {
				s.host = h
				t.Cleanup(h.close)
			}
		}
	}

	// Gantry's configuration: simulated GPUs over the fake driver root.
	// In the private namespace everything else is the default (CDI specs
	// in /etc/cdi and /var/run/cdi, the inventory cache in /run/gantry),
	// as on a host; on the host, those point into the sandbox.
	conf := fmt.Sprintf("gpus = \"sim:h100x8\"\ndriver-root = %q\n", driverRoot)
	if s.host == nil {
		conf += fmt.Sprintf("\n[cdi]\nspec-dirs = [%q]\n\n[runtime]\ncache-dir = %q\n",
			filepath.Join(tmp, "cdi"), filepath.Join(root, "cache"))
	}
	cfg := filepath.Join(root, "gantry.toml")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	s.env = []string{
		"PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOME=" + home, "TMPDIR=" + tmp, "GANTRY_CONFIG=" + cfg,
		"LANG=C", "LC_ALL=C",
	}
	return s
}

// run runs a script with bash in the sandbox: in the private namespace when
// there is one. Processes the script leaves behind (a server started with
// &) are killed when it ends.
func (s *sandbox) run(t *testing.T, script string) (string, error) {
	t.Helper()
	out, err := os.CreateTemp(s.root, "out-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.Command("bash", "-c", prelude+script)
	cmd.Dir = s.work
	cmd.Env = s.env
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = out, out // a file: no copying goroutine waits for a background child
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := cmd.Start
	if s.host != nil {
		start = func() error { return s.host.do(cmd.Start) }
	}
	if err := start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(2 * time.Minute):
		runErr = context.DeadlineExceeded
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if runErr == context.DeadlineExceeded {
		<-done
	}
	b, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b), runErr
}

// privateHost is a mount and network namespace held by one locked OS
// thread; processes started on that thread (do) are born in it.
type privateHost struct {
	jobs chan func()
}

func newPrivateHost(keep []string, nvidiaConfig []byte) (*privateHost, error) {
	h := &privateHost{jobs: make(chan func())}
	ready := make(chan error)
	go func() {
		// Never unlocked: when this goroutine returns, the thread, which
		// is the only one in the namespaces, ends with it.
		runtime.LockOSThread()
		if err := enterPrivateHost(keep, nvidiaConfig); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for job := range h.jobs {
			job()
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return h, nil
}

// do runs f on the namespace's thread.
func (h *privateHost) do(f func() error) error {
	errc := make(chan error)
	h.jobs <- func() { errc <- f() }
	return <-errc
}

func (h *privateHost) close() { close(h.jobs) }

// The directories a root block may write, and what replaces them.
var (
	freshDirs   = []string{"/run", "/tmp"}                         // empty tmpfs
	overlayDirs = []string{"/etc", "/usr/bin", "/usr/lib", "/var"} // the host's, writes to a tmpfs (/usr/lib: make install's systemd units)
	removed     = []string{"/etc/docker", "/etc/containerd", "/etc/crio", "/etc/cdi", "/etc/gantry",
		"/etc/nvidia-container-runtime", "/var/lib/kubelet", "/var/lib/containerd", "/var/lib/containers"}
)

// enterPrivateHost moves the calling (locked) thread into new mount and
// network namespaces and lays out the directories root blocks write; keep
// are the directories that must stay visible at their paths.
func enterPrivateHost(keep []string, nvidiaConfig []byte) error {
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return err
	}
	// Hold the kept directories by descriptor: once covered, they are
	// bound back from /proc/self/fd.
	var kept []string
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, k := range keep {
		for _, d := range append(freshDirs, overlayDirs...) {
			if k == d || strings.HasPrefix(k, d+"/") {
				fd, err := unix.Open(k, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
				if err != nil {
					return fmt.Errorf("opening %s: %w", k, err)
				}
				kept, fds = append(kept, k), append(fds, fd)
				break
			}
		}
	}
	for _, d := range freshDirs {
		if err := unix.Mount("tmpfs", d, "tmpfs", unix.MS_NOSUID, "mode=1777"); err != nil {
			return fmt.Errorf("tmpfs on %s: %w", d, err)
		}
	}
	if err := unix.Chmod("/run", 0o755); err != nil {
		return err
	}
	for _, d := range overlayDirs {
		layers := filepath.Join("/run/.docs-overlays", strings.ReplaceAll(strings.Trim(d, "/"), "/", "-"))
		upper, wdir := filepath.Join(layers, "upper"), filepath.Join(layers, "work")
		if err := os.MkdirAll(upper, 0o755); err != nil {
			return err
		}
		if err := os.MkdirAll(wdir, 0o755); err != nil {
			return err
		}
		if err := unix.Mount("overlay", d, "overlay", 0, "lowerdir="+d+",upperdir="+upper+",workdir="+wdir); err != nil {
			return fmt.Errorf("overlay on %s: %w", d, err)
		}
		// What is removed below must be the overlay's, never the host's.
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err != nil || st.Type != unix.OVERLAYFS_SUPER_MAGIC {
			return fmt.Errorf("%s is not the overlay just mounted (statfs: %v)", d, err)
		}
	}
	for i, k := range kept {
		if err := os.MkdirAll(k, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", fds[i]), k, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("binding %s back: %w", k, err)
		}
	}
	for _, r := range removed {
		if err := os.RemoveAll(r); err != nil {
			return err
		}
	}
	p := "/etc/nvidia-container-runtime/config.toml"
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, nvidiaConfig, 0o644)
}

// loopbackUp brings up lo, the new network namespace's only interface.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	return nil
}

// TestRootSandboxIsPrivate: what a root block writes to system paths stays
// in its namespace, its network has only lo, it sees the sandbox's files,
// a failing block fails, and what it leaves running is killed.
func TestRootSandboxIsPrivate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: no private namespace (CI runs as root)")
	}
	s := newSandbox(t, true)
	if s.host == nil {
		t.Fatalf("no private namespace as root: %s", s.why)
	}
	probe := fmt.Sprintf("gantry-docs-probe-%d", os.Getpid())
	hostFiles := []string{"/usr/bin/" + probe, "/run/cdi/" + probe, "/tmp/" + probe, "/etc/" + probe, "/var/lib/" + probe, "/usr/lib/" + probe}
	for _, f := range hostFiles {
		if _, err := os.Lstat(f); err == nil {
			t.Fatalf("%s exists before the test", f)
		}
	}
	daemonJSON, daemonErr := os.ReadFile("/etc/docker/daemon.json")
	pidFile := filepath.Join(s.root, "tmp", "pid")
	out, err := s.run(t, `
for f in `+strings.Join(hostFiles, " ")+`; do mkdir -p "$(dirname "$f")"; echo x > "$f"; done
mkdir -p /etc/docker && echo '{"runtimes": {}}' > /etc/docker/daemon.json
test ! -e /var/lib/kubelet && test ! -e /etc/cdi && test ! -e /etc/gantry
grep -q '^\[nvidia-container-cli\]' /etc/nvidia-container-runtime/config.toml
test -f "$GANTRY_CONFIG" && test -x bin/gantry && test -f Makefile && test -d "$TMPDIR"
test "$(awk 'NR > 2 {print $1}' /proc/net/dev)" = "lo:"
sleep 600 & echo $! > `+pidFile+`
`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, f := range hostFiles {
		if _, err := os.Lstat(f); err == nil {
			os.Remove(f)
			t.Errorf("%s, written in the sandbox, reached the host", f)
		}
	}
	if b, err := os.ReadFile("/etc/docker/daemon.json"); string(b) != string(daemonJSON) || (err == nil) != (daemonErr == nil) {
		t.Errorf("the host's /etc/docker/daemon.json changed: %q (%v), was %q (%v)", b, err, daemonJSON, daemonErr)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	// Killed when the block ended; wait for the kernel to finish it.
	for i := 0; ; i++ {
		st, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil || strings.Contains(string(st), ") Z ") {
			break
		}
		if i == 600 { // a minute
			t.Fatalf("the block's background process %s outlived it: %s", pid, st)
		}
		time.Sleep(100 * time.Millisecond)
	}

	if out, err := s.run(t, "true\nfalse\necho not reached\n"); err == nil || strings.Contains(out, "not reached") {
		t.Errorf("a failing line did not fail the block: %v %q", err, out)
	}
	// Blocks share the namespace, in order.
	if out, err := s.run(t, "cat /tmp/"+probe+" /etc/docker/daemon.json"); err != nil {
		t.Errorf("the next block does not see the first one's files: %v\n%s", err, out)
	}

	// A driver block sees the simulated driver, and what it makes in /dev
	// stays in the namespace; the next block sees the host's kernel again.
	node := "/dev/" + probe
	out, err = s.withDriverHost(t, func() (string, error) {
		return s.run(t, "grep -q '^195 nvidia-frontend$' /proc/devices && test -f /proc/driver/nvidia-caps/mig-minors && ls /sys/bus/pci/devices | grep -q 0000:41:00.0 && modprobe nvidia && ! modprobe ext4 && mknod "+node+" c 1 3 && echo x > /dev/null")
	})
	if err != nil {
		t.Errorf("driver block: %v\n%s", err, out)
	}
	if _, err := os.Lstat(node); err == nil {
		os.Remove(node)
		t.Errorf("%s, made in a driver block, reached the host", node)
	}
	hostDevices, _ := os.ReadFile("/proc/devices")
	if out, err := s.run(t, "test ! -e "+node+" && cat /proc/devices"); err != nil || out != string(hostDevices) {
		t.Errorf("the simulated driver outlived its block: %v\n%s", err, out)
	}
}

// withDriverHost runs f (a root block) with a loaded NVIDIA driver
// simulated in the private namespace, for the lines that read the kernel's
// view of the driver (nvidia-ctk system ...), and takes it away after:
//
//   - /proc/devices is the host's with the driver's character majors added
//     (nvidia-frontend 195, nvidia-caps 236, nvidia-uvm 510);
//   - /proc/driver holds nvidia-caps/mig-minors and the MIG capabilities
//     directory of a MIG-capable driver (config, monitor, and GPU 0's
//     instance 0 with its compute instance 0);
//   - /sys/bus/pci/devices lists two NVIDIA GPUs;
//   - /dev is an overlay of the host's whose writes go to a tmpfs, so the
//     nodes and /dev/char links the lines make stay in the namespace;
//   - modprobe succeeds for the NVIDIA modules (and fails for others).
func (s *sandbox) withDriverHost(t *testing.T, f func() (string, error)) (string, error) {
	t.Helper()
	if s.host == nil {
		t.Fatal("a driver block needs the private namespace")
	}
	dir := filepath.Join(s.root, "driver-host")
	write := func(p, content string, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	hostDevices, err := os.ReadFile("/proc/devices")
	if err != nil {
		t.Fatal(err)
	}
	chr, blk, _ := strings.Cut(string(hostDevices), "\nBlock devices:")
	write(filepath.Join(dir, "devices"), chr+"195 nvidia-frontend\n236 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:"+blk, 0o444)
	write(filepath.Join(dir, "driver", "nvidia-caps", "mig-minors"), "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\ngpu1/gi0/access 120\ngpu1/gi0/ci0/access 121\n", 0o444)
	caps := filepath.Join(dir, "driver", "nvidia", "capabilities")
	for p, minor := range map[string]int{"mig/config": 1, "mig/monitor": 2, "gpu0/mig/gi0/access": 3, "gpu0/mig/gi0/ci0/access": 4} {
		mode := 292
		if minor <= 2 {
			mode = 256
		}
		write(filepath.Join(caps, p), fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n", minor, mode), 0o444)
	}
	for i, class := range []string{"0x030200", "0x030000"} {
		d := filepath.Join(dir, "pci", fmt.Sprintf("0000:%02x:00.0", i+0x41))
		write(filepath.Join(d, "vendor"), "0x10de\n", 0o444)
		write(filepath.Join(d, "class"), class+"\n", 0o444)
	}
	write(filepath.Join(dir, "modprobe"), "#!/bin/sh\n# the sandbox's: the NVIDIA modules are loaded already\ncase \"$*\" in nvidia|nvidia-uvm|nvidia-modeset) exit 0;; esac\necho \"modprobe: FATAL: Module $* not found\" >&2\nexit 1\n", 0o755)
	for _, d := range []string{"dev-upper", "dev-work"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	var mounted []string
	err = s.host.do(func() error {
		bind := func(from, to string) error {
			if err := unix.Mount(from, to, "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("binding %s on %s: %w", from, to, err)
			}
			mounted = append(mounted, to)
			return nil
		}
		if err := bind(filepath.Join(dir, "devices"), "/proc/devices"); err != nil {
			return err
		}
		if err := bind(filepath.Join(dir, "driver"), "/proc/driver"); err != nil {
			return err
		}
		if err := bind(filepath.Join(dir, "pci"), "/sys/bus/pci/devices"); err != nil {
			return err
		}
		modprobe := "/usr/sbin/modprobe"
		if _, err := os.Stat(modprobe); err != nil {
			// None on the host: /usr/bin, after /usr/sbin in the path
			// the command runs modprobe with, is the namespace's overlay.
			modprobe = "/usr/bin/modprobe"
			if err := os.WriteFile(modprobe, nil, 0o755); err != nil {
				return err
			}
		}
		if err := bind(filepath.Join(dir, "modprobe"), modprobe); err != nil {
			return err
		}
		opts := "lowerdir=/dev,upperdir=" + filepath.Join(dir, "dev-upper") + ",workdir=" + filepath.Join(dir, "dev-work")
		if err := unix.Mount("overlay", "/dev", "overlay", 0, opts); err != nil {
			return fmt.Errorf("overlay on /dev: %w", err)
		}
		mounted = append(mounted, "/dev")
		return nil
	})
	defer func() {
		if err := s.host.do(func() error {
			for i := len(mounted) - 1; i >= 0; i-- {
				if err := unix.Unmount(mounted[i], unix.MNT_DETACH); err != nil {
					return fmt.Errorf("unmounting %s: %w", mounted[i], err)
				}
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}()
	if err != nil {
		t.Fatalf("simulating the driver: %v", err)
	}
	return f()
}
