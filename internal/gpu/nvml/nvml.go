//go:build cgo && !nonvml

package nvml

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// Linked reports whether this binary can load NVML itself.
const Linked = true

// go-nvml keeps process-wide state in package variables (the versioned
// symbol table, the error-string function), so loads and unloads must not
// overlap.
var mu sync.Mutex

// Discover loads NVML, reads the GPUs and unloads it again.
func Discover(opts Options) (*gpu.System, error) {
	mu.Lock()
	defer mu.Unlock()
	lib, err := open(opts.DriverRoot)
	if err != nil {
		return nil, err
	}
	defer lib.Shutdown()
	d := discoverer{lib: lib, ext: lib.Extensions(), light: opts.Light}
	return d.system()
}

// open loads and initialises NVML: first as the dynamic loader finds it,
// then from the usual library directories under root.
func open(root string) (nvml.Interface, error) {
	if root == "" {
		root = "/"
	}
	paths := []string{""}
	for _, dir := range libDirs {
		p := filepath.Join(root, dir, soname)
		if _, err := os.Stat(p); err == nil {
			paths = append(paths, p)
		}
	}
	for _, p := range paths {
		lib := nvml.New()
		if p != "" {
			lib = nvml.New(nvml.WithLibraryPath(p))
		}
		switch ret := lib.Init(); ret {
		case nvml.SUCCESS:
			return lib, nil
		case nvml.ERROR_LIBRARY_NOT_FOUND:
			continue
		case nvml.ERROR_DRIVER_NOT_LOADED:
			return nil, fmt.Errorf("%w: NVML (%s) cannot initialise; load it (modprobe nvidia), or %s", ErrDriverNotLoaded, where(p), gpu.SimulateAdvice)
		default:
			return nil, fmt.Errorf("initialising NVML (%s): %s; check the driver with nvidia-smi", where(p), nvml.ErrorString(ret))
		}
	}
	return nil, errNoNVML
}

func where(p string) string {
	if p == "" {
		return soname
	}
	return p
}

type discoverer struct {
	lib   nvml.Interface
	ext   nvml.ExtendedInterface
	light bool
	// migMinors is /proc/driver/nvidia-caps/mig-minors, read when first needed.
	migMinors map[string]int
}

// has reports whether the loaded library exports sym. Functions newer than
// the oldest supported driver must be checked before they are called: go-nvml
// binds symbols lazily, and calling a missing one crashes the process.
func (d *discoverer) has(sym string) bool { return d.ext.LookupSymbol(sym) == nil }

func (d *discoverer) system() (*gpu.System, error) {
	sys := &gpu.System{Backend: "nvml", Devices: []gpu.Device{}}
	var ret nvml.Return
	if sys.DriverVersion, ret = d.lib.SystemGetDriverVersion(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: reading the driver version: %s", nvml.ErrorString(ret))
	}
	if v, ret := d.lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		sys.CUDADriverVersion = cudaVersion(v)
	}
	n, ret := d.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML: counting GPUs: %s", nvml.ErrorString(ret))
	}
	handles := make([]nvml.Device, n)
	for i := range n {
		h, ret := d.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML: GPU %d: %s", i, nvml.ErrorString(ret))
		}
		dev, err := d.device(i, h)
		if err != nil {
			return nil, err
		}
		handles[i] = h
		sys.Devices = append(sys.Devices, dev)
	}
	if !d.light {
		for i, h := range handles {
			sys.Devices[i].NVLinks = d.nvlinks(h, sys.Devices)
		}
	}
	return sys, nil
}

