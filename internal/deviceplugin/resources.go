package deviceplugin

import (
	"cmp"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// replicaSep joins a device's UUID and replica number in the IDs of shared
// devices: GPU-...::0, GPU-...::1 (NVIDIA's form, which tools parse).
const replicaSep = "::"

// Device is one device the kubelet sees: a GPU, a MIG device, or one replica
// of either when the resource is shared.
type Device struct {
	// ID is what the kubelet knows the device by: the UUID, or
	// UUID::N for replica N of a shared device.
	ID string
	// UUID is the GPU or MIG device the ID stands for.
	UUID string
	// Index names the device by position: "0", or "0:1" for MIG device 1 of GPU 0.
	Index string
	// GPU is the UUID of the physical GPU (the parent of a MIG device).
	GPU string
	// GPUIndex is the physical GPU's index, for stable ordering.
	GPUIndex int
	// MIGIndex is the MIG device's position on its GPU (the 1 of "0:1"),
	// -1 for a whole GPU.
	MIGIndex int
	// MIG is true for MIG devices.
	MIG bool
	// Replica is the replica number of a shared device, -1 otherwise.
	Replica int
	// NUMANode is the host NUMA node of the GPU, -1 when unknown.
	NUMANode int
	// Paths are the device nodes the device needs (for passDeviceSpecs).
	Paths []string
}

// Resource is one Kubernetes extended resource and the devices behind it.
type Resource struct {
	// Name is the resource name, e.g. nvidia.com/gpu or nvidia.com/mig-1g.10gb.
	Name string
	// Replicas is how many times each device is offered (0: not shared).
	Replicas int
	// MPS is true when the replicas share their GPU through an MPS daemon.
	MPS bool
	// Devices in index order, replicas of one device together.
	Devices []Device
}

// SocketName is the resource's socket in the kubelet directory: nvidia-gpu.sock,
// nvidia-mig-1g.10gb.sock (NVIDIA's naming, so one plugin replaces the other).
func (r Resource) SocketName() string {
	return "nvidia-" + strings.TrimPrefix(r.Name, ResourcePrefix) + ".sock"
}

// BuildResources turns the discovered GPUs into resources as the MIG strategy,
// the resource patterns and the time-slicing settings of c say. c must be
// validated. Resources come sorted by name; a resource with no device is left out.
func BuildResources(sys *gpu.System, c *Config, log *slog.Logger) ([]Resource, error) {
	if log == nil {
		log = slog.Default()
	}
	byName := map[string][]Device{}
	replicas := map[string]int{} // resource name -> replica count
	add := func(name string, d Device) { byName[name] = append(byName[name], d) }

	gpuPatterns := c.Resources.GPUs
	if len(gpuPatterns) == 0 {
		gpuPatterns = []ResourcePattern{{Pattern: "*", Name: ResourcePrefix + "gpu"}}
	}
	strategy := c.Flags.MigStrategy

	if strategy == MIGSingle {
		if err := checkSingle(sys); err != nil {
			return nil, err
		}
	}
	for _, g := range sys.Devices {
		if g.MIGEnabled && strategy != MIGNone {
			if len(g.MIGDevices) == 0 {
				// single was checked above; mixed tolerates it, as NVIDIA does.
				log.Warn("GPU in MIG mode has no MIG devices; it offers nothing", "gpu", g.Index, "uuid", g.UUID)
				continue
			}
			for _, m := range g.MIGDevices {
				name, err := migResourceName(c, strategy, m.Profile)
				if err != nil {
					return nil, fmt.Errorf("GPU %d MIG device %s (%s): %w", g.Index, m.Name(), m.UUID, err)
				}
				add(name, migDevice(g, m))
			}
			continue
		}
		name := ""
		for _, p := range gpuPatterns {
			if matchPattern(p.Pattern, g.Name) {
				name = p.Name
				break
			}
		}
		if name == "" {
			return nil, fmt.Errorf("%w: resources.gpus: GPU %d %q matches no pattern; add a pattern such as \"*\"", ErrConfig, g.Index, g.Name)
		}
		add(name, fullDevice(g))
	}

	mps := map[string]bool{}
	if ts, section := c.replicated(); ts != nil {
		for i, rr := range ts.Resources {
			devs, ok := byName[rr.Name]
			if !ok {
				log.Warn("sharing names a resource this node does not have; ignored",
					"key", fmt.Sprintf("%s.resources[%d].name", section, i), "resource", rr.Name)
				continue
			}
			shared, rest, err := pickShared(devs, rr.Devices)
			if err != nil {
				return nil, fmt.Errorf("%w: %s.resources[%d].devices: %v", ErrConfig, section, i, err)
			}
			if ts == c.Sharing.MPS {
				if err := checkMPSShared(i, shared, rr.Replicas, sys); err != nil {
					return nil, err
				}
			}
			target := rr.Name
			if rr.Rename != "" {
				target = rr.Rename
			}
			if len(rest) == 0 {
				delete(byName, rr.Name)
			} else {
				byName[rr.Name] = rest
			}
			if target != rr.Name && len(byName[target]) > 0 {
				return nil, fmt.Errorf("%w: %s.resources[%d].rename: %s is already a resource of unshared devices; choose another name", ErrConfig, section, i, target)
			}
			var reps []Device
			for _, d := range shared {
				for n := range rr.Replicas {
					r := d
					r.Replica = n
					r.ID = d.UUID + replicaSep + strconv.Itoa(n)
					reps = append(reps, r)
				}
			}
			byName[target] = append(byName[target], reps...)
			replicas[target] = rr.Replicas
			mps[target] = ts == c.Sharing.MPS
		}
	}

	var out []Resource
	for name, devs := range byName {
		slices.SortStableFunc(devs, func(a, b Device) int { return compareDevices(&a, &b) })
		out = append(out, Resource{Name: name, Devices: devs, Replicas: replicas[name], MPS: mps[name]})
	}
	slices.SortFunc(out, func(a, b Resource) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// compareDevices is the one order of devices everywhere: by GPU index, then
// MIG device on that GPU (the whole GPU first), then replica. Allocate
// answers in it whatever order the kubelet asks in, so the same devices
// always give the same NVIDIA_VISIBLE_DEVICES and CDI annotation key.
func compareDevices(a, b *Device) int {
	return cmp.Or(cmp.Compare(a.GPUIndex, b.GPUIndex), cmp.Compare(a.MIGIndex, b.MIGIndex), cmp.Compare(a.Replica, b.Replica))
}

// checkSingle enforces what the single strategy needs: every GPU in MIG mode
// (or none), each with MIG devices, all of one profile.
func checkSingle(sys *gpu.System) error {
	var mig, whole []string
	profile, first := "", ""
	for _, g := range sys.Devices {
		if !g.MIGEnabled {
			whole = append(whole, strconv.Itoa(g.Index))
			continue
		}
		mig = append(mig, strconv.Itoa(g.Index))
		if len(g.MIGDevices) == 0 {
			return fmt.Errorf("%w: flags.migStrategy single: GPU %d is in MIG mode but has no MIG devices; create them or use migStrategy mixed", ErrConfig, g.Index)
		}
		for _, m := range g.MIGDevices {
			if profile == "" {
				profile, first = m.Profile, m.Name()
			} else if m.Profile != profile {
				return fmt.Errorf("%w: flags.migStrategy single: MIG devices of different profiles (%s is %s, %s is %s); use migStrategy mixed or repartition the GPUs alike",
					ErrConfig, first, profile, m.Name(), m.Profile)
			}
		}
	}
	if len(mig) > 0 && len(whole) > 0 {
		return fmt.Errorf("%w: flags.migStrategy single: GPUs %s are in MIG mode and GPUs %s are not; all must be alike, or use migStrategy mixed",
			ErrConfig, strings.Join(mig, ","), strings.Join(whole, ","))
	}
	return nil
}

// migResourceName is the resource a MIG device of profile belongs to.
func migResourceName(c *Config, strategy MIGStrategy, profile string) (string, error) {
	if len(c.Resources.MIGs) > 0 {
		for _, p := range c.Resources.MIGs {
			if matchPattern(p.Pattern, profile) {
				return p.Name, nil
			}
		}
		return "", fmt.Errorf("%w: resources.mig: MIG profile %s matches no pattern; add one", ErrConfig, profile)
	}
	if strategy == MIGSingle {
		return ResourcePrefix + "gpu", nil
	}
	// NVIDIA's names: mig-<profile>, with the "+" of attribute suffixes
	// ("1g.10gb+me") turned into "." so the name stays a DNS subdomain.
	return resourceName("mig-" + strings.ReplaceAll(profile, "+", "."))
}

func fullDevice(g gpu.Device) Device {
	return Device{
		ID: g.UUID, UUID: g.UUID, Index: strconv.Itoa(g.Index), GPU: g.UUID, GPUIndex: g.Index, MIGIndex: -1,
		Replica: -1, NUMANode: g.NUMANode, Paths: []string{g.DevicePath()},
	}
}

func migDevice(g gpu.Device, m gpu.MIGDevice) Device {
	return Device{
		ID: m.UUID, UUID: m.UUID, Index: m.Name(), GPU: g.UUID, GPUIndex: g.Index, MIGIndex: m.Index, MIG: true,
		Replica: -1, NUMANode: g.NUMANode,
		Paths: []string{g.DevicePath(), gpu.MIGCapPath(m.GICapMinor), gpu.MIGCapPath(m.CICapMinor)},
	}
}

// pickShared splits devs into those sel shares and the rest.
func pickShared(devs []Device, sel ReplicatedDevices) (shared, rest []Device, err error) {
	switch {
	case sel.All:
		return devs, nil, nil
	case sel.Count > 0:
		if sel.Count > len(devs) {
			return nil, nil, fmt.Errorf("count %d is more than the %d devices of the resource", sel.Count, len(devs))
		}
		return devs[:sel.Count], devs[sel.Count:], nil
	}
	want := map[int]bool{}
	for _, ref := range sel.List {
		i := slices.IndexFunc(devs, func(d Device) bool { return d.Index == ref || strings.EqualFold(d.UUID, ref) })
		if i < 0 {
			return nil, nil, fmt.Errorf("%s is not a device of the resource", ref)
		}
		want[i] = true
	}
	for i, d := range devs {
		if want[i] {
			shared = append(shared, d)
		} else {
			rest = append(rest, d)
		}
	}
	return shared, rest, nil
}
