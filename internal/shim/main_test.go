package shim

import (
	"encoding/json"
	"fmt"
	"github.com/gantry-gpu/gantry/internal/hostguard"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/createproto"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// The integration tests run real containers: gantry-runtime (the gantry
// binary built from this tree, under that name) in front of the host's runc,
// with simulated GPUs (sim:h100x8) and a fake driver root made by
// fakedriver: real gcc-built libraries with the driver's SONAMEs, a real
// ld.so.cache and real device nodes. The image is busybox plus a probe
// program that dlopens libcuda.so.1 through the image's own dynamic loader.

// probeSrc dlopens libcuda.so.1 by its SONAME, exactly as the CUDA runtime
// does, and prints what cuDriverGetVersion reports and where the library was
// found.
const probeSrc = `#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
	int (*get)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
	if (!get) { printf("dlsym: %s\n", dlerror()); return 1; }
	int v = 0;
	if (get(&v) != 0) { printf("cuDriverGetVersion failed\n"); return 1; }
	struct link_map *lm = 0;
	dlinfo(h, RTLD_DI_LINKMAP, &lm);
	printf("cuda=%d path=%s\n", v, lm ? lm->l_name : "?");
	return 0;
}
`

// compatSrc is a stand-in for the CUDA forward-compatibility libcuda an
// image carries.
const compatSrc = `int cuDriverGetVersion(int *v) { *v = 99990; return 0; }
int cuInit(unsigned f) { (void)f; return 0; }
`

// evilSrc is what a hostile image would LD_PRELOAD into a host-side helper
// (CVE-2025-23266): if it is ever loaded by a process that sees the host's
// file system, it leaves a mark there.
const evilSrc = `#include <stdio.h>
__attribute__((constructor)) static void mark(void) {
	FILE *f = fopen(MARK, "w");
	if (f) { fputs("loaded", f); fclose(f); }
}
`

type fixture struct {
	dir       string // the test run's scratch directory
	gantry    string // bin/gantry built from this tree
	runtime   string // a symlink named gantry-runtime to it
	driver    *fakedriver.Result
	imageDir  string // the image every bundle copies
	mark      string // host path evil.so writes if it is ever loaded on the host
	specTmpl  []byte
	runc      string
	skip, err string
	t         testing.TB // the test that built the fixture (for buildGantry)
}

var (
	fxOnce sync.Once
	fx     fixture
)

func TestMain(m *testing.M) {
	code := hostguard.Run(m, "/gantry-shim-test-")
	if fx.dir != "" {
		os.RemoveAll(fx.dir)
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// setup builds the shared fixture once; tests that need it call need.
func need(t testing.TB) *fixture {
	t.Helper()
	fxOnce.Do(func() { fx.t = t; fx.build() })
	if fx.skip != "" {
		t.Skip(fx.skip)
	}
	if fx.err != "" {
		t.Fatal(fx.err)
	}
	return &fx
}

func (f *fixture) build() {
	if os.Geteuid() != 0 {
		f.skip = "needs root: runc containers and device nodes"
		return
	}
	var err error
	if f.runc, err = exec.LookPath("runc"); err != nil {
		f.skip = "runc not installed (scripts/deps.sh --test installs it)"
		return
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		f.skip = "gcc not installed"
		return
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		f.skip = "busybox not installed (apt-get install busybox-static)"
		return
	}
	if f.dir, err = os.MkdirTemp("", "gantry-shim-test-"); err != nil {
		f.err = err.Error()
		return
	}
	if err := f.buildAll(busybox); err != nil {
		f.err = err.Error()
	}
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

var (
	binOnce          sync.Once
	binDir, binErr   string
	gantryBin, rtBin string
)

// buildGantry builds the gantry command from this tree once, a
// gantry-runtime symlink to it, and gantry-cdi-hook beside them.
func buildGantry(t testing.TB) (gantry, runtime string) {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gantry-shim-bin-")
		if err != nil {
			binErr = err.Error()
			return
		}
		binDir = dir
		goTool := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			goTool = "go"
		}
		gantryBin = filepath.Join(dir, "gantry")
		if err := run(goTool, "build", "-o", gantryBin, "github.com/gantry-gpu/gantry/cmd/gantry"); err != nil {
			binErr = err.Error()
			return
		}
		// The CDI hook binary beside it, static as make build builds it:
		// gantry cdi generate finds it there.
		hook := exec.Command(goTool, "build", "-o", filepath.Join(dir, "gantry-cdi-hook"), "github.com/gantry-gpu/gantry/cmd/gantry-cdi-hook")
		hook.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := hook.CombinedOutput(); err != nil {
			binErr = fmt.Sprintf("go build ./cmd/gantry-cdi-hook: %v\n%s", err, out)
			return
		}
		rtBin = filepath.Join(dir, "gantry-runtime")
		if err := os.Symlink("gantry", rtBin); err != nil {
			binErr = err.Error()
		}
	})
	if binErr != "" {
		t.Fatal(binErr)
	}
	return gantryBin, rtBin
}

func (f *fixture) buildAll(busybox string) error {
	f.gantry, f.runtime = buildGantry(f.t)
	var err error
	f.driver, err = fakedriver.Build(filepath.Join(f.dir, "driver"), fakedriver.Options{GPUs: 8, DeviceNodes: true})
	if err != nil {
		return err
	}
	if !f.driver.RealDeviceNodes {
		return fmt.Errorf("fake driver has no real device nodes: %v", f.driver.Notes)
	}

	// The image: busybox, the probe with the host's glibc, evil.so.
	img := filepath.Join(f.dir, "image")
	f.imageDir = img
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", "usr/lib/x86_64-linux-gnu", "lib64"} {
		if err := os.MkdirAll(filepath.Join(img, d), 0o755); err != nil {
			return err
		}
	}
	if err := copyFile(busybox, filepath.Join(img, "bin/busybox"), 0o755); err != nil {
		return err
	}
	for _, a := range []string{"sh", "ls", "cat", "stat", "env", "touch", "readlink", "test", "true", "echo"} {
		if err := os.Symlink("busybox", filepath.Join(img, "bin", a)); err != nil {
			return err
		}
	}
	src := filepath.Join(f.dir, "probe.c")
	if err := os.WriteFile(src, []byte(probeSrc), 0o644); err != nil {
		return err
	}
	probe := filepath.Join(img, "bin/probe")
	if err := run("gcc", "-O2", "-o", probe, src, "-ldl"); err != nil {
		return err
	}
	if _, err := fakedriver.CopyLoaderDeps(probe, img); err != nil {
		return err
	}
	f.mark = filepath.Join(f.dir, "host-only", "evil-was-loaded")
	if err := os.MkdirAll(filepath.Dir(f.mark), 0o755); err != nil {
		return err
	}
	evil := filepath.Join(f.dir, "evil.c")
	if err := os.WriteFile(evil, []byte(evilSrc), 0o644); err != nil {
		return err
	}
	if err := run("gcc", "-shared", "-fPIC", "-DMARK=\""+f.mark+"\"", "-o", filepath.Join(img, "evil.so"), evil); err != nil {
		return err
	}

	// The spec template: runc's own default, made to run non-interactively.
	tmpl := filepath.Join(f.dir, "tmpl")
	if err := os.MkdirAll(tmpl, 0o755); err != nil {
		return err
	}
	if err := run(f.runc, "spec", "--bundle", tmpl); err != nil {
		return err
	}
	f.specTmpl, err = os.ReadFile(filepath.Join(tmpl, "config.json"))
	return err
}

