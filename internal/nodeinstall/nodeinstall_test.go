package nodeinstall_test

import (
	"bytes"
	"context"
	"fmt"
	"github.com/gantry-gpu/gantry/internal/hostguard"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
	"github.com/gantry-gpu/gantry/internal/nodeinstall"
)

// built holds gantry, gantry-runtime and gantry-cdi-hook, built once.
var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gantry-nodeinstall-bin-")
		if err != nil {
			buildErr = err
			return
		}
		built = dir
		cmd := exec.Command("go", "build", "-o", dir+"/", "../../cmd/gantry", "../../cmd/gantry-runtime", "../../cmd/gantry-cdi-hook")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

func TestMain(m *testing.M) {
	code := hostguard.Run(m)
	if built != "" {
		os.RemoveAll(built)
	}
	os.Exit(code)
}

// node is a private containerd 1.6+ with its CRI plugin, everything under
// dir, started and restarted by a shell script the way a service manager
// would: the installer's --restart-command.
type node struct {
	dir, config, sock, restart, pidFile, log string
	original                                 []byte
}

// The node's containerd configuration, as a distribution writes it: a
// comment, the paths, the CRI plugin on, no runtimes of its own.
const nodeConfig = `# containerd on this node (a comment install must keep, and uninstall restore)
version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`

func newNode(t *testing.T, restartGuard string) *node {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root (a private containerd)")
	}
	for _, p := range []string{"containerd", "go"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed (apt-get install containerd; scripts/deps.sh --test does)", p)
		}
	}
	dir := t.TempDir()
	n := &node{dir: dir, config: filepath.Join(dir, "etc/containerd/config.toml"), sock: filepath.Join(dir, "run/containerd/containerd.sock"),
		restart: filepath.Join(dir, "restart-containerd"), pidFile: filepath.Join(dir, "containerd.pid"), log: filepath.Join(dir, "containerd.log")}
	if len(n.sock) > 100 {
		t.Skipf("temporary directory %s too deep for a unix socket path", dir)
	}
	os.MkdirAll(filepath.Dir(n.config), 0o755)
	n.original = []byte(fmt.Sprintf(nodeConfig, filepath.Join(dir, "var/lib/containerd"), filepath.Join(dir, "run/containerd"), n.sock, n.sock+".ttrpc", filepath.Join(dir, "opt")))
	if err := os.WriteFile(n.config, n.original, 0o640); err != nil {
		t.Fatal(err)
	}
	// The script stops the running daemon and starts a new one in its own
	// session; restartGuard, when set, is shell run before the start (a
	// test's way to make the engine fail to come back).
	script := fmt.Sprintf(`#!/bin/sh
if [ -f %[1]s ]; then kill $(cat %[1]s) 2>/dev/null; i=0; while kill -0 $(cat %[1]s) 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; rm -f %[1]s; fi
%[4]s
setsid containerd --config %[2]s </dev/null >>%[3]s 2>&1 &
echo $! >%[1]s
`, n.pidFile, n.config, n.log, restartGuard)
	if err := os.WriteFile(n.restart, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(n.pidFile); err == nil {
			var pid int
			fmt.Sscan(string(b), &pid)
			if pid > 0 {
				syscall.Kill(pid, syscall.SIGTERM)
				for i := 0; i < 300 && syscall.Kill(pid, 0) == nil; i++ {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
		// containerd's mounts under the directory, deepest first.
		if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
			var ms []string
			for _, l := range strings.Split(string(b), "\n") {
				if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
					ms = append(ms, f[4])
				}
			}
			for i := len(ms) - 1; i >= 0; i-- {
				syscall.Unmount(ms[i], syscall.MNT_DETACH)
			}
		}
	})
	if out, err := exec.Command("/bin/sh", "-c", n.restart).CombinedOutput(); err != nil {
		t.Fatalf("starting containerd: %v\n%s", err, out)
	}
	n.waitRuntime(t, "", 60*time.Second)
	return n
}

