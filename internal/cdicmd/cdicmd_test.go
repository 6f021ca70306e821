package cdicmd_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/cdicmd"
	"github.com/gantry-gpu/gantry/internal/cli"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// setup builds a fake driver root, points $GANTRY_CONFIG at a file that
// simulates 8 H100s, and places the running binary in a directory with a
// gantry-cdi-hook (the default hook path). It returns the driver root.
func setup(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot build the fake driver root (make deps installs it)")
	}
	root := filepath.Join(t.TempDir(), "driver")
	if _, err := fakedriver.Build(root, fakedriver.Options{Version: "580.159.04", GPUs: 8, DeviceNodes: true}); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "gantry.toml")
	conf := "gpus = \"sim:h100x8\"\n\n[runtime]\ncache-dir = \"" + t.TempDir() + "\"\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GANTRY_CONFIG", cfg)
	exeDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(exeDir, cdicmd.HookName), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	saved := cdicmd.Executable
	t.Cleanup(func() { cdicmd.Executable = saved })
	cdicmd.Executable = func() (string, error) { return filepath.Join(exeDir, "gantry-runtime"), nil }
	return root
}

type result struct {
	stdout, stderr string
	code           int
	file           string // the --output file's content, when there is one
}

func lean(t *testing.T, output string, args ...string) result {
	t.Helper()
	var o, e bytes.Buffer
	code, served := cdicmd.Lean(args, &o, &e)
	if !served {
		t.Fatalf("Lean(%q) handed the command to gantry", args)
	}
	return result{o.String(), e.String(), code, readOutput(output)}
}

func full(output string, args ...string) result {
	var o, e bytes.Buffer
	code := cli.NVIDIACTKMain(args, &o, &e)
	return result{o.String(), e.String(), code, readOutput(output)}
}

func readOutput(p string) string {
	if p == "" {
		return ""
	}
	b, _ := os.ReadFile(p)
	os.Remove(p)
	return string(b)
}

// The lean nvidia-ctk (gantry-runtime's) answers cdi generate and cdi list
// exactly as the gantry binary's nvidia-ctk does: the same spec byte for
// byte, the same messages and exit codes, for good and bad command lines;
// and the spec is gantry cdi generate's.
func TestLeanSameAsGantry(t *testing.T) {
	root := setup(t)
	specDir := t.TempDir()
	out := filepath.Join(t.TempDir(), "cdi", "nvidia.yaml")
	if r := lean(t, "", "cdi", "generate", "--driver-root="+root, "--output="+filepath.Join(specDir, "nvidia.yaml")); r.code != 0 {
		t.Fatalf("cdi generate: exit %d: %s", r.code, r.stderr)
	}
	cases := []struct {
		args   []string
		output string
		code   int
	}{
		{[]string{"cdi", "generate", "--driver-root=" + root}, "", 0},
		{[]string{"--quiet", "cdi", "generate", "--driver-root", root, "--format=json"}, "", 0},
		{[]string{"cdi", "generate", "--driver-root=" + root, "--device-id=0,3", "--device-id", "GPU-2", "--no-all-device", "--vendor=example.com", "--device-name-strategy=uuid"}, "", 2},
		{[]string{"cdi", "generate", "--driver-root=" + root, "--device-id=0,3", "--no-all-device", "--vendor=example.com", "--class=accel", "--nvidia-cdi-hook-path=/usr/bin/nvidia-cdi-hook"}, "", 0},
		{[]string{"-d", "cdi", "generate", "--driver-root=" + root, "--output=" + out}, out, 0},
		{[]string{"cdi", "generate", "--driver-root=" + root, "--output=" + out, "--format=json"}, out, 0},
		{[]string{"cdi", "generate", "--driver-root=" + root, "--output=" + out + ".txt"}, "", 1},
		{[]string{"cdi", "generate", "--driver-root=" + root, "--mode=csv"}, "", 2},
		{[]string{"cdi", "generate", "--driver-root=" + root, "--mode=imex"}, "", 1},
		{[]string{"cdi", "generate", "--driver-root=" + root, "--device-id=99"}, "", 2},
		{[]string{"cdi", "generate", "--driver-root=" + root, "--library-search-path=opt/lib"}, "", 2},
		{[]string{"cdi", "generate", "--driver-root=" + root, "--csv.file=/etc/x.csv"}, "", 2},
		{[]string{"cdi", "generate", "--driver-root=" + root, "--bogus"}, "", 2},
		{[]string{"cdi", "generate", "--driver-root=" + root, "extra"}, "", 2},
		{[]string{"cdi", "generate", "--driver-root"}, "", 2},
		{[]string{"cdi", "generate", "--driver-root=relative/dir"}, "", 1},
		{[]string{"cdi", "generate", "--driver-root=" + filepath.Join(root, "none")}, "", 1},
		{[]string{"cdi", "list", "--spec-dir=" + specDir}, "", 0},
		{[]string{"cdi", "list", "--spec-dir", t.TempDir()}, "", 0}, // no spec: exit 0, as NVIDIA's
		{[]string{"--debug", "cdi", "list", "--spec-dir", specDir}, "", 0},
	}
	for _, tc := range cases {
		got := lean(t, tc.output, tc.args...)
		want := full(tc.output, tc.args...)
		if got.code != tc.code {
			t.Errorf("%q: exit %d, want %d: %s", tc.args, got.code, tc.code, got.stderr)
		}
		// --debug's log line carries the time.
		if strings.Contains(got.stderr, "level=DEBUG") {
			cut := func(s string) string { return regexp.MustCompile(`(?m)^time=\S+ `).ReplaceAllString(s, "") }
			got.stderr, want.stderr = cut(got.stderr), cut(want.stderr)
		}
		if got != want {
			t.Errorf("%q: lean and gantry's nvidia-ctk differ:\nlean: exit %d, stderr %q, stdout %.200q, file %.200q\nfull: exit %d, stderr %q, stdout %.200q, file %.200q",
				tc.args, got.code, got.stderr, got.stdout, got.file, want.code, want.stderr, want.stdout, want.file)
		}
		if tc.code == 0 && got.stdout == "" && got.file == "" && !strings.Contains(got.stderr, "Found 0 CDI devices") {
			t.Errorf("%q: no output", tc.args)
		}
	}

	// gantry cdi generate with the same flags: the same spec.
	var o, e bytes.Buffer
	if code := cli.Main([]string{"--driver-root", root, "cdi", "generate", "--device-id", "0,3", "--no-all-device", "--kind", "example.com/accel", "--hook-path", "/usr/bin/nvidia-cdi-hook"}, &o, &e); code != 0 {
		t.Fatalf("gantry cdi generate: exit %d: %s", code, e.String())
	}
	if r := lean(t, "", cases[3].args...); r.stdout != o.String() || !strings.Contains(r.stdout, "kind: example.com/accel") {
		t.Errorf("nvidia-ctk cdi generate and gantry cdi generate differ:\n%.300s\n---\n%.300s", r.stdout, o.String())
	}
}

