package edits

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/request"
)

// ErrUnknownDevice is wrapped by errors for a device ID that names no GPU or
// MIG device of the host.
var ErrUnknownDevice = errors.New("unknown GPU device")

// Selected is one device a selection resolved to.
type Selected struct {
	// GPU is the physical GPU; for a MIG device, its parent.
	GPU gpu.Device
	// MIG is the MIG device, nil for a full GPU.
	MIG *gpu.MIGDevice
}

// Name is the canonical short name: the GPU index ("0") or "GPU:MIG" ("0:1").
func (s Selected) Name() string {
	if s.MIG != nil {
		return s.MIG.Name()
	}
	return strconv.Itoa(s.GPU.Index)
}

// UUID is the GPU or MIG UUID.
func (s Selected) UUID() string {
	if s.MIG != nil {
		return s.MIG.UUID
	}
	return s.GPU.UUID
}

// MIG capability minors of the global config and monitor capabilities
// (/proc/driver/nvidia-caps/mig-minors lists them as "config 1", "monitor 2").
const (
	migConfigMinor  = 1
	migMonitorMinor = 2
)

// ForDevices resolves sel against sys and returns the devices in the order
// given (duplicates removed) with the device nodes they need, stat'ed under
// devRoot. Void and None select nothing. An ID that matches no device gives
// an error wrapping ErrUnknownDevice that lists what the host has.
func ForDevices(sys *gpu.System, sel request.Selection, devRoot string) ([]Selected, *Edits, error) {
	selected, err := Resolve(sys, sel)
	if err != nil {
		return nil, nil, err
	}
	e, err := deviceEdits(selected, devRoot)
	if err != nil {
		return nil, nil, err
	}
	return selected, e, nil
}

// Resolve is ForDevices without touching the file system: it maps IDs to
// devices only.
func Resolve(sys *gpu.System, sel request.Selection) ([]Selected, error) {
	if sys == nil {
		sys = &gpu.System{}
	}
	switch sel.Mode {
	case request.Void, request.None:
		return nil, nil
	case request.All:
		return allDevices(sys), nil
	case request.List:
	default:
		return nil, fmt.Errorf("device selection mode %d: want void, none, all or a list", sel.Mode)
	}
	var out []Selected
	seen := map[string]bool{}
	add := func(s Selected) {
		if k := s.Name(); !seen[k] {
			seen[k] = true
			out = append(out, s)
		}
	}
	for _, id := range sel.IDs {
		id = strings.TrimSpace(id)
		if id == "" {
			continue
		}
		if strings.EqualFold(id, "all") {
			for _, s := range allDevices(sys) {
				add(s)
			}
			continue
		}
		s, ok := lookup(sys, id)
		if !ok {
			return nil, fmt.Errorf("%w %q on this host (have %s): use an index, a GPU or MIG UUID, a GPU:MIG pair or all",
				ErrUnknownDevice, id, inventoryLine(sys))
		}
		add(s)
	}
	return out, nil
}

// allDevices is every GPU followed by every MIG device, as "all" selects them.
func allDevices(sys *gpu.System) []Selected {
	var out []Selected
	for _, d := range sys.Devices {
		out = append(out, Selected{GPU: d})
	}
	for _, d := range sys.Devices {
		for j := range d.MIGDevices {
			m := d.MIGDevices[j]
			out = append(out, Selected{GPU: d, MIG: &m})
		}
	}
	return out
}

// lookup finds one device by index, GPU UUID, PCI bus id, "GPU:MIG" or MIG UUID.
func lookup(sys *gpu.System, id string) (Selected, bool) {
	switch {
	case hasPrefixFold(id, "GPU-"):
		for _, d := range sys.Devices {
			if strings.EqualFold(d.UUID, id) {
				return Selected{GPU: d}, true
			}
		}
		return Selected{}, false
	case hasPrefixFold(id, "MIG-"):
		for _, d := range sys.Devices {
			for j := range d.MIGDevices {
				if strings.EqualFold(d.MIGDevices[j].UUID, id) {
					m := d.MIGDevices[j]
					return Selected{GPU: d, MIG: &m}, true
				}
			}
		}
		return Selected{}, false
	}
	if bus, ok := normalizePCI(id); ok {
		for _, d := range sys.Devices {
			if b, ok := normalizePCI(d.PCIBusID); ok && b == bus {
				return Selected{GPU: d}, true
			}
		}
		return Selected{}, false
	}
	if g, m, ok := strings.Cut(id, ":"); ok {
		gi, err1 := parseIndex(g)
		mi, err2 := parseIndex(m)
		if err1 != nil || err2 != nil {
			return Selected{}, false
		}
		for _, d := range sys.Devices {
			if d.Index != gi {
				continue
			}
			for j := range d.MIGDevices {
				if d.MIGDevices[j].Index == mi {
					mm := d.MIGDevices[j]
					return Selected{GPU: d, MIG: &mm}, true
				}
			}
		}
		return Selected{}, false
	}
	i, err := parseIndex(id)
	if err != nil {
		return Selected{}, false
	}
	for _, d := range sys.Devices {
		if d.Index == i {
			return Selected{GPU: d}, true
		}
	}
	return Selected{}, false
}

