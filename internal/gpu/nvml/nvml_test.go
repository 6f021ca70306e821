//go:build cgo && !nonvml

package nvml

import (
	"errors"
	"regexp"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// discoverOrSkip runs Discover, skipping the test where this machine has no
// usable NVML.
func discoverOrSkip(tb testing.TB, opts Options) *gpu.System {
	tb.Helper()
	sys, err := Discover(opts)
	if errors.Is(err, ErrNoNVML) || errors.Is(err, ErrDriverNotLoaded) {
		tb.Skipf("no NVML here: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return sys
}

func TestDiscover(t *testing.T) {
	sys := discoverOrSkip(t, Options{})
	t.Logf("%s driver %s CUDA %s, %d GPUs", sys.Backend, sys.DriverVersion, sys.CUDADriverVersion, len(sys.Devices))
	if sys.Backend != "nvml" || !regexp.MustCompile(`^[0-9]+\.[0-9]+$`).MatchString(sys.CUDADriverVersion) || sys.DriverVersion == "" {
		t.Errorf("system %+v", sys)
	}
	uuid := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	for i, d := range sys.Devices {
		t.Logf("GPU %d: %+v", i, d)
		if d.Index != i || !uuid.MatchString(d.UUID) || len(d.PCIBusID) != 16 || d.Name == "" ||
			!gpu.IsBrand(d.Brand) || d.Architecture == "" || d.MemoryMiB == 0 || d.NUMANode < -1 {
			t.Errorf("GPU %d: %+v", i, d)
		}
		if _, _, err := gpu.ParseComputeCapability(d.ComputeCapability); err != nil {
			t.Errorf("GPU %d: %v", i, err)
		}
		for _, m := range d.MIGDevices {
			if m.Parent != i || m.Profile == "" || m.GICapMinor < 3 || m.CICapMinor <= m.GICapMinor {
				t.Errorf("MIG %s: %+v", m.Name(), m)
			}
		}
	}
	light := discoverOrSkip(t, Options{Light: true})
	for i, d := range light.Devices {
		if len(d.NVLinks) != 0 || d.UUID != sys.Devices[i].UUID {
			t.Errorf("light GPU %d: %+v", i, d)
		}
	}
	// Without MIG, the procfs fast path must see the same GPUs in the same order.
	fast, err := DiscoverProcfs("/proc")
	if errors.Is(err, ErrMIGNeedsNVML) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if fast.DriverVersion != sys.DriverVersion || len(fast.Devices) != len(sys.Devices) {
		t.Fatalf("procfs %+v, NVML %+v", fast, sys)
	}
	for i, d := range fast.Devices {
		n := sys.Devices[i]
		if d.UUID != n.UUID || d.Minor != n.Minor || d.PCIBusID != n.PCIBusID || d.Name != n.Name || d.NUMANode != n.NUMANode {
			t.Errorf("GPU %d: procfs %+v, NVML %+v", i, d, n)
		}
	}
}

// TestDiscoverNoNVML checks the message a user sees on a machine without the driver.
func TestDiscoverNoNVML(t *testing.T) {
	if _, err := Discover(Options{}); err == nil {
		t.Skip("NVML is installed here")
	}
	_, err := Discover(Options{DriverRoot: t.TempDir()})
	if errors.Is(err, ErrDriverNotLoaded) {
		t.Skipf("NVML is installed but the driver is not loaded: %v", err)
	}
	const want = "NVML (libnvidia-ml.so.1) not found: no NVIDIA driver is installed here, or it is under another driver root (driver-root in the Gantry configuration); " + gpu.SimulateAdvice
	if !errors.Is(err, ErrNoNVML) || err.Error() != want {
		t.Errorf("err = %v, want %q", err, want)
	}
}

// TestBrandName checks the mapping against gpu.Brands, which lists the
// names in NVML's enum order: a renumbered enum or a typo shows up here.
func TestBrandName(t *testing.T) {
	for i, want := range gpu.Brands {
		if got := brandName(nvml.BrandType(i)); got != want {
			t.Errorf("brandName(%d) = %q, want %q", i, got, want)
		}
	}
	if got := brandName(nvml.BRAND_NVIDIA_VGAMING); got != "cloudgaming" {
		t.Errorf("vGaming (same value as cloud gaming) = %q", got)
	}
	if got := brandName(nvml.BrandType(99)); got != "unknown" {
		t.Errorf("unknown enum = %q", got)
	}
	for a, want := range map[nvml.DeviceArchitecture]string{nvml.DEVICE_ARCH_HOPPER: "Hopper", nvml.DEVICE_ARCH_AMPERE: "Ampere", nvml.DEVICE_ARCH_BLACKWELL: "Blackwell", nvml.DEVICE_ARCH_UNKNOWN: ""} {
		if got := archName(a); got != want {
			t.Errorf("archName(%d) = %q, want %q", a, got, want)
		}
	}
}

func TestPCIAddressFromNVML(t *testing.T) {
	var p nvml.PciInfo
	for i, c := range "00000000:9D:00.0" {
		p.BusId[i] = int8(c)
	}
	if got := pciAddress(p).String(); got != "00000000:9D:00.0" {
		t.Errorf("from BusId: %s", got)
	}
	p = nvml.PciInfo{Domain: 1, Bus: 0x1b, Device: 2}
	if got := pciAddress(p).String(); got != "00000001:1B:02.0" {
		t.Errorf("from fields: %s", got)
	}
}

// BenchmarkDiscover measures a whole discovery, NVML load to unload: the
// cost a container create pays when it has no cached inventory.
func BenchmarkDiscover(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts Options
	}{{"light", Options{Light: true}}, {"full", Options{}}} {
		b.Run(bc.name, func(b *testing.B) {
			discoverOrSkip(b, bc.opts)
			for b.Loop() {
				if _, err := Discover(bc.opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDiscoverProcfs(b *testing.B) {
	if _, err := DiscoverProcfs("/proc"); err != nil {
		b.Skipf("no usable /proc/driver/nvidia: %v", err)
	}
	for b.Loop() {
		if _, err := DiscoverProcfs("/proc"); err != nil {
			b.Fatal(err)
		}
	}
}
