package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/gantry-gpu/gantry/internal/hostguard"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gantry-gpu/gantry/internal/cdicmd"
	"github.com/gantry-gpu/gantry/internal/cudackpt"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

var (
	rootOnce sync.Once
	rootDir  string
	rootErr  error
	// testConfig is the package's GANTRY_CONFIG: the defaults but for
	// runtime.cache-dir (cacheTOML), so that nothing reads or writes the
	// host's /run/gantry. A test writing a configuration of its own
	// appends cacheTOML.
	testConfig string
	cacheTOML  string
)

// fakeRoot builds one fake driver root (GKE layout, 8 GPUs) for all tests.
func fakeRoot(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot build the fake driver root (make deps installs it)")
	}
	rootOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gantry-cli-test-")
		if err != nil {
			rootErr = err
			return
		}
		rootDir = filepath.Join(dir, "driver")
		_, rootErr = fakedriver.Build(rootDir, fakedriver.Options{Version: "580.159.04", Layout: fakedriver.LayoutGKE, GPUs: 8, DeviceNodes: true})
	})
	if rootErr != nil {
		t.Fatalf("building fake driver root: %v", rootErr)
	}
	return rootDir
}

func TestMain(m *testing.M) {
	// The test binary stands in for gantry as the CUDA checkpoint helper
	// too (the remap probe runs /proc/self/exe cuda-checkpoint).
	if len(os.Args) > 1 && os.Args[1] == cudackpt.HelperCommand {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	// cdi generate finds gantry-cdi-hook beside the running gantry: the
	// test binary stands in for gantry in a directory that has one.
	exeDir, err := os.MkdirTemp("", "gantry-cli-exe-")
	if err != nil {
		panic(err)
	}
	// A configuration file on the test machine must not change the results,
	// nor the tests the host's cache. (The child of
	// TestHookCommandsIgnoreDevZeroConfig keeps its own.)
	cacheTOML = fmt.Sprintf("[runtime]\ncache-dir = %q\n", filepath.Join(exeDir, "cache"))
	testConfig = filepath.Join(exeDir, "config.toml")
	if err := os.WriteFile(testConfig, []byte(cacheTOML), 0o644); err != nil {
		panic(err)
	}
	if os.Getenv("GANTRY_TEST_HOOK_CHILD") == "" {
		os.Setenv("GANTRY_CONFIG", testConfig)
	}
	if err := os.WriteFile(filepath.Join(exeDir, cdicmd.HookName), []byte("#!/bin/sh\n"), 0o755); err != nil {
		panic(err)
	}
	cdicmd.Executable = func() (string, error) { return filepath.Join(exeDir, "gantry"), nil }
	code := hostguard.Run(m, "/gantry-cli-test-")
	os.RemoveAll(exeDir)
	if rootDir != "" {
		os.RemoveAll(filepath.Dir(rootDir))
	}
	os.Exit(code)
}

func run(args ...string) (stdout, stderr string, code int) {
	var o, e bytes.Buffer
	code = Main(args, &o, &e)
	return o.String(), e.String(), code
}

func TestInfo(t *testing.T) {
	out, errOut, code := run("--gpus", "sim:h100x8", "info")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"NVRM version: 580.159.04", "CUDA version: 13.0", "Device Index: 7", "Model:        NVIDIA H100 80GB HBM3", "Architecture: 9.0"} {
		if !strings.Contains(out, want) {
			t.Errorf("info output lacks %q:\n%s", want, out)
		}
	}
	out, _, code = run("info", "--json", "--gpus=sim:a100x2-mig") // global flag after the command
	if code != 0 {
		t.Fatalf("info --json exit %d", code)
	}
	var sys gpu.System
	if err := json.Unmarshal([]byte(out), &sys); err != nil {
		t.Fatalf("info --json is not JSON: %v", err)
	}
	if len(sys.Devices) != 2 || len(sys.Devices[0].MIGDevices) == 0 {
		t.Fatalf("info --json = %+v", sys)
	}
}