func copyFile(from, to string, mode os.FileMode) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, mode)
}

// container is one bundle made from the fixture's image.
type container struct {
	t      *testing.T
	f      *fixture
	id     string
	bundle string
	rootfs string
	config string // GANTRY_CONFIG file
	state  string // runc --root
	low    string // the low-level runtime (runc or crun) gantry-runtime runs
	// server is the create server's socket gantry-runtime is given; none
	// by default (a path that does not exist), so that a server running
	// on the test machine plays no part.
	server string
	// extraEnv is added to gantry-runtime's environment (last wins).
	extraEnv []string
}

type opts struct {
	env      []string
	args     []string
	config   string // extra TOML lines for the [runtime] table
	mutate   func(rootfs string)
	noCaps   bool // drop CAP_SYS_ADMIN (runc's default spec does not grant it anyway)
	privileg bool
	// annotations are the spec's (CDI names under cdi.k8s.io/).
	annotations map[string]string
	// mounts are added to the spec's mounts (a pod's hostPath volumes).
	mounts []ocispecs.Mount
}

var idSeq struct {
	sync.Mutex
	n int
}

func newContainer(t *testing.T, o opts) *container {
	t.Helper()
	f := need(t)
	idSeq.Lock()
	idSeq.n++
	id := fmt.Sprintf("gantry-test-%d-%d", os.Getpid(), idSeq.n)
	idSeq.Unlock()
	dir := t.TempDir()
	c := &container{t: t, f: f, id: id, bundle: filepath.Join(dir, "bundle"), state: filepath.Join(dir, "state")}
	c.rootfs = filepath.Join(c.bundle, "rootfs")
	c.low = runtimeFor(t, f)
	if err := os.MkdirAll(c.bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	// Hard links keep 50 bundles cheap; every change Gantry makes in a
	// root filesystem replaces files by rename, never writes through them.
	if err := run("cp", "-al", f.imageDir, c.rootfs); err != nil {
		t.Fatal(err)
	}
	if o.mutate != nil {
		o.mutate(c.rootfs)
	}
	var spec ocispecs.Spec
	if err := json.Unmarshal(f.specTmpl, &spec); err != nil {
		t.Fatal(err)
	}
	spec.Process.Terminal = false
	spec.Process.Args = o.args
	spec.Process.Env = append([]string{"PATH=/bin"}, o.env...)
	spec.Root = &ocispecs.Root{Path: "rootfs"}
	spec.Annotations = o.annotations
	spec.Mounts = append(spec.Mounts, o.mounts...)
	if o.privileg {
		spec.Process.Capabilities.Bounding = append(spec.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
	}
	b, err := json.MarshalIndent(&spec, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.bundle, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	c.config = filepath.Join(dir, "gantry.toml")
	trees := ""
	if !strings.Contains(o.config, "driver-tree-dir") {
		// The default layout is the tree: its trees here, not on the host.
		trees = fmt.Sprintf("driver-tree-dir = %q\n", filepath.Join(dir, "trees"))
	}
	cfg := fmt.Sprintf(`gpus = "sim:h100x8"
driver-root = %q
[runtime]
low-level = %q
cache-dir = %q
log-file = %q
%s%s
`, f.driver.Root, c.low, filepath.Join(dir, "cache"), filepath.Join(dir, "gantry.log"), trees, o.config)
	if err := os.WriteFile(c.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return c
}

// runtime runs gantry-runtime with runc's arguments and returns stdout,
// stderr and the error.
func (c *container) runtime(args ...string) (string, string, error) {
	full := append([]string{"--root", c.state}, args...)
	cmd := exec.Command(c.f.runtime, full...)
	sock := c.server
	if sock == "" {
		sock = filepath.Join(c.f.dir, "no-create-server.sock")
	}
	cmd.Env = append(append(os.Environ(), "GANTRY_CONFIG="+c.config, createproto.ServerSocketEnv+"="+sock), c.extraEnv...)
	// Files, not pipes: after "create" the container's init keeps its
	// stdio open until "start", and a pipe would block Wait until then.
	stdout, err := os.CreateTemp("", "stdout-")
	if err != nil {
		c.t.Fatal(err)
	}
	defer os.Remove(stdout.Name())
	defer stdout.Close()
	stderr, err := os.CreateTemp("", "stderr-")
	if err != nil {
		c.t.Fatal(err)
	}
	defer os.Remove(stderr.Name())
	defer stderr.Close()
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err = cmd.Run()
	o, _ := os.ReadFile(stdout.Name())
	e, _ := os.ReadFile(stderr.Name())
	return string(o), string(e), err
}

// run runs the container to completion (runc run) and returns its output.
func (c *container) run() (string, string, error) {
	c.t.Cleanup(func() { c.runtime("delete", "--force", c.id) })
	return c.runtime("run", "--bundle", c.bundle, c.id)
}

func (c *container) configJSON() []byte {
	b, err := os.ReadFile(filepath.Join(c.bundle, "config.json"))
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}