// runtimeOf asks the live containerd over CRI which program its runtime
// "nvidia" runs ("" when it has none).
func (n *node) runtimeOf() (string, error) {
	conn, err := grpc.NewClient("unix://"+n.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := runtimeapi.NewRuntimeServiceClient(conn).Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return "", err
	}
	reg, err := engineconfig.ParseContainerdStatus([]byte(st.GetInfo()["config"]))
	if err != nil {
		return "", err
	}
	rt, _ := reg.Runtime("nvidia")
	return rt.Program, nil
}

func (n *node) waitRuntime(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	var got string
	var err error
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if got, err = n.runtimeOf(); err == nil && got == want {
			return
		}
	}
	b, _ := os.ReadFile(n.log)
	t.Fatalf("containerd's runtime nvidia: %q, %v; want %q\ncontainerd log:\n%s", got, err, want, lastBytes(b, 3000))
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func (n *node) options(t *testing.T) nodeinstall.Options {
	sim := filepath.Join(n.dir, "sim-driver")
	if out, err := exec.Command(filepath.Join(binaries(t), "gantry"), "--gpus", "sim:h100x8", "sim", "driver-root", sim).CombinedOutput(); err != nil {
		t.Fatalf("gantry sim driver-root: %v\n%s", err, out)
	}
	gcfg := filepath.Join(n.dir, "gantry.toml")
	// Its own cache-dir: the default is the host's /run/gantry.
	os.WriteFile(gcfg, []byte(fmt.Sprintf("gpus = \"sim:h100x8\"\ndriver-root = %q\n[runtime]\ncache-dir = %q\n", sim, filepath.Join(n.dir, "run/gantry"))), 0o644)
	var log bytes.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("installer log:\n%s", log.String())
		}
	})
	return nodeinstall.Options{
		HostRoot: "/", SourceDir: binaries(t), BinDir: filepath.Join(n.dir, "usr/local/gantry/bin"),
		Engine: engineconfig.Containerd, ConfigFile: n.config, DropIn: filepath.Join(n.dir, "etc/containerd/conf.d/99-nvidia.toml"),
		CDISpec: filepath.Join(n.dir, "var/run/cdi/gantry.yaml"), GantryConfig: gcfg,
		StateDir: filepath.Join(n.dir, "var/lib/gantry/node-install"), CRISocket: n.sock,
		RestartCommand: n.restart, Timeout: 2 * time.Minute, Log: &log,
	}
}

// tree lists every file under dir but containerd's own state, with
// its content's size and mode.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		for _, skip := range []string{"var/lib/containerd", "run", "opt", "sim-driver", "containerd.log", "containerd.pid"} {
			if rel == skip || strings.HasPrefix(rel, skip+"/") {
				if fi.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		out[rel] = fmt.Sprintf("%v %d", fi.Mode(), fi.Size())
		return nil
	})
	return out
}

