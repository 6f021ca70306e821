package gpu

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// This file holds facts about NVIDIA hardware and its driver that both
// backends (and their consumers) need to agree on: how PCI addresses are
// written, which brand and architecture names exist, and how the kernel
// driver numbers the MIG capability device nodes.

// PCIAddress is a PCI function address: domain:bus:device.function.
type PCIAddress struct {
	Domain   uint32
	Bus      uint8
	Device   uint8
	Function uint8
}

// ErrBadPCIAddress is returned by ParsePCIAddress for text that is not a PCI address.
var ErrBadPCIAddress = errors.New("not a PCI address")

// ParsePCIAddress reads a PCI address in any of the forms the driver and the
// kernel use: NVML's "00000000:18:00.0", the kernel's "0000:18:00.0", or a
// bare "18:00.0" (domain 0). Hex digits may be either case.
func ParsePCIAddress(s string) (PCIAddress, error) {
	bad := func(why string) (PCIAddress, error) {
		return PCIAddress{}, fmt.Errorf("PCI address %q: %s (want domain:bus:device.function, e.g. 00000000:18:00.0): %w", s, why, ErrBadPCIAddress)
	}
	rest, fn, ok := strings.Cut(s, ".")
	if !ok {
		return bad("no .function")
	}
	parts := strings.Split(rest, ":")
	var domain string
	switch len(parts) {
	case 2:
		domain = "0"
	case 3:
		domain, parts = parts[0], parts[1:]
	default:
		return bad("wrong number of ':' separated fields")
	}
	d, err := parseHex(domain, 8, 32)
	if err != nil {
		return bad("domain " + err.Error())
	}
	b, err := parseHex(parts[0], 2, 8)
	if err != nil {
		return bad("bus " + err.Error())
	}
	dev, err := parseHex(parts[1], 2, 5)
	if err != nil {
		return bad("device " + err.Error())
	}
	f, err := parseHex(fn, 1, 3)
	if err != nil {
		return bad("function " + err.Error())
	}
	return PCIAddress{Domain: uint32(d), Bus: uint8(b), Device: uint8(dev), Function: uint8(f)}, nil
}

// parseHex parses 1..maxDigits hex digits that fit in bits bits.
func parseHex(s string, maxDigits, bits int) (uint64, error) {
	if s == "" || len(s) > maxDigits {
		return 0, fmt.Errorf("%q has %d hex digits, want 1 to %d", s, len(s), maxDigits)
	}
	v, err := strconv.ParseUint(s, 16, bits)
	if err != nil {
		return 0, fmt.Errorf("%q is not a %d-bit hex number", s, bits)
	}
	return v, nil
}

// String is NVML's form, "00000000:18:00.0", which Device.PCIBusID uses.
func (a PCIAddress) String() string {
	return fmt.Sprintf("%08X:%02X:%02X.%X", a.Domain, a.Bus, a.Device, a.Function)
}

// SysfsName is the kernel's form, "0000:18:00.0", the name of the device's
// directory under /sys/bus/pci/devices and /proc/driver/nvidia/gpus.
func (a PCIAddress) SysfsName() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.Domain, a.Bus, a.Device, a.Function)
}

