package draplugin

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/request"
)

// DefaultDriverName is the DRA driver name of NVIDIA's GPU driver, which
// Gantry answers to so that DeviceClasses and claims written for it work.
const DefaultDriverName = "gpu.nvidia.com"

// Device types, the value of the "type" attribute the DeviceClasses
// gpu.nvidia.com and mig.nvidia.com select on.
const (
	TypeGPU = "gpu"
	TypeMIG = "mig"
)

// Device is one allocatable device: its ResourceSlice entry and the Gantry
// device ID ("0", "1:0") that request and edits resolve.
type Device struct {
	Slice resourceapi.Device
	// ID is the GPU index or "GPU:MIG" name.
	ID string
	// UUID is the GPU or MIG UUID.
	UUID string
	// Nodes are the device nodes (paths under the device root) of a
	// device that is not a GPU or MIG device (an IMEX channel, a GPU bound
	// to vfio-pci): a claim for it gets these nodes only, no driver files.
	Nodes []string
}

// Devices lists the allocatable devices of sys in index order: each GPU not
// in MIG mode, and the MIG devices of each GPU in MIG mode (a GPU in MIG
// mode is not offered whole, as in `gantry cdi generate`). A device whose
// data cannot be expressed (a version that is not numeric, a bus ID that
// is not PCI) is an error naming it: a slice the API server rejects would
// hide every GPU of the node.
func Devices(sys *gpu.System) ([]Device, error) {
	if sys == nil {
		return nil, nil
	}
	driverVer, err := semver(sys.DriverVersion)
	if err != nil {
		return nil, fmt.Errorf("driver version: %w", err)
	}
	cudaVer, err := semver(sys.CUDADriverVersion)
	if err != nil {
		return nil, fmt.Errorf("CUDA driver version: %w", err)
	}
	var out []Device
	byIndex := map[int]gpu.Device{}
	for _, d := range sys.Devices {
		byIndex[d.Index] = d
	}
	for _, d := range sys.Devices {
		common, err := commonAttributes(d, driverVer, cudaVer)
		if err != nil {
			return nil, fmt.Errorf("GPU %d (%s): %w", d.Index, d.UUID, err)
		}
		if !d.MIGEnabled {
			attrs := common
			attrs["type"] = str(TypeGPU)
			attrs["uuid"] = str(d.UUID)
			attrs["index"] = integer(d.Index)
			attrs["minor"] = integer(d.Minor)
			out = append(out, Device{ID: strconv.Itoa(d.Index), UUID: d.UUID, Slice: resourceapi.Device{
				Name:       gpuName(d),
				Attributes: attrs,
				Capacity:   memory(d.MemoryMiB),
			}})
			continue
		}
		for _, m := range d.MIGDevices {
			parent, ok := byIndex[m.Parent]
			if !ok {
				parent = d
			}
			attrs, _ := commonAttributes(parent, driverVer, cudaVer)
			attrs["type"] = str(TypeMIG)
			attrs["uuid"] = str(m.UUID)
			attrs["index"] = integer(m.Index)
			attrs["parentIndex"] = integer(parent.Index)
			attrs["parentMinor"] = integer(parent.Minor)
			attrs["parentUUID"] = str(parent.UUID)
			attrs["profile"] = str(m.Profile)
			out = append(out, Device{ID: m.Name(), UUID: m.UUID, Slice: resourceapi.Device{
				Name:       migName(parent, m),
				Attributes: attrs,
				Capacity:   memory(m.MemoryMiB),
			}})
		}
	}
	return out, nil
}

// Resources is what the plugin publishes: one pool named after the node,
// in slices of at most resourceapi.ResourceSliceMaxDevices devices.
func Resources(nodeName string, devs []Device) resourceslice.DriverResources {
	var slices []resourceslice.Slice
	for start := 0; start < len(devs); start += resourceapi.ResourceSliceMaxDevices {
		end := min(start+resourceapi.ResourceSliceMaxDevices, len(devs))
		s := resourceslice.Slice{}
		for _, d := range devs[start:end] {
			s.Devices = append(s.Devices, d.Slice)
		}
		slices = append(slices, s)
	}
	if slices == nil {
		// An empty pool still tells the scheduler the node has no GPUs.
		slices = []resourceslice.Slice{{}}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{nodeName: {Slices: slices}}}
}

// SliceObjects are the ResourceSlice objects Resources describes, as the
// helper's controller writes them (less the names and owner the API server
// and the controller fill in): for `--dry-run` and for reading.
func SliceObjects(driverName, nodeName string, devs []Device) []resourceapi.ResourceSlice {
	pool := Resources(nodeName, devs).Pools[nodeName]
	var out []resourceapi.ResourceSlice
	for _, s := range pool.Slices {
		out = append(out, resourceapi.ResourceSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   driverName,
				NodeName: &nodeName,
				Pool:     resourceapi.ResourcePool{Name: nodeName, ResourceSliceCount: int64(len(pool.Slices))},
				Devices:  s.Devices,
			},
		})
	}
	return out
}

