package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
)

// A registered gantry-runtime links no NVML and asks the gantry binary for
// MIG devices: without one to ask, the engine check fails when MIG
// instances exist, notes it otherwise, and is silent once gantry is beside
// it; a gantry-runtime that is the gantry binary itself needs none.
func TestRuntimeNVMLHelper(t *testing.T) {
	if _, err := os.Stat(discover.DefaultHelperPath); err == nil {
		t.Skip(discover.DefaultHelperPath + " exists here: every gantry-runtime finds it")
	}
	dir := t.TempDir()
	rt := filepath.Join(dir, "gantry-runtime")
	if err := os.WriteFile(rt, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	proc := t.TempDir()
	opts := Options{Proc: proc, Config: config.Default()}
	all := []registered{{Name: "nvidia", Program: rt}}
	judge := func() Check { return judgeRuntimes(opts, CheckDocker, "daemon.json", "configure", "reinstall", all) }

	if c := judge(); c.Status != Pass || !strings.Contains(c.Evidence, "containers given MIG devices would fail") || !strings.Contains(c.Evidence, "runtime.gantry-path") {
		t.Errorf("no gantry, no MIG: %s %q, want PASS with the note", c.Status, c.Evidence)
	}
	if err := os.MkdirAll(filepath.Join(proc, "driver/nvidia/capabilities/gpu0/mig/gi1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if c := judge(); c.Status != Fail || !strings.Contains(c.Evidence, "MIG instances exist") || !strings.Contains(c.Fix, "runtime.gantry-path") {
		t.Errorf("no gantry, MIG instances: %s %q (fix %q), want FAIL", c.Status, c.Evidence, c.Fix)
	}
	// The gantry binary installed as gantry-runtime (links NVML itself).
	full := filepath.Join(t.TempDir(), "gantry")
	if err := os.WriteFile(full, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "gantry-runtime")
	if err := os.Symlink(full, link); err != nil {
		t.Fatal(err)
	}
	all = []registered{{Name: "nvidia", Program: link}}
	if c := judge(); c.Status != Pass || strings.Contains(c.Evidence, "note") {
		t.Errorf("gantry as gantry-runtime: %s %q, want a plain PASS", c.Status, c.Evidence)
	}
	// gantry beside the static gantry-runtime.
	all = []registered{{Name: "nvidia", Program: rt}}
	if err := os.WriteFile(filepath.Join(dir, "gantry"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if c := judge(); c.Status != Pass || strings.Contains(c.Evidence, "note") {
		t.Errorf("gantry beside gantry-runtime: %s %q, want a plain PASS", c.Status, c.Evidence)
	}
}