// device reads one GPU. UUID, minor and PCI bus id identify it and are
// required; the rest is filled where the driver supports it.
func (d *discoverer) device(i int, h nvml.Device) (gpu.Device, error) {
	fail := func(what string, ret nvml.Return) (gpu.Device, error) {
		return gpu.Device{}, fmt.Errorf("NVML: GPU %d: reading the %s: %s", i, what, nvml.ErrorString(ret))
	}
	dev := gpu.Device{Index: i, NUMANode: -1, Brand: "unknown"}
	var ret nvml.Return
	if dev.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return fail("UUID", ret)
	}
	if dev.Minor, ret = h.GetMinorNumber(); ret != nvml.SUCCESS {
		return fail("minor number", ret)
	}
	pci, ret := h.GetPciInfo()
	if ret != nvml.SUCCESS {
		return fail("PCI info", ret)
	}
	addr := pciAddress(pci)
	dev.PCIBusID = addr.String()
	if dev.Name, ret = h.GetName(); ret != nvml.SUCCESS {
		return fail("name", ret)
	}
	if b, ret := h.GetBrand(); ret == nvml.SUCCESS {
		dev.Brand = brandName(b)
	}
	major, minor, ret := h.GetCudaComputeCapability()
	if ret == nvml.SUCCESS {
		dev.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
		dev.Architecture = gpu.ArchitectureOf(major, minor)
	}
	if d.has("nvmlDeviceGetArchitecture") {
		if a, ret := h.GetArchitecture(); ret == nvml.SUCCESS && archName(a) != "" {
			dev.Architecture = archName(a)
		}
	}
	if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
		dev.MemoryMiB = m.Total >> 20
	}
	dev.NUMANode = -1
	if d.has("nvmlDeviceGetNumaNodeId") {
		if n, ret := h.GetNumaNodeId(); ret == nvml.SUCCESS && n >= 0 {
			dev.NUMANode = n
		}
	}
	if dev.NUMANode < 0 {
		dev.NUMANode = sysfsNUMANode("/sys", addr)
	}
	// The affinity sets nvidia-smi topo -m prints. Where neither NVML's
	// NUMA node id nor sysfs names a node (VMs), a memory affinity of
	// exactly one node is that node, as topo -m reports it.
	if d.has("nvmlDeviceGetCpuAffinity") {
		if set, ret := h.GetCpuAffinity(affinityBits); ret == nvml.SUCCESS {
			dev.CPUAffinity = bitList(set)
		}
	}
	if d.has("nvmlDeviceGetMemoryAffinity") {
		if set, ret := h.GetMemoryAffinity(affinityBits, nvml.AFFINITY_SCOPE_NODE); ret == nvml.SUCCESS {
			dev.NUMAAffinity = bitList(set)
			if n, one := onlyBit(set); one && dev.NUMANode < 0 {
				dev.NUMANode = n
			}
		}
	}
	if d.has("nvmlDeviceGetMigMode") {
		if cur, _, ret := h.GetMigMode(); ret == nvml.SUCCESS && cur == nvml.DEVICE_MIG_ENABLE {
			dev.MIGEnabled = true
		}
	}
	if dev.MIGEnabled {
		var err error
		if dev.MIGDevices, err = d.migDevices(dev, h); err != nil {
			return gpu.Device{}, err
		}
	}
	return dev, nil
}

func (d *discoverer) migDevices(parent gpu.Device, h nvml.Device) ([]gpu.MIGDevice, error) {
	fail := func(j int, what string, ret nvml.Return) ([]gpu.MIGDevice, error) {
		return nil, fmt.Errorf("NVML: MIG device %d:%d: reading the %s: %s", parent.Index, j, what, nvml.ErrorString(ret))
	}
	if d.migMinors == nil {
		d.migMinors = map[string]int{}
		if data, err := os.ReadFile("/proc/driver/nvidia-caps/mig-minors"); err == nil {
			if t, err := parseMIGMinors(data); err == nil {
				d.migMinors = t
			}
		}
	}
	count, ret := h.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return fail(0, "MIG device count", ret)
	}
	var out []gpu.MIGDevice
	for j := range count {
		mh, ret := h.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		if ret != nvml.SUCCESS {
			return fail(j, "handle", ret)
		}
		// Index is NVML's index, which is what "GPU:INSTANCE" names resolve
		// through (nvmlDeviceGetMigDeviceHandleByIndex), even with gaps.
		m := gpu.MIGDevice{Index: j, Parent: parent.Index}
		if m.UUID, ret = mh.GetUUID(); ret != nvml.SUCCESS {
			return fail(j, "UUID", ret)
		}
		if m.GPUInstance, ret = mh.GetGpuInstanceId(); ret != nvml.SUCCESS {
			return fail(j, "GPU instance id", ret)
		}
		if m.ComputeInstance, ret = mh.GetComputeInstanceId(); ret != nvml.SUCCESS {
			return fail(j, "compute instance id", ret)
		}
		if name, ret := mh.GetName(); ret == nvml.SUCCESS {
			m.Profile = migProfile(name)
		}
		if mem, ret := mh.GetMemoryInfo(); ret == nvml.SUCCESS {
			m.MemoryMiB = mem.Total >> 20
		}
		var err error
		if m.GICapMinor, m.CICapMinor, err = migCapMinors(d.migMinors, parent.Minor, m.GPUInstance, m.ComputeInstance); err != nil {
			return nil, fmt.Errorf("MIG device %s: %w", m.Name(), err)
		}
		out = append(out, m)
	}
	return out, nil
}