// Everything but cdi generate and cdi list, and every request for help, is
// left to the gantry binary, with nothing printed.
func TestLeanHandsOver(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--help"},
		{"help"},
		{"--version"},
		{"-v", "cdi", "generate"},
		{"--config=/etc/nvidia-container-runtime/config.toml", "cdi", "generate"},
		{"--bogus", "cdi", "generate"},
		{"cdi"},
		{"cdi", "--help"},
		{"cdi", "transform", "root", "--from=/a", "--to=/"},
		{"cdi", "generate", "--help"},
		{"cdi", "generate", "--output=/tmp/x.yaml", "-h"},
		{"cdi", "list", "help"},
		{"runtime", "configure", "--runtime=docker"},
		{"info"},
		{"config", "default"},
		{"system", "create-device-nodes", "--control-devices"},
		{"hook", "create-symlinks", "--link", "a::b"},
		{"generate", "cdi"},
	} {
		var o, e bytes.Buffer
		code, served := cdicmd.Lean(args, &o, &e)
		if served || code != 0 || o.Len() != 0 || e.Len() != 0 {
			t.Errorf("Lean(%q) = %d, served %v, stdout %q, stderr %q; want it left to gantry", args, code, served, o.String(), e.String())
		}
	}
}

// GantryPath: the gantry beside the running binary, else the first on
// $PATH (absolute entries only), skipping files that are not executable;
// none is an error naming where it looked.
func TestGantryPath(t *testing.T) {
	saved := cdicmd.Executable
	t.Cleanup(func() { cdicmd.Executable = saved })
	exeDir, pathDir, emptyDir := t.TempDir(), t.TempDir(), t.TempDir()
	cdicmd.Executable = func() (string, error) { return filepath.Join(exeDir, "gantry-runtime"), nil }
	write := func(p string, mode os.FileMode) {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", "relative:"+emptyDir+":"+pathDir)
	if p, err := cdicmd.GantryPath(); err == nil || !strings.Contains(err.Error(), filepath.Join(exeDir, "gantry")) || !strings.Contains(err.Error(), "PATH") {
		t.Errorf("no gantry anywhere: %q, %v; want an error naming %s and $PATH", p, err, exeDir)
	}
	write(filepath.Join(pathDir, "gantry"), 0o755)
	write(filepath.Join(exeDir, "gantry"), 0o644) // not executable: skipped
	if p, err := cdicmd.GantryPath(); err != nil || p != filepath.Join(pathDir, "gantry") {
		t.Errorf("gantry on $PATH only: %q, %v", p, err)
	}
	os.Chmod(filepath.Join(exeDir, "gantry"), 0o755)
	if p, err := cdicmd.GantryPath(); err != nil || p != filepath.Join(exeDir, "gantry") {
		t.Errorf("gantry beside and on $PATH: %q, %v; want the one beside", p, err)
	}
}

// cdi generate reads the containers' inventory cache when it is current
// and fills it otherwise; a driver change the cache key sees (here the UVM
// node going away and coming back) is in the next spec.
func TestGenerateUsesCurrentCache(t *testing.T) {
	root := setup(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root: the fake driver's device nodes")
	}
	gen := func() string {
		t.Helper()
		r := lean(t, "", "cdi", "generate", "--driver-root="+root)
		if r.code != 0 {
			t.Fatalf("cdi generate: exit %d: %s", r.code, r.stderr)
		}
		return r.stdout
	}
	first := gen()
	if !strings.Contains(first, "/dev/nvidia-uvm") {
		t.Fatalf("spec without /dev/nvidia-uvm:\n%s", first)
	}
	if second := gen(); second != first {
		t.Errorf("a second generate from the cache differs:\n%s\nwant\n%s", second, first)
	}
	uvm := filepath.Join(root, "dev/nvidia-uvm")
	var st unix.Stat_t
	if err := unix.Stat(uvm, &st); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(uvm); err != nil {
		t.Fatal(err)
	}
	if s := gen(); strings.Contains(s, "path: /dev/nvidia-uvm\n") {
		t.Errorf("/dev/nvidia-uvm is gone but the spec still has it: a stale cache was used")
	}
	if err := unix.Mknod(uvm, unix.S_IFCHR|0o666, int(st.Rdev)); err != nil {
		t.Fatal(err)
	}
	if s := gen(); s != first {
		t.Errorf("after /dev/nvidia-uvm came back the spec differs from the first:\n%s", s)
	}
}
