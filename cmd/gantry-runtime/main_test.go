package main

import (
	"debug/elf"
	"fmt"
	"github.com/gantry-gpu/gantry/internal/hostguard"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/gpu/nvml"
)

// The build flags of gantry-runtime, as the Makefile's RUNTIME_TAGS and
// RUNTIME_LDFLAGS give them (TestStaticBinary checks they still do).
const (
	runtimeTags    = "nonvml,gantrylean,osusergo,netgo"
	runtimeLDFlags = "-linkmode external -extldflags -static"
)

// TestMain lets this test binary, which links NVML (no nonvml tag), stand
// in for gantry as the NVML helper of the static gantry-runtime built below:
// it answers the same command with the same code (discover.HelperMain).
func TestMain(m *testing.M) {
	recordArgv()
	if len(os.Args) > 1 && os.Args[1] == discover.HelperCommand {
		os.Exit(discover.HelperMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(hostguard.Run(m))
}

// cacheTOML is the runtime.cache-dir of a test's configuration, in its dir:
// the default is the host's /run/gantry.
func cacheTOML(dir string) string {
	return fmt.Sprintf("[runtime]\ncache-dir = %q\n", filepath.Join(dir, "cache"))
}

func goTool(t *testing.T) string {
	t.Helper()
	g := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(g); err == nil {
		return g
	}
	g, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool")
	}
	return g
}

// Built with its tags, gantry-runtime links no NVML and nothing that makes
// a static glibc program load libraries at run time (os/user's and net's
// cgo lookups go through NSS), but keeps cgo for the fast path's constructor.
// net itself is linked for the create server's unix socket (package createserver),
// built with netgo: no cgo file of it is linked (the cgo check below), and
// its package inits cost about 0.03 ms.
func TestDependencies(t *testing.T) {
	cmd := exec.Command(goTool(t), "list", "-deps", "-tags", runtimeTags, "-f", "{{.ImportPath}} {{len .CgoFiles}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	if !strings.Contains(runtimeTags, "netgo") || !strings.Contains(string(out), "\nnet 0\n") {
		t.Errorf("gantry-runtime links net with cgo files (build it with the netgo tag):\n%s", out)
	}
	if !strings.Contains(string(out), "internal/fastpath 1") || !strings.Contains(string(out), "internal/gpu/nvml 0") {
		t.Fatalf("go list -deps lists neither the fast path's cgo nor the nvml package: the check proves nothing\n%s", out)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, cgo, _ := strings.Cut(l, " ")
		switch {
		case strings.HasPrefix(pkg, "github.com/NVIDIA/go-nvml"), pkg == "os/user", pkg == "plugin",
			pkg == "go.yaml.in/yaml/v2": // its init, ~0.15 ms, on every container start
			t.Errorf("gantry-runtime links %s", pkg)
		case cgo != "0" && !strings.HasSuffix(pkg, "/internal/fastpath") && pkg != "runtime/cgo":
			t.Errorf("gantry-runtime links cgo code of %s", pkg)
		}
	}
}

// Built as make build builds it, gantry-runtime needs no program
// interpreter and no shared library, and gets NVML's answer from the gantry
// binary beside it, or says which is missing.
func TestStaticBinary(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), "RUNTIME_TAGS := "+runtimeTags+"\n") || !strings.Contains(string(mk), "RUNTIME_LDFLAGS := "+runtimeLDFlags+"\n") {
		t.Fatalf("the Makefile's RUNTIME_TAGS or RUNTIME_LDFLAGS differ from this test's (%s; %s): update the test", runtimeTags, runtimeLDFlags)
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot link gantry-runtime")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "gantry-runtime")
	cmd := exec.Command(goTool(t), "build", "-tags", runtimeTags, "-trimpath", "-ldflags", runtimeLDFlags, "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	} else if len(out) > 0 {
		// The linker warns when something needs glibc's shared objects at run time.
		t.Errorf("the static link warned:\n%s", out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("gantry-runtime has a %v program header: it is dynamically linked", p.Type)
		}
	}
	f.Close()

	// nvidia-container-cli info asks for NVML's GPUs (brand, architecture),
	// which gantry-runtime gets from the gantry beside it: first none.
	cli := filepath.Join(dir, "nvidia-container-cli")
	if err := os.Symlink("gantry-runtime", cli); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(conf, []byte("gpus = \"nvml\"\n"+cacheTOML(dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	info := func() (string, error) {
		c := exec.Command(cli, "info")
		c.Env = []string{"GANTRY_CONFIG=" + conf, "PATH=/usr/bin:/bin"}
		out, err := c.CombinedOutput()
		return string(out), err
	}
	if _, err := os.Stat(discover.DefaultHelperPath); err != nil {
		out, err := info()
		if err == nil || !strings.Contains(out, filepath.Join(dir, "gantry")+" nor "+discover.DefaultHelperPath) || !strings.Contains(out, "runtime.gantry-path") {
			t.Errorf("nvidia-container-cli info without gantry: %v\n%s", err, out)
		}
	}
	// Then this test binary as gantry: its answer, whatever NVML says here.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(dir, "gantry")); err != nil {
		t.Fatal(err)
	}
	out, err := info()
	t.Logf("nvidia-container-cli info through gantry: %v\n%s", err, out)
	sys, derr := nvml.Discover(nvml.Options{DriverRoot: "/"})
	switch {
	case derr != nil:
		if err == nil || !strings.Contains(out, derr.Error()) {
			t.Errorf("nvidia-container-cli info through gantry: %v\n%s\nwant the error %q", err, out, derr)
		}
	case err != nil:
		t.Errorf("nvidia-container-cli info through gantry: %v\n%s", err, out)
	default:
		for _, d := range sys.Devices {
			if !regexp.MustCompile(`(?m)^GPU UUID:\s+` + regexp.QuoteMeta(d.UUID)).MatchString(out) {
				t.Errorf("nvidia-container-cli info lacks GPU %s:\n%s", d.UUID, out)
			}
		}
	}

	// nvidia-ctk cdi generate: the static build writes the spec itself
	// (it links no yaml.v2), and hands a command line whose spec needs
	// yaml.v2 (a hook path with a blank) to the gantry beside it, here this
	// test binary recording its argv.
	root := filepath.Join(dir, "driver")
	if _, err := fakedriver.Build(root, fakedriver.Options{GPUs: 8, DeviceNodes: os.Geteuid() == 0}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte("gpus = \"sim:h100x8\"\n"+cacheTOML(dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctk := filepath.Join(dir, "nvidia-ctk")
	if err := os.Symlink("gantry-runtime", ctk); err != nil {
		t.Fatal(err)
	}
	argv := filepath.Join(dir, "argv.json")
	generate := func(extra ...string) (string, int) {
		c := exec.Command(ctk, append([]string{"cdi", "generate", "--driver-root=" + root, "--nvidia-cdi-hook-path=/usr/bin/nvidia-cdi-hook"}, extra...)...)
		c.Env = []string{"GANTRY_CONFIG=" + conf, "PATH=/usr/bin:/bin", argvEnv + "=" + argv}
		out, _ := c.CombinedOutput()
		return string(out), c.ProcessState.ExitCode()
	}
	if out, code := generate(); code != 0 || !strings.Contains(out, "nvidia.com/gpu") {
		t.Errorf("nvidia-ctk cdi generate through the static gantry-runtime: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(argv); err == nil {
		t.Errorf("nvidia-ctk cdi generate ran gantry for a spec gantry-runtime writes itself")
	}
	if out, code := generate("--nvidia-cdi-hook-path=/opt/my hooks/nvidia-cdi-hook"); code != 3 {
		t.Errorf("a spec needing yaml.v2: exit %d, want gantry's (3)\n%s", code, out)
	}
	if b, err := os.ReadFile(argv); err != nil || !strings.Contains(string(b), `"nvidia-ctk","cdi","generate"`) || !strings.Contains(string(b), "my hooks") {
		t.Errorf("gantry's argv: %s (%v), want nvidia-ctk cdi generate with the same flags", b, err)
	}

	// nvidia-ctk hook, which nvidia-ctk's older specs run as root hooks
	// without env (on runc 1.1.5 with the image's environment): served here,
	// static, never by the dynamically linked gantry beside it, whose loader
	// would run the image's LD_PRELOAD (issue 27.2).
	os.Remove(argv)
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs/usr/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.0.2","root":{"path":"rootfs"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(dir, "evil-was-loaded")
	evilC := filepath.Join(dir, "evil.c")
	if err := os.WriteFile(evilC, []byte("#include <stdio.h>\n__attribute__((constructor)) static void m(void) { FILE *f = fopen(\""+mark+"\", \"w\"); if (f) fclose(f); }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	evil := filepath.Join(dir, "evil.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", evil, evilC).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	c := exec.Command(ctk, "hook", "create-symlinks", "--link", "libcuda.so.580.159.04::/usr/lib/libcuda.so.1")
	c.Env = []string{"LD_PRELOAD=" + evil, "PATH=/usr/bin:/bin", argvEnv + "=" + argv}
	c.Stdin = strings.NewReader(`{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":1,"bundle":"` + bundle + `"}`)
	hookOut, err := c.CombinedOutput()
	if _, serr := os.Stat(argv); serr == nil {
		t.Errorf("nvidia-ctk hook ran the gantry beside gantry-runtime (with the caller's LD_PRELOAD)")
	}
	if _, serr := os.Stat(mark); serr == nil {
		t.Errorf("the caller's LD_PRELOAD ran for nvidia-ctk hook")
	}
	if err != nil {
		t.Fatalf("nvidia-ctk hook create-symlinks: %v\n%s", err, hookOut)
	}
	if l, err := os.Readlink(filepath.Join(bundle, "rootfs/usr/lib/libcuda.so.1")); err != nil || l != "libcuda.so.580.159.04" {
		t.Errorf("nvidia-ctk hook create-symlinks made %q, %v", l, err)
	}
}
