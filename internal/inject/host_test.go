package inject

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gantry-gpu/gantry/internal/config"
)

// The GPU list is cached only while it can be told unchanged: the same
// GPUs under /proc/driver/nvidia/gpus and no MIG instances anywhere.
func TestGPUKey(t *testing.T) {
	proc := t.TempDir()
	mk := func(p string) {
		if err := os.MkdirAll(filepath.Join(proc, "driver/nvidia", p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	nvml := config.Default()
	if k := gpuKey(nvml, proc); k != "" {
		t.Errorf("no GPUs: key %q, want none", k)
	}
	mk("gpus/0000:19:00.0")
	mk("gpus/0000:3b:00.0")
	mk("capabilities/gpu0/mig")
	mk("capabilities/gpu1")
	if k := gpuKey(nvml, proc); k != "0000:19:00.0,0000:3b:00.0" {
		t.Errorf("key %q", k)
	}
	sim := nvml
	sim.GPUs = "sim:h100x8"
	if k := gpuKey(sim, proc); k != "" {
		t.Errorf("simulated GPUs: key %q, want none", k)
	}
	mk("capabilities/gpu0/mig/gi1")
	if k := gpuKey(nvml, proc); k != "" {
		t.Errorf("MIG instances: key %q, want none", k)
	}
}
