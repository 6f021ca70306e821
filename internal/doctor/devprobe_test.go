package doctor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/procfs"
)

// runcContainer is a real runc container running busybox sleep.
type runcContainer struct {
	id    string
	pid   int
	state string // runc --root
}

// startRunc starts a detached runc container whose only process sleeps;
// allowCtl adds a device cgroup rule for 195:255 to runc's defaults (which
// do not have it), as gantry-runtime does for a GPU container.
func startRunc(t *testing.T, name string, allowCtl bool, edit ...func(*specs.Spec)) runcContainer {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: starts runc containers")
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("runc not installed (scripts/deps.sh --test installs it)")
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox not installed (apt-get install busybox-static; scripts/deps.sh --test does)")
	}
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(runc, "spec", "--bundle", dir).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v\n%s", err, out)
	}
	var spec specs.Spec
	cfg := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(cfg)
	if err == nil {
		err = json.Unmarshal(raw, &spec)
	}
	if err != nil {
		t.Fatal(err)
	}
	spec.Process.Terminal = false
	spec.Process.Args = []string{"/bin/busybox", "sleep", "600"}
	id := fmt.Sprintf("gantry-doctor-%s-%d", name, os.Getpid())
	spec.Linux.CgroupsPath = "/" + id
	if allowCtl {
		major, minor := int64(195), int64(255)
		spec.Linux.Resources.Devices = append(spec.Linux.Resources.Devices,
			specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Minor: &minor, Access: "rwm"})
	}
	for _, e := range edit {
		e(&spec)
	}
	if raw, err = json.Marshal(&spec); err == nil {
		err = os.WriteFile(cfg, raw, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	pidFile := filepath.Join(dir, "pid")
	cmd := exec.Command(runc, "--root", state, "run", "--detach", "--bundle", dir, "--pid-file", pidFile, id)
	// The container inherits these; files rather than pipes, so that the
	// detached container does not keep this test waiting on them.
	logFile, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Run(); err != nil {
		log, _ := os.ReadFile(logFile.Name())
		t.Fatalf("runc run: %v\n%s", err, log)
	}
	t.Cleanup(func() {
		_ = exec.Command(runc, "--root", state, "delete", "--force", id).Run()
	})
	b, err = os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return runcContainer{id: id, pid: pid, state: state}
}

// TestProbeDevice probes real runc containers: one whose device cgroup
// (runc's defaults: a v1 list, or an eBPF program on v2) has no rule for
// 195:255, and one that allows it, as a GPU container's spec does. The
// probe is this test binary started again (init sees probeEnv) and placed
// in each container's cgroup; the node it opens is made in a temporary
// directory, since the dev root given has none.
func TestProbeDevice(t *testing.T) {
	denied := startRunc(t, "denied", false)
	allowed := startRunc(t, "allowed", true)
	noNodes := t.TempDir()

	res, err := probeDevice("/proc", denied.pid, noNodes)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := procfs.ReadDeviceCgroup("/proc", denied.pid)
	if res.Place != want {
		t.Errorf("probed in %s, the container is in %s", res.Place, want)
	}
	if res.Access() != accessRefused || res.Errno != syscall.EPERM {
		t.Fatalf("container without the rule: %s (%v), want EPERM", res.Errstr(), res.Access())
	}
	if strings.HasPrefix(res.Node, noNodes) || !strings.HasSuffix(res.Node, "/nvidiactl") {
		t.Errorf("probe node %s", res.Node)
	}
	if _, err := os.Stat(filepath.Dir(res.Node)); !os.IsNotExist(err) {
		t.Errorf("the probe's node directory %s is left behind (%v)", filepath.Dir(res.Node), err)
	}
	if res.Place.V2 == res.HaveRules {
		t.Errorf("devices.list evidence on %s: %v", res.Place, res.HaveRules)
	}

	res, err = probeDevice("/proc", allowed.pid, noNodes)
	if err != nil {
		t.Fatal(err)
	}
	// ENXIO on a host without the driver; success where nvidia is loaded.
	if a := res.Access(); a != accessNoDriver && a != accessAllowed {
		t.Fatalf("container with the rule: %s (%v), want ENXIO or success", res.Errstr(), a)
	}
	t.Logf("allowed: %s placed by %s opened %s: %s", res.Place, res.Placed, res.Node, res.Errstr())
	switch {
	case res.Place.V2 && res.Placed != "clone3 CLONE_INTO_CGROUP":
		// Linux before 5.7 has no CLONE_INTO_CGROUP; the fallback is tested.
		t.Logf("cgroup v2 without CLONE_INTO_CGROUP: placed by %s", res.Placed)
	case !res.Place.V2 && res.Placed != "cgroup.procs":
		t.Errorf("cgroup v1: placed by %s, want cgroup.procs", res.Placed)
	}

	t.Run("HostNode", func(t *testing.T) {
		if _, err := os.Stat("/proc/driver/nvidia/version"); err != nil {
			t.Skip("no NVIDIA driver loaded on this host: the host's /dev/nvidiactl is probed on GPU hosts")
		}
		res, err := probeDevice("/proc", allowed.pid, "/")
		if err != nil {
			t.Fatal(err)
		}
		if res.Node != "/dev/nvidiactl" || res.Access() != accessAllowed {
			t.Fatalf("the host's node from a container allowed it: %s %s", res.Node, res.Errstr())
		}
		res, err = probeDevice("/proc", denied.pid, "/")
		if err != nil || res.Access() != accessRefused {
			t.Fatalf("the host's node from a container without the rule: %+v, %v", res, err)
		}
	})
	if res.HaveRules && !strings.Contains(strings.Join(res.Rules, ","), "c 195:255 rwm") {
		t.Errorf("devices.list GPU rules %v lack c 195:255 rwm", res.Rules)
	}

	t.Run("NoNodeInside", func(t *testing.T) {
		// The allowed container's own /dev has no nvidiactl: runc made it
		// from its spec, which lists no GPU node.
		c := checkDeviceAccess(Options{Proc: "/proc", Config: configWithDevRoot(noNodes)}, "container y", allowed.pid,
			containerFixes{restart: "r", recur: "k"}, "")
		if c.Status != Fail || !strings.Contains(c.Evidence, "has no /dev/nvidiactl") || !strings.Contains(c.Fix, CheckContainer) {
			t.Fatalf("%+v", c)
		}
	})

	// What systemctl daemon-reload does to a rule a hook added: it is gone
	// from the cgroup although the container still runs.
	t.Run("RuleRemoved", func(t *testing.T) {
		if res.Place.V2 {
			t.Skip("cgroup v2: a single device rule cannot be removed from outside (it is an eBPF program); the denied container covers EPERM")
		}
		mounts, err := hostCgroupMounts("/proc")
		if err != nil {
			t.Fatal(err)
		}
		dir, err := mounts.dir(res.Place)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "devices.deny"), []byte("c 195:255 rwm"), 0); err != nil {
			t.Fatal(err)
		}
		c := checkDeviceAccess(Options{Proc: "/proc", Config: configWithDevRoot(noNodes)}, "container x", allowed.pid,
			containerFixes{restart: "restart it", recur: "keep the rule"}, "")
		if c.Status != Fail || !strings.Contains(c.Evidence, "Failed to initialize NVML: Unknown Error") ||
			!strings.Contains(c.Evidence, "operation not permitted") || strings.Contains(c.Evidence, "c 195:255 rwm") ||
			c.Fix != "restart it; keep the rule; "+fixDevChar {
			t.Fatalf("%+v", c)
		}
		t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
	})

	t.Run("ProcessGone", func(t *testing.T) {
		_, err := probeDevice("/proc", 1<<30, noNodes)
		if err == nil || !strings.Contains(err.Error(), "the container's cgroup") {
			t.Fatalf("%v", err)
		}
	})
}

func configWithDevRoot(dir string) config.Config {
	c := config.Default()
	c.DriverRoot = dir
	return c
}

// TestProbeChild is the probe process's side, called in this process: it
// opens only a 195:255 character device, and only once told to.
func TestProbeChild(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := probeChild(file, strings.NewReader("g"), &out); code != 2 || out.Len() != 0 {
		t.Errorf("a regular file: exit %d, %q", code, out.String())
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for mknod")
	}
	node, cleanup, err := probeNode(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	if code := probeChild(node, strings.NewReader(""), &out); code != 2 || out.Len() != 0 {
		t.Errorf("no go-ahead: exit %d, %q", code, out.String())
	}
	if code := probeChild(node, strings.NewReader("g"), &out); code != 0 {
		t.Fatalf("exit %d", code)
	}
	var rep probeReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || !strings.Contains(rep.Cgroup, ":") {
		t.Fatalf("%q: %v", out.String(), err)
	}
	// This test process's own cgroup allows the node, or doctor itself
	// runs somewhere that does not (then EPERM).
	if a := classifyOpen(syscall.Errno(rep.Errno)); a == accessUnknown {
		t.Errorf("open of %s: %v", node, syscall.Errno(rep.Errno))
	}
}
