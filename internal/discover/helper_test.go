package discover

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/gpu/nvml"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

// TestMain lets the test binary answer HelperCommand as gantry does (its
// Main hands the command to HelperMain), so the tests below run the real
// helper in a separate process.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == HelperCommand {
		os.Exit(HelperMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func testBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return self
}

// Every field of every simulated system (MIG devices, NVLinks, NUMA nodes)
// comes back through the helper as the helper saw it.
func TestHelperRoundTrip(t *testing.T) {
	bin := testBinary(t)
	for _, p := range sim.Profiles() {
		for _, light := range []bool{false, true} {
			c := config.Default()
			c.GPUs = "sim:" + p
			got, err := viaHelper(bin, c, light)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			want, err := sim.Load(p)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s light=%v through the helper:\n%+v\nwant\n%+v", p, light, got, want)
			}
		}
	}
}

// NVML's answer through the helper is the in-process answer: the same
// GPUs on a GPU host, the same error class and words elsewhere.
func TestHelperNVML(t *testing.T) {
	c := config.Default()
	got, err := viaHelper(testBinary(t), c, true)
	want, werr := nvml.Discover(nvml.Options{DriverRoot: "/", Light: true})
	if werr != nil {
		if err == nil || err.Error() != werr.Error() {
			t.Fatalf("helper error %v, want %v", err, werr)
		}
		for _, kind := range []error{nvml.ErrNoNVML, nvml.ErrDriverNotLoaded} {
			if errors.Is(err, kind) != errors.Is(werr, kind) {
				t.Errorf("helper error %v: errors.Is(%v) = %v, in process %v", err, kind, errors.Is(err, kind), errors.Is(werr, kind))
			}
		}
		if !errors.Is(err, nvml.ErrNoNVML) && !errors.Is(err, nvml.ErrDriverNotLoaded) {
			t.Errorf("helper error %v wraps neither ErrNoNVML nor ErrDriverNotLoaded", err)
		}
		return
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("through the helper %+v, %v; in process %+v", got, err, want)
	}
}

// The helper runs with PATH and LD_LIBRARY_PATH only: GANTRY_CONFIG and
// the rest of the caller's environment stay out.
func TestHelperEnvironment(t *testing.T) {
	dir := t.TempDir()
	helper := filepath.Join(dir, "gantry")
	script := "#!/bin/sh\nprintf '{\"error\":\"%s\"}' \"$(env | grep -v '^PWD=' | sort | tr '\\n' ' ')\"\n"
	if err := os.WriteFile(helper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GANTRY_CONFIG", "/etc/hostile.toml")
	t.Setenv("LD_LIBRARY_PATH", "/opt/nvidia/lib")
	_, err := viaHelper(helper, config.Default(), false)
	want := "LD_LIBRARY_PATH=/opt/nvidia/lib PATH=" + helperEnvPath + " "
	if err == nil || err.Error() != want {
		t.Fatalf("the helper's environment: %v, want %q", err, want)
	}
}

func TestHelperNoAnswer(t *testing.T) {
	dir := t.TempDir()
	helper := filepath.Join(dir, "gantry")
	if err := os.WriteFile(helper, []byte("#!/bin/sh\necho 'gantry: unknown command' >&2\nexit 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := viaHelper(helper, config.Default(), false)
	if err == nil || !strings.Contains(err.Error(), "gave no answer: gantry: unknown command") || !strings.Contains(err.Error(), helper) {
		t.Fatalf("a helper without the command: %v", err)
	}
	_, err = viaHelper(filepath.Join(dir, "missing"), config.Default(), false)
	if err == nil || !strings.Contains(err.Error(), "runtime.gantry-path") {
		t.Fatalf("a missing helper: %v", err)
	}
}

func TestHelperPath(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "gantry-runtime")
	c := config.Default()

	c.Runtime.GantryPath = filepath.Join(dir, "nowhere")
	if _, err := helperPath(c, self); !errors.Is(err, nvml.ErrNoNVML) || !strings.Contains(err.Error(), "runtime.gantry-path "+c.Runtime.GantryPath) {
		t.Errorf("a runtime.gantry-path that does not exist: %v", err)
	}
	c.Runtime.GantryPath = ""
	if _, err := os.Stat(DefaultHelperPath); err == nil {
		t.Logf("%s exists here: not checking the error for no gantry at all", DefaultHelperPath)
	} else if _, err := helperPath(c, self); !errors.Is(err, nvml.ErrNoNVML) ||
		!strings.Contains(err.Error(), filepath.Join(dir, "gantry")+" nor "+DefaultHelperPath) || !strings.Contains(err.Error(), "runtime.gantry-path") {
		t.Errorf("no gantry anywhere: %v", err)
	}
	beside := filepath.Join(dir, "gantry")
	if err := os.WriteFile(beside, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := helperPath(c, self); err == nil && p == beside {
		t.Errorf("a gantry beside that is not executable was chosen")
	}
	if err := os.Chmod(beside, 0o755); err != nil {
		t.Fatal(err)
	}
	if p, err := helperPath(c, self); err != nil || p != beside {
		t.Errorf("helperPath = %q, %v; want %s", p, err, beside)
	}
	c.Runtime.GantryPath = testBinary(t)
	if p, err := helperPath(c, self); err != nil || p != c.Runtime.GantryPath {
		t.Errorf("helperPath with runtime.gantry-path = %q, %v", p, err)
	}
}
