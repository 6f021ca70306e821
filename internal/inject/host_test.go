package inject

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/driver"
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

// A cached inventory is dropped when what it lists changes while the
// driver version and ld.so.cache stay the same: /dev/nvidia-uvm appearing
// after the first container (the UVM module loaded later), a daemon's
// socket, a program installed by a package that runs no ldconfig.
func TestCacheFollowsNodesSocketsPrograms(t *testing.T) {
	cfg, _ := fakeDriverConfig(t, "h100x8")
	root := cfg.DriverRoot
	load := func(want inventorySource) *driver.Inventory {
		t.Helper()
		_, inv, _, src, err := loadHost(cfg, false)
		if err != nil {
			t.Fatal(err)
		}
		if src != want {
			t.Fatalf("inventory from %s, want %s", src, want)
		}
		return inv
	}
	has := func(files []driver.File, p string) bool {
		return slices.ContainsFunc(files, func(f driver.File) bool { return f.ContainerPath == p })
	}
	uvm := filepath.Join(root, "dev/nvidia-uvm")
	var st unix.Stat_t
	if err := unix.Stat(uvm, &st); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(uvm); err != nil {
		t.Fatal(err)
	}
	if has(load(fromDiscover).DeviceNodes, "/dev/nvidia-uvm") {
		t.Fatal("nvidia-uvm listed before it exists")
	}
	load(fromCache)
	// The UVM module is loaded: its node appears.
	if err := unix.Mknod(uvm, unix.S_IFCHR|0o666, int(st.Rdev)); err != nil {
		t.Fatal(err)
	}
	if !has(load(fromDiscover).DeviceNodes, "/dev/nvidia-uvm") {
		t.Error("nvidia-uvm missing after it appeared: the stale cache was used")
	}
	load(fromCache)
	// nvidia-persistenced starts.
	sock := filepath.Join(root, "run/nvidia-persistenced/socket")
	_ = os.Remove(sock)
	load(fromDiscover)
	load(fromCache)
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !has(load(fromDiscover).Sockets, "/run/nvidia-persistenced/socket") {
		t.Error("persistenced socket missing after it appeared")
	}
	// A package adds a driver program and runs no ldconfig.
	prog := filepath.Join(root, "usr/bin/nvidia-cuda-mps-server")
	_ = os.Remove(prog)
	load(fromDiscover)
	load(fromCache)
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !has(load(fromDiscover).Binaries, "/usr/bin/nvidia-cuda-mps-server") {
		t.Error("new program missing: the stale cache was used")
	}
	load(fromCache)
}
