package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/containerhook"
)

// argvEnv names the file this test binary writes its argv (JSON) and
// environment's PATH to when it stands in for the gantry binary.
const argvEnv = "GANTRY_TEST_ARGV_FILE"

// recordArgv is the test binary standing in for gantry: it writes its
// argv to the file in argvEnv and exits 3 (called from TestMain).
func recordArgv() {
	if f := os.Getenv(argvEnv); f != "" {
		b, _ := json.Marshal(os.Args)
		os.WriteFile(f, b, 0o644)
		os.WriteFile(f+".env", []byte(strings.Join(containerhook.LoaderVars(os.Environ()), " ")), 0o644)
		os.Exit(3)
	}
}

// gantry-runtime run as nvidia-ctk, as make install links it: cdi list and
// cdi generate are answered by gantry-runtime itself; any other command
// line (help included) runs the gantry beside it, under the name
// nvidia-ctk and with the same arguments; without a gantry, one line says
// what is missing.
func TestNVIDIACTKExecsGantry(t *testing.T) {
	dir := t.TempDir()
	rt := filepath.Join(dir, "gantry-runtime")
	if out, err := exec.Command("go", "build", "-o", rt, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctk := filepath.Join(dir, "nvidia-ctk")
	if err := os.Symlink("gantry-runtime", ctk); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	gantry := filepath.Join(dir, "gantry")
	if err := os.Symlink(self, gantry); err != nil {
		t.Fatal(err)
	}
	argvFile := filepath.Join(dir, "argv.json")
	run := func(path string, args ...string) (string, int, []string) {
		t.Helper()
		os.Remove(argvFile)
		cmd := exec.Command(ctk, args...)
		cmd.Env = append(os.Environ(), argvEnv+"="+argvFile, "GANTRY_CONFIG=/dev/null", "PATH="+path)
		var e bytes.Buffer
		cmd.Stderr = &e
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		var argv []string
		if b, err := os.ReadFile(argvFile); err == nil {
			if err := json.Unmarshal(b, &argv); err != nil {
				t.Fatal(err)
			}
		}
		return e.String(), code, argv
	}
	for _, args := range [][]string{
		{"runtime", "configure", "--runtime=docker", "--dry-run"},
		{"--help"},
		{"cdi", "generate", "--help"},
		{"--debug", "info"},
	} {
		_, code, argv := run("/usr/bin:/bin", args...)
		if want := append([]string{"nvidia-ctk"}, args...); code != 3 || !slices.Equal(argv, want) {
			t.Errorf("nvidia-ctk %q: exit %d, gantry ran with %q; want exit 3 and %q", args, code, argv, want)
		}
	}

	// What gantry-runtime hands to the dynamically linked gantry goes
	// without the loader's variables (a hook without env on runc 1.1.5 is
	// handed the image's), and nvidia-ctk hook after global flags is served
	// here, never by gantry. Review of sec1: both reached gantry.
	t.Setenv("LD_LIBRARY_PATH", "/nonexistent")
	t.Setenv("GCONV_PATH", "/nonexistent")
	if _, code, argv := run("/usr/bin:/bin", "--debug", "info"); code != 3 || len(argv) == 0 {
		t.Errorf("nvidia-ctk --debug info with loader variables: exit %d, argv %q", code, argv)
	} else if b, err := os.ReadFile(argvFile + ".env"); err != nil || len(b) != 0 {
		t.Errorf("gantry ran with the loader's variables %q (%v)", b, err)
	}
	for _, args := range [][]string{{"--debug", "hook", "update-ldcache"}, {"-d", "--quiet", "hook", "create-symlinks"}} {
		if stderr, code, argv := run("/usr/bin:/bin", args...); argv != nil || code == 0 || code == 3 {
			t.Errorf("nvidia-ctk %q: exit %d, stderr %q, gantry ran with %q; want gantry-runtime's own hook", args, code, stderr, argv)
		}
	}
	os.Unsetenv("LD_LIBRARY_PATH")
	os.Unsetenv("GCONV_PATH")

	empty := t.TempDir()
	stderr, code, argv := run("/usr/bin:/bin", "cdi", "list", "--spec-dir="+empty)
	if argv != nil || code != 0 || !strings.HasPrefix(stderr, "Found 0 CDI devices (no CDI devices in "+empty) {
		t.Errorf("cdi list: exit %d, stderr %q, gantry ran with %q; want gantry-runtime's own answer", code, stderr, argv)
	}
	stderr, code, argv = run("/usr/bin:/bin", "cdi", "generate", "--driver-root="+empty)
	if argv != nil || code != 1 || !strings.HasPrefix(stderr, "nvidia-ctk cdi generate: ") {
		t.Errorf("cdi generate: exit %d, stderr %q, gantry ran with %q; want gantry-runtime's own answer", code, stderr, argv)
	}

	// No gantry beside it nor on $PATH.
	os.Remove(gantry)
	stderr, code, argv = run(empty, "info")
	if argv != nil || code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, gantry) || !strings.Contains(stderr, "make install") {
		t.Errorf("without gantry: exit %d, stderr %q, argv %q; want one line naming %s and the fix", code, stderr, argv, gantry)
	}
	// One on $PATH.
	pathDir := t.TempDir()
	if err := os.Symlink(self, filepath.Join(pathDir, "gantry")); err != nil {
		t.Fatal(err)
	}
	if _, code, argv := run(empty+":"+pathDir, "info"); code != 3 || !slices.Equal(argv, []string{"nvidia-ctk", "info"}) {
		t.Errorf("gantry on $PATH: exit %d, argv %q", code, argv)
	}
}