func TestListAndGenerate(t *testing.T) {
	root := fakeRoot(t)
	g := []string{"--gpus", "sim:h100x8", "--driver-root", root}

	out, errOut, code := run(append(g, "list")...)
	if code != 0 {
		t.Fatalf("list exit %d: %s", code, errOut)
	}
	for _, want := range []string{"/dev/nvidia0", "/dev/nvidia7", "/dev/nvidiactl", "libcuda.so.580.159.04", "libnvidia-ml.so.580.159.04", "/usr/local/nvidia/bin/nvidia-smi"} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}
	// Only compute libraries with --capabilities compute.
	out, _, _ = run(append(g, "list", "--capabilities", "compute")...)
	if strings.Contains(out, "libnvidia-encode") || !strings.Contains(out, "libcuda.so") {
		t.Errorf("list --capabilities compute:\n%s", out)
	}

	dir := t.TempDir()
	spec := filepath.Join(dir, "cdi", "nvidia.yaml")
	_, errOut, code = run(append(g, "cdi", "generate", "--output", spec)...)
	if code != 0 {
		t.Fatalf("cdi generate exit %d: %s", code, errOut)
	}
	b, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Kind    string
		Devices []struct{ Name string }
	}
	if err := yaml.Unmarshal(b, &parsed); err != nil {
		t.Fatal(err)
	}
	if parsed.Kind != "nvidia.com/gpu" || len(parsed.Devices) != 17 { // 8 by index, 8 by UUID, all
		t.Fatalf("spec kind %q with %d devices", parsed.Kind, len(parsed.Devices))
	}
	out, errOut, code = run("cdi", "list", "--spec-dirs", filepath.Dir(spec))
	if code != 0 || !strings.Contains(out, "nvidia.com/gpu=all\n") || !strings.Contains(out, "nvidia.com/gpu=7\n") {
		t.Fatalf("cdi list exit %d: %s%s", code, out, errOut)
	}
	out, _, code = run(append(g, "cdi", "generate", "--format", "json")...)
	if code != 0 || !json.Valid([]byte(out)) {
		t.Fatalf("cdi generate --format json to stdout: exit %d, %.200s", code, out)
	}
}

// Bad input: a one-line error that names the input, a non-zero exit code,
// and no output file.
func TestBadInput(t *testing.T) {
	root := fakeRoot(t)
	partial := filepath.Join(t.TempDir(), "partial")
	if err := exec.Command("cp", "-a", root, partial).Run(); err != nil {
		t.Fatal(err)
	}
	libs, _ := filepath.Glob(filepath.Join(partial, "usr/local/nvidia/lib64/libcuda.so*"))
	more, _ := filepath.Glob(filepath.Join(partial, "usr/lib/libcuda.so*"))
	for _, l := range append(libs, more...) {
		os.Remove(l)
	}
	badConfig := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(badConfig, []byte("gpus = \"sim:h100x1\"\ndriver_root = \"/x\"\n"), 0o644)
	corrupt := filepath.Join(t.TempDir(), "corrupt")
	exec.Command("cp", "-a", root, corrupt).Run()
	os.WriteFile(filepath.Join(corrupt, "etc/ld.so.cache"), []byte("glibc-ld.so.cache1.1 garbage"), 0o644)

	tests := []struct {
		name     string
		args     []string
		code     int
		wantErr  string
		produces bool // whether the output file may exist afterwards
	}{
		{"unknown backend", []string{"--gpus", "cuda", "cdi", "generate"}, 1, `"cuda" is not a GPU backend: use nvml, sim:PROFILE`, false},
		{"unknown profile", []string{"--gpus", "sim:h100x9", "cdi", "generate"}, 1, `unknown simulated GPU profile "h100x9": use one of`, false},
		{"missing driver", []string{"--gpus", "sim:h100x1", "--driver-root", "/nonexistent", "cdi", "generate"}, 1, "no NVIDIA driver found under /nonexistent: set driver-root", false},
		{"partial driver", []string{"--gpus", "sim:h100x1", "--driver-root", partial, "cdi", "generate"}, 1, "is incomplete (libcuda.so missing): reinstall the driver or fix --driver-root", false},
		{"unreadable config", []string{"--config", "/nonexistent/config.toml", "info"}, 1, "reading config /nonexistent/config.toml", false},
		{"unknown config key", []string{"--config", badConfig, "info"}, 1, "unknown key driver_root", false},
		{"bad format", []string{"--gpus", "sim:h100x1", "--driver-root", root, "cdi", "generate", "--format", "xml"}, 2, `--format "xml": use yaml or json`, false},
		{"bad capability", []string{"--gpus", "sim:h100x1", "--driver-root", root, "cdi", "generate", "--capabilities", "compute,gpu"}, 2, `unknown driver capability "gpu"`, false},
		{"unknown flag", []string{"cdi", "generate", "--outptu", "x"}, 2, "flag provided but not defined: -outptu", false},
		{"unknown command", []string{"frobnicate"}, 2, `unknown command "frobnicate"`, false},
		{"relative driver root", []string{"--driver-root", "run/nvidia", "info"}, 1, `key driver-root: "run/nvidia" is not an absolute path`, false},
		{"good control", []string{"--gpus", "sim:h100x1", "--driver-root", root, "cdi", "generate"}, 0, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "spec.yaml")
			args := tt.args
			if len(args) >= 2 && args[len(args)-1] == "generate" || strings.Contains(strings.Join(args, " "), "cdi generate") {
				args = append(append([]string(nil), args...), "--output", out)
			}
			_, errOut, code := run(args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d; stderr: %s", code, tt.code, errOut)
			}
			if tt.wantErr != "" && !strings.Contains(errOut, tt.wantErr) {
				t.Errorf("stderr %q lacks %q", errOut, tt.wantErr)
			}
			if tt.code != 0 {
				lines := strings.Split(strings.TrimSpace(errOut), "\n")
				last := lines[len(lines)-1]
				if tt.code == 1 && !strings.HasPrefix(last, "gantry") {
					t.Errorf("error is not one line starting with gantry: %q", errOut)
				}
			}
			_, statErr := os.Stat(out)
			if exists := statErr == nil; exists != tt.produces {
				t.Errorf("output file exists = %v, want %v", exists, tt.produces)
			}
			entries, _ := os.ReadDir(filepath.Dir(out))
			for _, e := range entries {
				if strings.HasSuffix(e.Name(), ".tmp") {
					t.Errorf("temporary file left behind: %s", e.Name())
				}
			}
		})
	}
	// A corrupt ld.so.cache must not crash discovery, and must be reported.
	_, errOut, code := run("--gpus", "sim:h100x1", "--driver-root", corrupt, "list")
	if code != 0 && !strings.Contains(errOut, "ld.so.cache") {
		t.Errorf("corrupt ld.so.cache: exit %d, stderr %q does not name the cache", code, errOut)
	}
	if code == 0 && !strings.Contains(errOut, "ld.so.cache") {
		t.Errorf("corrupt ld.so.cache: no warning on stderr (%q)", errOut)
	}
}