// nvlinks reads the active links of one GPU and groups them by peer.
func (d *discoverer) nvlinks(h nvml.Device, devs []gpu.Device) []gpu.NVLink {
	byBus := map[string]int{}
	for i, dev := range devs {
		byBus[dev.PCIBusID] = i
	}
	hasType := d.has("nvmlDeviceGetNvLinkRemoteDeviceType")
	switchLinks := 0
	peerLinks := map[int]int{}
	for link := range nvml.NVLINK_MAX_LINKS {
		state, ret := h.GetNvLinkState(link)
		if ret == nvml.ERROR_NOT_SUPPORTED && link == 0 {
			return nil // no NVLink on this GPU
		}
		if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
			continue
		}
		if hasType {
			if t, ret := h.GetNvLinkRemoteDeviceType(link); ret == nvml.SUCCESS && t == nvml.NVLINK_DEVICE_TYPE_SWITCH {
				switchLinks++
				continue
			}
		}
		pci, ret := h.GetNvLinkRemotePciInfo(link)
		if ret != nvml.SUCCESS {
			continue
		}
		if p, ok := byBus[pciAddress(pci).String()]; ok {
			peerLinks[p]++
		}
	}
	var out []gpu.NVLink
	if switchLinks > 0 {
		out = append(out, gpu.NVLink{Switch: true, Links: switchLinks})
	}
	peers := make([]int, 0, len(peerLinks))
	for p := range peerLinks {
		peers = append(peers, p)
	}
	sort.Ints(peers)
	for _, p := range peers {
		out = append(out, gpu.NVLink{PeerUUID: devs[p].UUID, Links: peerLinks[p]})
	}
	return out
}

// pciAddress takes NVML's bus id string, falling back to the numeric fields.
func pciAddress(p nvml.PciInfo) gpu.PCIAddress {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	if a, err := gpu.ParsePCIAddress(string(b)); err == nil {
		return a
	}
	return gpu.PCIAddress{Domain: p.Domain, Bus: uint8(p.Bus), Device: uint8(p.Device)}
}

// brandName maps NVML's brand enum to the NVIDIA_REQUIRE_* spelling.
func brandName(b nvml.BrandType) string {
	switch b {
	case nvml.BRAND_QUADRO:
		return "quadro"
	case nvml.BRAND_TESLA:
		return "tesla"
	case nvml.BRAND_NVS:
		return "nvs"
	case nvml.BRAND_GRID:
		return "grid"
	case nvml.BRAND_GEFORCE:
		return "geforce"
	case nvml.BRAND_TITAN:
		return "titan"
	case nvml.BRAND_NVIDIA_VAPPS:
		return "vapps"
	case nvml.BRAND_NVIDIA_VPC:
		return "vpc"
	case nvml.BRAND_NVIDIA_VCS:
		return "vcs"
	case nvml.BRAND_NVIDIA_VWS:
		return "vws"
	case nvml.BRAND_NVIDIA_CLOUD_GAMING:
		return "cloudgaming"
	case nvml.BRAND_QUADRO_RTX:
		return "quadrortx"
	case nvml.BRAND_NVIDIA_RTX:
		return "nvidiartx"
	case nvml.BRAND_NVIDIA:
		return "nvidia"
	case nvml.BRAND_GEFORCE_RTX:
		return "geforcertx"
	case nvml.BRAND_TITAN_RTX:
		return "titanrtx"
	}
	return "unknown"
}

// archName names NVML's architecture enum; "" for ones it does not know, so
// the caller falls back to the compute capability.
func archName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "Volta"
	case nvml.DEVICE_ARCH_TURING:
		return "Turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "Ada Lovelace"
	case nvml.DEVICE_ARCH_HOPPER:
		return "Hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "Blackwell"
	}
	return ""
}

// errNoNVML is the one-line error for a host without libnvidia-ml.so.1.
var errNoNVML = fmt.Errorf("%w: no NVIDIA driver is installed here, or it is under another driver root (driver-root in the Gantry configuration); %s", ErrNoNVML, gpu.SimulateAdvice)

// affinityBits is the size of the CPU and node sets asked of NVML.
const affinityBits = 1024

// bitList writes a set of NVML's bitmask words as a list of ranges
// ("0-63,128-191"); empty for an empty set.
func bitList(words []uint) string {
	var b strings.Builder
	const w = int(unsafe.Sizeof(uint(0))) * 8
	start := -1
	flush := func(end int) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if start == end {
			fmt.Fprintf(&b, "%d", start)
		} else {
			fmt.Fprintf(&b, "%d-%d", start, end)
		}
		start = -1
	}
	n := len(words) * w
	for i := 0; i <= n; i++ {
		set := i < n && words[i/w]&(1<<(uint(i)%uint(w))) != 0
		if set && start < 0 {
			start = i
		} else if !set && start >= 0 {
			flush(i - 1)
		}
	}
	return b.String()
}

// onlyBit is the one bit set in words, if exactly one is.
func onlyBit(words []uint) (int, bool) {
	const w = int(unsafe.Sizeof(uint(0))) * 8
	found := -1
	for i, x := range words {
		for j := 0; j < w; j++ {
			if x&(1<<uint(j)) != 0 {
				if found >= 0 {
					return -1, false
				}
				found = i*w + j
			}
		}
	}
	return found, found >= 0
}
