package draplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
)

// Types of the devices that are not a GPU the driver serves: the values of
// the "type" attribute the DeviceClasses imex.nvidia.com and
// vfio.gpu.nvidia.com select on (NVIDIA's DRA driver's names).
const (
	TypeIMEXChannel = "imex-channel"
	TypeVFIO        = "vfio"
)

// IMEXChannelDir holds the IMEX channel nodes, channel0, channel1, ...
// (created by the IMEX daemon, or nvidia-modprobe -i N).
const IMEXChannelDir = "/dev/nvidia-caps-imex-channels"

// IMEXDevices lists the IMEX channels under devRoot as DRA devices, in
// channel order: "imex-channel-N" with type imex-channel and channel N, as
// NVIDIA's DRA driver published them for its imex.nvidia.com class. A
// claim for one gets the channel's node only (no GPU, no driver files).
// No channel directory is no devices, not an error: most nodes have none.
func IMEXDevices(devRoot string) ([]Device, error) {
	matches, err := filepath.Glob(filepath.Join(devRoot, IMEXChannelDir, "channel*"))
	if err != nil {
		return nil, err
	}
	var chans []int
	for _, m := range matches {
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(m), "channel"))
		if err != nil || n < 0 || strconv.Itoa(n) != strings.TrimPrefix(filepath.Base(m), "channel") {
			continue
		}
		chans = append(chans, n)
	}
	sort.Ints(chans)
	var out []Device
	for _, n := range chans {
		out = append(out, Device{
			ID:    "imex-channel-" + strconv.Itoa(n),
			Nodes: []string{IMEXChannelDir + "/channel" + strconv.Itoa(n)},
			Slice: resourceapi.Device{
				Name: "imex-channel-" + strconv.Itoa(n),
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					"type":    str(TypeIMEXChannel),
					"channel": integer(n),
				},
			},
		})
	}
	return out, nil
}

// nvidiaVendor is NVIDIA's PCI vendor ID as sysfs writes it.
const nvidiaVendor = "0x10de"

// ErrVFIONotReady means a GPU is bound to vfio-pci but cannot be handed to
// a pod as it is; the error says what is missing.
var ErrVFIONotReady = errors.New("GPU bound to vfio-pci cannot be offered")

// VFIODevices lists the NVIDIA GPUs bound to vfio-pci (sysRoot's
// bus/pci/devices/*/driver is vfio-pci; display-class functions of vendor
// 0x10de) as DRA devices "gpu-vfio-N" of type vfio, for the DeviceClass
// vfio.gpu.nvidia.com: a whole GPU for a VM in a pod (KubeVirt, Kata).
// NVML cannot see such a GPU, so it has no UUID; it carries its PCI
// address, vendor and device IDs, NUMA node and IOMMU group. A claim for
// one gets /dev/vfio/vfio and /dev/vfio/<group> from devRoot. Gantry does
// not bind GPUs to vfio-pci itself (NVIDIA's driver can): the admin binds
// them (driverctl set-override ADDR vfio-pci, or vfio-pci.ids= on the
// kernel command line). A GPU bound to vfio-pci without an IOMMU group or
// without its /dev/vfio node is an error wrapping ErrVFIONotReady that
// names the fix; sysRoot without PCI devices is no devices.
func VFIODevices(sysRoot, devRoot string) ([]Device, error) {
	dir := filepath.Join(sysRoot, "bus/pci/devices")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing PCI devices: %w", err)
	}
	read := func(p string) string {
		b, _ := os.ReadFile(p)
		return strings.TrimSpace(string(b))
	}
	var out []Device
	for _, e := range ents {
		addr := e.Name()
		d := filepath.Join(dir, addr)
		drv, err := os.Readlink(filepath.Join(d, "driver"))
		if err != nil || filepath.Base(drv) != "vfio-pci" {
			continue
		}
		// Display controllers (0x03xxxx): VGA and 3D; not the GPU's audio
		// or USB functions, which go along with it through the IOMMU group.
		if read(filepath.Join(d, "vendor")) != nvidiaVendor || !strings.HasPrefix(read(filepath.Join(d, "class")), "0x03") {
			continue
		}
		grp, err := os.Readlink(filepath.Join(d, "iommu_group"))
		if err != nil {
			return nil, fmt.Errorf("%w: %s has no IOMMU group (%s/iommu_group): turn the IOMMU on (intel_iommu=on or amd_iommu=on on the kernel command line) and reboot, or unbind it from vfio-pci", ErrVFIONotReady, addr, d)
		}
		group := filepath.Base(grp)
		nodes := []string{"/dev/vfio/vfio", "/dev/vfio/" + group}
		for _, n := range nodes {
			if _, err := driver.StatDevice(devRoot, n); err != nil {
				return nil, fmt.Errorf("%w: %s (IOMMU group %s): %v: is the vfio module loaded (modprobe vfio-pci)?", ErrVFIONotReady, addr, group, err)
			}
		}
		bdf, err := pciAddress(addr)
		if err != nil {
			return nil, fmt.Errorf("PCI device %s: %w", addr, err)
		}
		g, _ := strconv.Atoi(group)
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":       str(TypeVFIO),
			"vendorID":   str(read(filepath.Join(d, "vendor"))),
			"deviceID":   str(read(filepath.Join(d, "device"))),
			"pcieBusID":  str(bdf),
			"iommuGroup": integer(g),
			deviceattribute.StandardDeviceAttributePCIBusID: str(bdf),
		}
		if n, err := strconv.Atoi(read(filepath.Join(d, "numa_node"))); err == nil && n >= 0 {
			attrs["numa"] = integer(n)
			attrs[deviceattribute.StandardDeviceAttributeNUMANode] = integer(n)
		}
		out = append(out, Device{ID: "vfio:" + bdf, Nodes: nodes, Slice: resourceapi.Device{Attributes: attrs}})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	for i := range out {
		out[i].Slice.Name = "gpu-vfio-" + strconv.Itoa(i)
	}
	return out, nil
}

// nodeEdits are the edits of a device that is only device nodes.
func nodeEdits(devRoot string, dev Device) (specs.ContainerEdits, error) {
	var ce specs.ContainerEdits
	for _, p := range dev.Nodes {
		f, err := driver.StatDevice(devRoot, p)
		if err != nil {
			return ce, fmt.Errorf("%s: %w", dev.Slice.Name, err)
		}
		ce.DeviceNodes = append(ce.DeviceNodes, &specs.DeviceNode{
			Path: p, HostPath: f.HostPath, Type: "c", Major: f.Major, Minor: f.Minor, Permissions: edits.CgroupAccess,
		})
	}
	return ce, nil
}