func TestHelp(t *testing.T) {
	out, _, code := run("--help")
	if code != 0 || !strings.Contains(out, "cdi generate") || !strings.Contains(out, "--gpus nvml|sim:PROFILE|sim:FILE") {
		t.Fatalf("--help exit %d:\n%s", code, out)
	}
	out, _, code = run("cdi", "generate", "--help")
	if code != 0 || !strings.Contains(out, "-output") || !strings.Contains(out, "podman run --device nvidia.com/gpu=0") {
		t.Fatalf("cdi generate --help exit %d:\n%s", code, out)
	}
	out, _, code = run("config", "default")
	if code != 0 || !strings.Contains(out, `gpus = 'nvml'`) && !strings.Contains(out, `gpus = "nvml"`) {
		t.Fatalf("config default:\n%s", out)
	}
}

func TestSimDriverRoot(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	dir := filepath.Join(t.TempDir(), "drv")
	out, errOut, code := run("--gpus", "sim:h100x1", "sim", "driver-root", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "580.159.04") || !strings.Contains(out, "1 GPUs") {
		t.Errorf("output: %s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "etc/ld.so.cache")); err != nil {
		t.Errorf("no ld.so.cache: %v", err)
	}
	_, _, code = run("sim", "driver-root")
	if code != 2 {
		t.Errorf("missing DIR: exit %d, want 2", code)
	}
}

// cdi generate's hooks run the gantry-cdi-hook beside gantry, else
// /usr/bin's; with neither, it refuses in one line naming the file and the
// fix, rather than write a spec whose every container would fail.
func TestCDIHookPath(t *testing.T) {
	root := fakeRoot(t)
	saved := cdicmd.Executable
	t.Cleanup(func() { cdicmd.Executable = saved })
	g := []string{"--gpus", "sim:h100x1", "--driver-root", root, "cdi", "generate", "--format", "json"}
	hooks := func(out string) []string {
		var spec struct {
			ContainerEdits struct {
				Hooks []struct {
					Path string
					Args []string
					Env  []string
				}
			}
		}
		if err := json.Unmarshal([]byte(out), &spec); err != nil {
			t.Fatalf("%v: %.200s", err, out)
		}
		var got []string
		for _, h := range spec.ContainerEdits.Hooks {
			got = append(got, h.Path+" "+strings.Join(h.Args[:2], " ")+" env="+strings.Join(h.Env, ","))
		}
		return got
	}

	dir := t.TempDir()
	cdicmd.Executable = func() (string, error) { return filepath.Join(dir, "gantry"), nil }
	hook := filepath.Join(dir, cdicmd.HookName)
	if err := os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run(g...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	env := " env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	want := []string{hook + " gantry-cdi-hook create-symlinks" + env, hook + " gantry-cdi-hook update-ldcache" + env}
	if got := hooks(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("hooks\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// cdi.hook-path naming the gantry CLI: the old form, gantry hook ...
	cfg := filepath.Join(t.TempDir(), "gantry.toml")
	if err := os.WriteFile(cfg, []byte("[cdi]\nhook-path = \"/usr/bin/gantry\"\n"+cacheTOML), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = run(append([]string{"--config", cfg}, g...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if got := hooks(out); len(got) != 2 || got[0] != "/usr/bin/gantry gantry hook"+env {
		t.Errorf("hooks with cdi.hook-path = /usr/bin/gantry: %q", got)
	}

	if _, err := os.Stat(cdicmd.SystemHookPath); err == nil {
		t.Skipf("%s exists on this machine: cannot test its absence", cdicmd.SystemHookPath)
	}
	if err := os.Remove(hook); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = run(g...)
	if code != 1 || out != "" || strings.Count(errOut, "\n") != 1 ||
		!strings.Contains(errOut, hook) || !strings.Contains(errOut, cdicmd.SystemHookPath) ||
		!strings.Contains(errOut, "make install") || !strings.Contains(errOut, "cdi.hook-path") {
		t.Errorf("without a hook binary: exit %d, stdout %.100q, stderr %q; want one line naming %s, %s and the fixes", code, out, errOut, hook, cdicmd.SystemHookPath)
	}
}

// The hooks as a runtime runs them: state on stdin, bundle on disk.
func TestHookCommands(t *testing.T) {
	bundle := t.TempDir()
	os.MkdirAll(filepath.Join(bundle, "rootfs/etc"), 0o755)
	os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.0.2","root":{"path":"rootfs"}}`), 0o644)
	stateFile := filepath.Join(t.TempDir(), "state.json")
	os.WriteFile(stateFile, []byte(`{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":1,"bundle":"`+bundle+`"}`), 0o644)
	old := stdin
	defer func() { stdin = old }()
	stdin = func() *os.File { f, _ := os.Open(stateFile); return f }

	_, errOut, code := run("hook", "create-symlinks", "--link", "libcuda.so.580.159.04::/usr/lib/x86_64-linux-gnu/libcuda.so.1", "--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so")
	if code != 0 {
		t.Fatalf("create-symlinks exit %d: %s", code, errOut)
	}
	if target, err := os.Readlink(filepath.Join(bundle, "rootfs/usr/lib/x86_64-linux-gnu/libcuda.so.1")); err != nil || target != "libcuda.so.580.159.04" {
		t.Fatalf("link = %q, %v", target, err)
	}
	_, errOut, code = run("hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu")
	if code != 0 {
		t.Fatalf("update-ldcache exit %d: %s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(bundle, "rootfs/etc/ld.so.cache")); err != nil {
		t.Fatalf("no cache written: %v", err)
	}
	if _, errOut, code = run("hook", "create-symlinks", "--link", "nolink"); code != 2 || !strings.Contains(errOut, "TARGET::LINK") {
		t.Fatalf("bad --link: exit %d, %s", code, errOut)
	}
	stdin = func() *os.File { f, _ := os.Open(os.DevNull); return f }
	if _, errOut, code = run("hook", "update-ldcache", "--folder", "/x"); code != 1 || !strings.Contains(errOut, "container state on stdin") {
		t.Fatalf("no state: exit %d, %s", code, errOut)
	}
}

// A command group without a subcommand lists the group instead of calling
// it an unknown command.
func TestCommandGroups(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"cdi", "--help"}, 0, "cdi generate"},
		{[]string{"runtime", "-h"}, 0, "runtime configure"},
		{[]string{"hook"}, 2, "hook update-ldcache"},
		{[]string{"nonsense"}, 2, `unknown command "nonsense"`},
	} {
		var out, errb strings.Builder
		code := Main(tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.want) {
			t.Errorf("gantry %q: exit %d, output %q; want exit %d and %q", tc.args, code, out.String()+errb.String(), tc.code, tc.want)
		}
	}
}

// A mistyped command, subcommand or flag is answered with the closest
// one, and each suggestion is a command line gantry accepts.
func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    string
		suggest []string // the suggested command line, run to see it accepted
	}{
		{[]string{"cdi", "generat"}, `unknown subcommand "generat" (did you mean "gantry cdi generate"?)`, []string{"cdi", "generate", "--help"}},
		{[]string{"cdi", "lsit"}, `(did you mean "gantry cdi list"?)`, []string{"cdi", "list", "--help"}},
		{[]string{"-v"}, `unknown flag "-v" (did you mean "--version"?)`, []string{"--version"}},
		{[]string{"infp"}, `unknown command "infp" (did you mean "info"?)`, []string{"info", "--help"}},
		{[]string{"--gpus", "sim:h100x8", "doctr"}, `(did you mean "doctor"?)`, []string{"doctor", "--help"}},
		{[]string{"runtime", "configur"}, `(did you mean "gantry runtime configure"?)`, []string{"runtime", "configure", "--help"}},
	} {
		var out, errb strings.Builder
		if code := Main(tc.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("gantry %q: exit %d, stderr %q; want exit 2 and %q", tc.args, code, errb.String(), tc.want)
		}
		out.Reset()
		errb.Reset()
		if code := Main(tc.suggest, &out, &errb); code != 0 {
			t.Errorf("the suggestion gantry %q: exit %d: %s", tc.suggest, code, errb.String())
		}
	}
	// Nothing near: no guess.
	var out, errb strings.Builder
	if Main([]string{"frobnicate"}, &out, &errb); strings.Contains(errb.String(), "did you mean") {
		t.Errorf("gantry frobnicate: %q guesses", errb.String())
	}
	for _, tc := range []struct{ word, want string }{
		{"generat", "generate"}, {"lsit", "list"}, {"v", "version"}, {"x", ""}, {"conifg", "config"}, {"d", ""},
	} {
		if got := closest(tc.word, []string{"generate", "list", "version", "config", "debug", "driver-root", "dev-root"}); got != tc.want {
			t.Errorf("closest(%q) = %q, want %q", tc.word, got, tc.want)
		}
	}
}

// --debug says what cdi generate decided and why, one line each: the
// request, the driver, each GPU, each spec device, node, mount and hook.
func TestCDIGenerateDebug(t *testing.T) {
	root := fakeRoot(t)
	out := filepath.Join(t.TempDir(), "nvidia.yaml")
	_, errOut, code := run("--debug", "--gpus", "sim:h100x8", "--driver-root", root, "cdi", "generate",
		"--hook-path", "/usr/bin/gantry-cdi-hook", "--output", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	sys, err := sim.Load("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"msg=request kind=nvidia.com/gpu devices=all", "msg=driver version=580.159.04",
		"msg=\"spec device\" name=\"nvidia.com/gpu=all\"", "msg=node path=/dev/nvidiactl", "msg=mount hostPath=" + root,
		"libcuda.so.", "msg=hook hookName=createContainer path=/usr/bin/gantry-cdi-hook"}
	for _, d := range sys.Devices {
		want = append(want, "msg=gpu index="+strconv.Itoa(d.Index)+" uuid="+d.UUID)
	}
	for _, w := range want {
		if !strings.Contains(errOut, w) {
			t.Errorf("--debug output lacks %q:\n%s", w, errOut)
		}
	}
	// Without --debug: only the note naming the file.
	if _, errOut, _ := run("--gpus", "sim:h100x8", "--driver-root", root, "cdi", "generate",
		"--hook-path", "/usr/bin/gantry-cdi-hook", "--output", out); strings.Contains(errOut, "level=DEBUG") {
		t.Errorf("debug lines without --debug: %s", errOut)
	}
}