// Compare orders addresses the way NVML enumerates GPUs: by domain, bus,
// device, function. It returns -1, 0 or +1.
func (a PCIAddress) Compare(b PCIAddress) int {
	x := uint64(a.Domain)<<24 | uint64(a.Bus)<<16 | uint64(a.Device)<<8 | uint64(a.Function)
	y := uint64(b.Domain)<<24 | uint64(b.Bus)<<16 | uint64(b.Device)<<8 | uint64(b.Function)
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// Brands are the brand names Device.Brand takes, in NVML's enum order, as the
// NVIDIA_REQUIRE_* "brand=" key spells them (CUDA images list e.g.
// brand=tesla, brand=nvidiartx, brand=vapps, brand=cloudgaming).
var Brands = []string{
	"unknown", "quadro", "tesla", "nvs", "grid", "geforce", "titan",
	"vapps", "vpc", "vcs", "vws", "cloudgaming", "quadrortx", "nvidiartx",
	"nvidia", "geforcertx", "titanrtx",
}

// IsBrand reports whether s is one of Brands.
func IsBrand(s string) bool {
	for _, b := range Brands {
		if s == b {
			return true
		}
	}
	return false
}

// ParseComputeCapability splits "major.minor" (e.g. "9.0") into numbers.
func ParseComputeCapability(s string) (major, minor int, err error) {
	maj, min, ok := strings.Cut(s, ".")
	if !ok || !digits(maj) || !digits(min) {
		return 0, 0, fmt.Errorf("compute capability %q: want major.minor, e.g. 9.0", s)
	}
	major, _ = strconv.Atoi(maj)
	minor, _ = strconv.Atoi(min)
	return major, minor, nil
}

// digits reports whether s is one or two decimal digits.
func digits(s string) bool {
	if len(s) == 0 || len(s) > 2 {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// ArchitectureOf names the GPU architecture of a compute capability, for when
// the driver does not say (older NVML, simulated GPUs): "Hopper" for 9.0.
// It returns "" for capabilities it does not know.
func ArchitectureOf(major, minor int) string {
	switch major {
	case 1:
		return "Tesla"
	case 2:
		return "Fermi"
	case 3:
		return "Kepler"
	case 5:
		return "Maxwell"
	case 6:
		return "Pascal"
	case 7:
		if minor >= 5 {
			return "Turing"
		}
		return "Volta"
	case 8:
		if minor == 9 {
			return "Ada Lovelace"
		}
		return "Ampere"
	case 9:
		return "Hopper"
	case 10, 11, 12:
		return "Blackwell"
	}
	return ""
}

// The kernel driver gives every MIG capability a fixed minor of the
// nvidia-caps character device, from one static table: minor 0 is the NVLink
// fabric-mgmt capability, 1 mig/config, 2 mig/monitor, then for each GPU minor
// 0..31 and each GPU instance 0..14 the instance's access file followed by the
// access files of its compute instances 0..7. /proc/driver/nvidia-caps/mig-minors
// prints the same table.
const (
	// MIGConfigCapMinor is the minor of /dev/nvidia-caps/nvidia-cap1 (mig/config).
	MIGConfigCapMinor = 1
	// MIGMonitorCapMinor is the minor of /dev/nvidia-caps/nvidia-cap2 (mig/monitor).
	MIGMonitorCapMinor = 2

	// MaxMIGGPUs, MaxGPUInstances and MaxComputeInstances bound the table.
	MaxMIGGPUs          = 32
	MaxGPUInstances     = 15
	MaxComputeInstances = 8

	migFirstGPUMinor = 3
	migGIStride      = 1 + MaxComputeInstances
	migGPUStride     = MaxGPUInstances * migGIStride
)

// MIGCapMinors returns the nvidia-caps minors of the access files for GPU
// instance gi and compute instance ci on the GPU with device minor gpuMinor
// (gpu<gpuMinor>/gi<gi>/access and gpu<gpuMinor>/gi<gi>/ci<ci>/access).
func MIGCapMinors(gpuMinor, gi, ci int) (giMinor, ciMinor int, err error) {
	if gpuMinor < 0 || gpuMinor >= MaxMIGGPUs || gi < 0 || gi >= MaxGPUInstances || ci < 0 || ci >= MaxComputeInstances {
		return 0, 0, fmt.Errorf("MIG capability gpu%d/gi%d/ci%d: the driver has capability minors only for GPU minors 0-%d, GPU instances 0-%d and compute instances 0-%d",
			gpuMinor, gi, ci, MaxMIGGPUs-1, MaxGPUInstances-1, MaxComputeInstances-1)
	}
	giMinor = migFirstGPUMinor + gpuMinor*migGPUStride + gi*migGIStride
	return giMinor, giMinor + 1 + ci, nil
}

// MIGCapPath is the device node of an nvidia-caps minor:
// /dev/nvidia-caps/nvidia-cap<minor>.
func MIGCapPath(minor int) string { return "/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(minor) }