// parseIndex accepts decimal digits only (no sign, no spaces).
func parseIndex(s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, strconv.ErrSyntax
	}
	n, err := strconv.ParseUint(s, 10, 31)
	return int(n), err
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// normalizePCI turns "domain:bus:device.function" (hex, leading zeros
// optional) into the 8:2:2.1 lower-case form, so "0:18:0.0" matches NVML's
// "00000000:18:00.0".
func normalizePCI(s string) (string, bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return "", false
	}
	dev, fn, ok := strings.Cut(parts[2], ".")
	if !ok {
		return "", false
	}
	var v [4]uint64
	for i, p := range []string{parts[0], parts[1], dev, fn} {
		n, err := strconv.ParseUint(p, 16, 32)
		if err != nil || p == "" {
			return "", false
		}
		v[i] = n
	}
	if v[1] > 0xff || v[2] > 0x1f || v[3] > 7 {
		return "", false
	}
	return fmt.Sprintf("%08x:%02x:%02x.%x", v[0], v[1], v[2], v[3]), true
}

// inventoryLine lists the host's devices for an error message, short enough
// for one line on a large MIG host.
func inventoryLine(sys *gpu.System) string {
	if len(sys.Devices) == 0 {
		return "no GPUs"
	}
	const max = 16
	var parts []string
	for _, s := range allDevices(sys) {
		if len(parts) == max {
			parts = append(parts, "...")
			break
		}
		parts = append(parts, s.Name()+"="+s.UUID())
	}
	return strings.Join(parts, ", ")
}

// deviceEdits stats the nodes of the selected devices under devRoot.
func deviceEdits(selected []Selected, devRoot string) (*Edits, error) {
	e := &Edits{}
	for _, s := range selected {
		paths := []string{s.GPU.DevicePath()}
		if s.MIG != nil {
			paths = append(paths, capPath(s.MIG.GICapMinor), capPath(s.MIG.CICapMinor))
		}
		for _, p := range paths {
			n, err := statNode(devRoot, p)
			if err != nil {
				return nil, fmt.Errorf("device %s (%s): %w", s.Name(), s.UUID(), err)
			}
			e.DeviceNodes = append(e.DeviceNodes, n)
		}
	}
	e.normalize()
	return e, nil
}

// migCapNodes are the nodes for NVIDIA_MIG_CONFIG_DEVICES and
// NVIDIA_MIG_MONITOR_DEVICES.
func migCapNodes(req *request.Request, devRoot string) (*Edits, error) {
	e := &Edits{}
	for _, c := range []struct {
		sel   request.Selection
		minor int
		name  string
	}{{req.MIGConfig, migConfigMinor, "NVIDIA_MIG_CONFIG_DEVICES"}, {req.MIGMonitor, migMonitorMinor, "NVIDIA_MIG_MONITOR_DEVICES"}} {
		if c.sel.Mode == request.Void || c.sel.Mode == request.None {
			continue
		}
		n, err := statNode(devRoot, capPath(c.minor))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		e.DeviceNodes = append(e.DeviceNodes, n)
	}
	return e, nil
}

func capPath(minor int) string { return "/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(minor) }

func statNode(devRoot, p string) (DeviceNode, error) {
	f, err := driver.StatDevice(devRoot, p)
	if err != nil {
		return DeviceNode{}, err
	}
	cp := f.ContainerPath
	if cp == "" {
		cp = p
	}
	hp := f.HostPath
	if hp == "" {
		hp = p
	}
	return DeviceNode{Path: cp, HostPath: hp, Type: "c", Major: f.Major, Minor: f.Minor, Permissions: CgroupAccess}, nil
}