// TestInstallUninstallContainerd: a real containerd (with its CRI plugin)
// gets Gantry's runtime through the drop-in, restarts and answers CRI with
// it loaded; a second install (an upgrade) replaces the binaries by rename
// and restarts nothing; uninstall puts config.toml back byte for byte,
// removes everything else install made, and containerd answers without
// the runtime.
func TestInstallUninstallContainerd(t *testing.T) {
	n := newNode(t, "")
	o := n.options(t)
	before := tree(t, n.dir)
	ctx := context.Background()

	res, err := nodeinstall.Install(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Changed {
		t.Error("first install: Changed false")
	}
	rt := filepath.Join(o.BinDir, "gantry-runtime")
	if got, err := n.runtimeOf(); err != nil || got != rt {
		t.Fatalf("after install containerd runs %q for nvidia (%v), want %s", got, err, rt)
	}
	for _, name := range []string{"gantry", "gantry-runtime", "gantry-cdi-hook", "nvidia-container-runtime-hook", "nvidia-cdi-hook", "nvidia-ctk"} {
		if _, err := os.Stat(filepath.Join(o.BinDir, name)); err != nil {
			t.Errorf("installed %s: %v", name, err)
		}
	}
	if l, _ := os.Readlink(filepath.Join(o.BinDir, "nvidia-container-runtime-hook")); l != "gantry-runtime" {
		t.Errorf("nvidia-container-runtime-hook -> %q, want gantry-runtime", l)
	}
	spec, err := os.ReadFile(o.CDISpec)
	if err != nil || !bytes.Contains(spec, []byte("nvidia.com/gpu")) || !bytes.Contains(spec, []byte(filepath.Join(o.BinDir, "gantry-cdi-hook"))) {
		t.Errorf("CDI spec %s (%v) does not define nvidia.com/gpu with the installed hook:\n%s", o.CDISpec, err, lastBytes(spec, 800))
	}
	cur, _ := os.ReadFile(n.config)
	if !bytes.HasPrefix(cur, []byte("# containerd on this node")) || !bytes.Contains(cur, []byte("conf.d/*.toml")) {
		t.Errorf("config.toml after install:\n%s", cur)
	}

	// An upgrade: the binary replaced by rename (a new inode), the engine
	// left alone.
	var st1, st2 syscall.Stat_t
	syscall.Stat(rt, &st1)
	res, err = nodeinstall.Install(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Stat(rt, &st2)
	if res.Changed || st1.Ino == st2.Ino {
		t.Errorf("second install: Changed %v, gantry-runtime inode %d -> %d (want no change and a new inode)", res.Changed, st1.Ino, st2.Ino)
	}

	res, err = nodeinstall.Uninstall(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Changed {
		t.Error("uninstall: Changed false")
	}
	if got, err := n.runtimeOf(); err != nil || got != "" {
		t.Errorf("after uninstall containerd still runs %q for nvidia (%v)", got, err)
	}
	if cur, _ := os.ReadFile(n.config); !bytes.Equal(cur, n.original) {
		t.Errorf("config.toml after uninstall differs from the original:\n%s\nwant:\n%s", cur, n.original)
	}
	if fi, _ := os.Stat(n.config); fi == nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("config.toml mode after uninstall: %v, want 0640", fi.Mode())
	}
	after := tree(t, n.dir)
	for p, v := range after {
		if before[p] != v {
			t.Errorf("after uninstall %s is %q, before install %q", p, v, before[p])
		}
	}
	for p, v := range before {
		if after[p] != v {
			t.Errorf("after uninstall %s is %q, before install %q", p, after[p], v)
		}
	}
	// Again: nothing to undo.
	if _, err := nodeinstall.Uninstall(ctx, o); err != nil {
		t.Errorf("second uninstall: %v", err)
	}
}

// TestInstallFailsClosed: containerd does not come back after the restart
// with the new configuration (here: the restart does not start it while
// the drop-in exists). Install puts config.toml back, removes what it
// installed, restarts containerd again (which then answers, without the
// runtime) and says why.
func TestInstallFailsClosed(t *testing.T) {
	n := newNode(t, "")
	o := n.options(t)
	guard := fmt.Sprintf("if [ -e %s ]; then echo 'containerd: refusing to start (the test says so)' >&2; exit 0; fi", o.DropIn)
	// The same script with the guard before the start.
	b, _ := os.ReadFile(n.restart)
	os.WriteFile(n.restart, bytes.Replace(b, []byte("\nsetsid"), []byte("\n"+guard+"\nsetsid"), 1), 0o755)
	o.Timeout = 15 * time.Second
	before := tree(t, n.dir)

	_, err := nodeinstall.Install(context.Background(), o)
	if err == nil {
		t.Fatal("install succeeded with an engine that does not come back")
	}
	for _, want := range []string{"did not come back healthy", "CRI socket", "the old configuration is back", "answers again"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if cur, _ := os.ReadFile(n.config); !bytes.Equal(cur, n.original) {
		t.Errorf("config.toml after the failed install:\n%s", cur)
	}
	if got, err := n.runtimeOf(); err != nil || got != "" {
		t.Errorf("after the failed install containerd runs %q for nvidia (%v), want it up without", got, err)
	}
	after := tree(t, n.dir)
	for p, v := range after {
		if before[p] != v {
			t.Errorf("after the failed install %s is %q, before %q", p, v, before[p])
		}
	}
}
