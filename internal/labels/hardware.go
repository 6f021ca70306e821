package labels

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// Hardware answers what a gpu.System does not say but the labels need.
type Hardware interface {
	// MIGCapable says whether the GPU supports MIG (enabled or not).
	MIGCapable(d gpu.Device) (bool, error)
	// MIGAttributes describes a MIG device as NVML's device attributes do.
	MIGAttributes(parent gpu.Device, m gpu.MIGDevice) (MIGAttributes, error)
	// PCIClass is the GPU's 24-bit PCI class code (0x030200: 3D controller).
	PCIClass(d gpu.Device) (uint32, error)
}

// MIGAttributes are a MIG device's resources. A negative count means
// unknown; its label is then left out.
type MIGAttributes struct {
	Multiprocessors int
	GISlices        int
	CISlices        int
	CopyEngines     int
	Decoders        int
	Encoders        int
	JPEGs           int
	OFAs            int
	// MemoryMB is the device memory in MiB (NVML calls it MemorySizeMB).
	MemoryMB uint64
}

// Catalog is the Hardware of simulated GPUs and the fallback for real ones:
// MIG capability and MIG attributes from tables of NVIDIA's data-center GPUs,
// the PCI class from sysfs.
type Catalog struct {
	// SysfsRoot is where /sys is ("" means "/").
	SysfsRoot string
	// Simulated GPUs have no sysfs entries; they are in compute mode, as
	// the data-center GPUs the simulator models are.
	Simulated bool
}

// MIGCapable: MIG-enabled GPUs, and the compute capabilities of the
// data-center GPUs that have MIG (8.0 A100/A30, 9.0 H100/H200/GH200,
// 10.0 B200/GB200).
func (Catalog) MIGCapable(d gpu.Device) (bool, error) {
	if d.MIGEnabled {
		return true, nil
	}
	switch d.ComputeCapability {
	case "8.0", "9.0", "10.0":
		return true, nil
	}
	return false, nil
}

// MIGAttributes looks the profile up in the table of the GPU's
// architecture; the memory is the MIG device's own. For a profile the table
// does not know, only the slice counts (read from the profile name) are given.
func (Catalog) MIGAttributes(parent gpu.Device, m gpu.MIGDevice) (MIGAttributes, error) {
	gi, ci, base, err := parseProfile(m.Profile)
	if err != nil {
		return MIGAttributes{}, err
	}
	a, ok := lookupProfile(parent, base)
	if !ok {
		a = MIGAttributes{Multiprocessors: -1, CopyEngines: -1, Decoders: -1, Encoders: -1, JPEGs: -1, OFAs: -1}
	}
	a.GISlices, a.CISlices = gi, ci
	if ci != gi {
		// The tables hold whole GPU instances; the multiprocessor count of
		// a smaller compute instance is not in them.
		a.Multiprocessors = -1
	}
	a.MemoryMB = m.MemoryMiB
	return a, nil
}

// PCIClass reads /sys/bus/pci/devices/<address>/class.
func (c Catalog) PCIClass(d gpu.Device) (uint32, error) {
	addr, err := gpu.ParsePCIAddress(d.PCIBusID)
	if err != nil {
		return 0, fmt.Errorf("GPU %d: PCI bus id %q: %w", d.Index, d.PCIBusID, err)
	}
	root := c.SysfsRoot
	if root == "" {
		root = "/"
	}
	path := filepath.Join(root, "sys/bus/pci/devices", addr.SysfsName(), "class")
	if c.Simulated {
		return 0x030200, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(string(data)), "0x"), 16, 32)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a PCI class", path, data)
	}
	return uint32(v), nil
}

// ForSystem returns the Catalog suited to sys: simulated systems never read
// the host's sysfs.
func ForSystem(sys *gpu.System, sysfsRoot string) Catalog {
	if sys != nil && strings.HasPrefix(sys.Backend, "sim") {
		return Catalog{SysfsRoot: sysfsRoot, Simulated: true}
	}
	return Catalog{SysfsRoot: sysfsRoot}
}

// MachineType reads the machine type as GFD does, from DMI's product name
// (/sys/class/dmi/id/product_name under sysfsRoot); "" when unreadable, which
// Generate labels "unknown".
func MachineType(sysfsRoot string) string {
	if sysfsRoot == "" {
		sysfsRoot = "/"
	}
	data, err := os.ReadFile(filepath.Join(sysfsRoot, "sys/class/dmi/id/product_name"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// parseProfile reads "3g.20gb", "1c.3g.20gb" or "1g.10gb+me" (also with
// '.me' for '+me'): GPU instance slices, compute instance slices and the
// profile without the compute-instance part.
func parseProfile(p string) (gi, ci int, base string, err error) {
	p = strings.TrimPrefix(p, "MIG ")
	base = p
	rest := p
	if c, after, ok := strings.Cut(p, "c."); ok {
		if ci, err = strconv.Atoi(c); err != nil {
			return 0, 0, "", fmt.Errorf("MIG profile %q: bad compute instance slice count", p)
		}
		base, rest = after, after
	}
	g, _, ok := strings.Cut(rest, "g.")
	if !ok {
		return 0, 0, "", fmt.Errorf("MIG profile %q is not of the form <n>g.<m>gb", p)
	}
	if gi, err = strconv.Atoi(g); err != nil || gi < 1 {
		return 0, 0, "", fmt.Errorf("MIG profile %q: bad GPU instance slice count", p)
	}
	if ci == 0 {
		ci = gi
	}
	return gi, ci, strings.ReplaceAll(base, "+", "."), nil
}
