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

// A cache file is read only when it is ours: a regular file of this user,
// not writable by others, not oversized. Its paths become mounts.
func TestOpenCacheTrust(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, mode os.FileMode, size int) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if f := openCache(write("ok.json", 0o600, 10)); f == nil {
		t.Error("a 0600 cache of this user is not read")
	} else {
		f.Close()
	}
	for _, p := range []string{
		write("world.json", 0o666, 10),
		write("group.json", 0o620, 10),
		write("big.json", 0o600, maxCacheSize+1),
		dir,
	} {
		if f := openCache(p); f != nil {
			f.Close()
			t.Errorf("%s is read as a cache", p)
		}
	}
	other := write("other.json", 0o600, 10)
	if err := os.Chown(other, os.Geteuid()+1, -1); err != nil {
		t.Skipf("chown: %v", err)
	}
	if f := openCache(other); f != nil {
		f.Close()
		t.Error("another user's file is read as a cache")
	}
}