func commonAttributes(d gpu.Device, driverVer, cudaVer string) (map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, error) {
	cc, err := semver(d.ComputeCapability)
	if err != nil {
		return nil, fmt.Errorf("compute capability: %w", err)
	}
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"productName":           str(d.Name),
		"brand":                 str(d.Brand),
		"architecture":          str(d.Architecture),
		"cudaComputeCapability": version(cc),
		"driverVersion":         version(driverVer),
		"cudaDriverVersion":     version(cudaVer),
	}
	if d.PCIBusID != "" {
		bdf, err := pciAddress(d.PCIBusID)
		if err != nil {
			return nil, err
		}
		attrs["pcieBusID"] = str(bdf)
		attrs[deviceattribute.StandardDeviceAttributePCIBusID] = str(bdf)
	}
	if d.NUMANode >= 0 {
		// A device with no NUMA affinity must not carry the attribute:
		// it would match every other device without one.
		attrs[deviceattribute.StandardDeviceAttributeNUMANode] = integer(d.NUMANode)
	}
	return attrs, nil
}

func gpuName(d gpu.Device) string { return "gpu-" + strconv.Itoa(d.Minor) }

var notLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// migName follows NVIDIA's "gpu-<parent minor>-mig-<profile>-..." form;
// the suffix is the GPU and compute instance IDs, which identify a live
// MIG device on its parent.
func migName(parent gpu.Device, m gpu.MIGDevice) string {
	profile := notLabel.ReplaceAllString(strings.ToLower(strings.ReplaceAll(m.Profile, ".", "")), "-")
	return fmt.Sprintf("gpu-%d-mig-%s-%d-%d", parent.Minor, strings.Trim(profile, "-"), m.GPUInstance, m.ComputeInstance)
}

// semver turns a dotted numeric version ("9.0", "12.4", "570.124.06") into
// the semantic version the API's VersionValue wants ("9.0.0", "12.4.0",
// "570.124.6"): three parts, no leading zeros.
func semver(v string) (string, error) {
	parts := strings.Split(v, ".")
	if v == "" || len(parts) > 3 {
		return "", fmt.Errorf("%q is not a version of one to three numbers", v)
	}
	out := make([]string, 3)
	for i := range out {
		out[i] = "0"
		if i < len(parts) {
			n, err := strconv.ParseUint(parts[i], 10, 32)
			if err != nil {
				return "", fmt.Errorf("%q is not a version of one to three numbers", v)
			}
			out[i] = strconv.FormatUint(n, 10)
		}
	}
	return strings.Join(out, "."), nil
}

var bdfRe = regexp.MustCompile(`^([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$`)

// pciAddress turns NVML's bus ID ("00000000:18:00.0") into the kernel's
// form ("0000:18:00.0") that resource.kubernetes.io/pciBusID takes.
func pciAddress(busID string) (string, error) {
	m := bdfRe.FindStringSubmatch(strings.ToLower(busID))
	if m == nil {
		return "", fmt.Errorf("PCI bus ID %q is not domain:bus:device.function", busID)
	}
	domain := m[1]
	if len(domain) > 4 {
		if strings.TrimLeft(domain[:len(domain)-4], "0") != "" {
			return "", fmt.Errorf("PCI bus ID %q: domain wider than 16 bits", busID)
		}
		domain = domain[len(domain)-4:]
	}
	return domain + ":" + m[2] + ":" + m[3] + "." + m[4], nil
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func version(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{VersionValue: &s}
}
func integer(i int) resourceapi.DeviceAttribute {
	v := int64(i)
	return resourceapi.DeviceAttribute{IntValue: &v}
}

func memory(mib uint64) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	if mib == 0 {
		return nil
	}
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		"memory": {Value: *resource.NewQuantity(int64(mib)*1024*1024, resource.BinarySI)},
	}
}

// Only keeps the devices that ids name (comma list: GPU indexes, GPU or MIG
// UUIDs, PCI bus IDs, "GPU:MIG" names, as NVIDIA_VISIBLE_DEVICES takes
// them); a GPU named whole keeps its MIG devices. An empty list keeps all.
// It lets the DRA plugin and the device plugin share a node, each with
// its own GPUs. An ID the host does not have is an error listing what it has.
func Only(sys *gpu.System, devs []Device, ids string) ([]Device, error) {
	if strings.TrimSpace(ids) == "" {
		return devs, nil
	}
	sel, err := edits.Resolve(sys, request.Selection{Mode: request.List, IDs: strings.Split(ids, ",")})
	if err != nil {
		return nil, fmt.Errorf("--devices %q: %w", ids, err)
	}
	keep := map[string]bool{}
	for _, s := range sel {
		keep[s.Name()] = true
	}
	var out []Device
	for _, d := range devs {
		parent, _, _ := strings.Cut(d.ID, ":")
		if keep[d.ID] || keep[parent] {
			out = append(out, d)
		}
	}
	return out, nil
}
