// Package editstest holds a hand-built GPU host (a system and a driver
// inventory) and real device nodes for it, shared by the tests of the
// packages that turn requests into container edits.
package editstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

// Device numbers used by the fixtures: the real nvidia major, and made-up
// majors for UVM and nvidia-caps (the kernel allocates those at load).
const (
	MajNvidia = 195
	MajUVM    = 507
	MajCaps   = 236
)

// System is two GPUs: 0 whole, 1 in MIG mode with two MIG devices.
func System() *gpu.System {
	return &gpu.System{
		Backend:           "test",
		DriverVersion:     "550.54.15",
		CUDADriverVersion: "12.4",
		Devices: []gpu.Device{
			{
				Index: 0, Minor: 0, UUID: "GPU-0aaaaaaa-1111-2222-3333-444444444444",
				PCIBusID: "00000000:18:00.0", Name: "NVIDIA H100 80GB HBM3", Brand: "nvidia",
				Architecture: "Hopper", ComputeCapability: "9.0",
			},
			{
				Index: 1, Minor: 1, UUID: "GPU-1bbbbbbb-1111-2222-3333-444444444444",
				PCIBusID: "00000000:2A:00.0", Name: "NVIDIA A100-SXM4-40GB", Brand: "nvidia",
				Architecture: "Ampere", ComputeCapability: "8.0", MIGEnabled: true,
				MIGDevices: []gpu.MIGDevice{
					{Index: 0, Parent: 1, UUID: "MIG-10000000-aaaa-bbbb-cccc-dddddddddddd", Profile: "3g.20gb",
						GPUInstance: 1, ComputeInstance: 0, GICapMinor: 147, CICapMinor: 148},
					{Index: 1, Parent: 1, UUID: "MIG-11111111-aaaa-bbbb-cccc-dddddddddddd", Profile: "3g.20gb",
						GPUInstance: 2, ComputeInstance: 0, GICapMinor: 156, CICapMinor: 157},
				},
			},
		},
	}
}

// Inventory is a driver under /run/nvidia/driver with files of several
// capabilities; Common does not touch the files, so none exist.
func Inventory() *driver.Inventory {
	const root = "/run/nvidia/driver"
	lib := func(name, soname string, c driver.Capability) driver.File {
		cp := "/usr/lib/x86_64-linux-gnu/" + name
		return driver.File{HostPath: root + cp, ContainerPath: cp, Kind: driver.KindLibrary, Capability: c, SONAME: soname}
	}
	file := func(cp string, k driver.FileKind, c driver.Capability) driver.File {
		return driver.File{HostPath: root + cp, ContainerPath: cp, Kind: k, Capability: c}
	}
	dev := func(cp string, major, minor int64) driver.File {
		return driver.File{HostPath: cp, ContainerPath: cp, Kind: driver.KindDevice, Major: major, Minor: minor}
	}
	return &driver.Inventory{
		Root:    root,
		Version: "550.54.15",
		Libraries: []driver.File{
			lib("libEGL_nvidia.so.550.54.15", "libEGL_nvidia.so.0", driver.Graphics),
			lib("libGLX_nvidia.so.550.54.15", "libGLX_nvidia.so.0", driver.Graphics),
			lib("libcuda.so.550.54.15", "libcuda.so.1", driver.Compute),
			lib("libnvidia-ml.so.550.54.15", "libnvidia-ml.so.1", driver.Utility),
			lib("libnvidia-opticalflow.so.550.54.15", "libnvidia-opticalflow.so.1", driver.Video),
			{HostPath: root + "/usr/lib/i386-linux-gnu/libcuda.so.550.54.15", ContainerPath: "/usr/lib/i386-linux-gnu/libcuda.so.550.54.15",
				Kind: driver.KindLibrary, Capability: driver.Compat32, SONAME: "libcuda.so.1"},
		},
		Binaries: []driver.File{
			file("/usr/bin/nvidia-cuda-mps-control", driver.KindBinary, driver.Compute),
			file("/usr/bin/nvidia-smi", driver.KindBinary, driver.Utility),
		},
		Sockets: []driver.File{
			file("/run/nvidia-persistenced/socket", driver.KindSocket, ""),
			file("/tmp/nvidia-mps", driver.KindSocket, ""),
		},
		Firmware: []driver.File{
			file("/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin", driver.KindFirmware, ""),
		},
		Configs: []driver.File{
			file("/usr/share/vulkan/icd.d/nvidia_icd.json", driver.KindConfig, driver.Graphics),
		},
		DeviceNodes: []driver.File{
			dev("/dev/nvidia-modeset", MajNvidia, 254),
			dev("/dev/nvidia-uvm", MajUVM, 0),
			dev("/dev/nvidia-uvm-tools", MajUVM, 1),
			dev("/dev/nvidiactl", MajNvidia, 255),
		},
	}
}

// MakeDevRoot creates real character device nodes for every GPU and MIG
// capability of sys (and the MIG config and monitor capabilities) under a temporary directory and returns it.
func MakeDevRoot(t testing.TB, sys *gpu.System) string {
	t.Helper()
	root := t.TempDir()
	nodes := map[string][2]uint32{
		"/dev/nvidia-caps/nvidia-cap1": {MajCaps, 1},
		"/dev/nvidia-caps/nvidia-cap2": {MajCaps, 2},
	}
	for _, d := range sys.Devices {
		nodes[d.DevicePath()] = [2]uint32{MajNvidia, uint32(d.Minor)}
		for _, m := range d.MIGDevices {
			for _, minor := range []int{m.GICapMinor, m.CICapMinor} {
				nodes[fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor)] = [2]uint32{MajCaps, uint32(minor)}
			}
		}
	}
	for p, mm := range nodes {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		err := unix.Mknod(full, unix.S_IFCHR|0o666, int(unix.Mkdev(mm[0], mm[1])))
		if errors.Is(err, unix.EPERM) {
			t.Skip("creating device nodes needs root (CAP_MKNOD); run the tests as root")
		}
		if err != nil {
			t.Fatalf("mknod %s: %v", full, err)
		}
	}
	return root
}
