//go:build cgo

package readings

import (
	"fmt"
	"math"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpunvml "github.com/gantry-gpu/gantry/internal/gpu/nvml"
)

// nvmlReader keeps NVML loaded for the life of the exporter (a scrape must
// not pay for NVML's start) and caches device handles.
type nvmlReader struct {
	mu      sync.Mutex
	lib     nvml.Interface
	handles map[string]nvml.Device
	proc    string // where the host's /proc is, for process names
}

// NewNVML loads NVML the way GPU discovery does (internal/gpu/nvml.Open:
// the dynamic loader first, then the library directories under driverRoot,
// under the lock that go-nvml's process-wide state needs) and returns a
// Reader and the function that unloads NVML again.
func NewNVML(driverRoot string) (Reader, func(), error) {
	lib, shutdown, err := gpunvml.Open(driverRoot)
	if err != nil {
		return nil, nil, fmt.Errorf("GPU readings: %w", err)
	}
	r := &nvmlReader{lib: lib, handles: map[string]nvml.Device{}, proc: "/proc"}
	return r, func() { r.mu.Lock(); shutdown(); r.mu.Unlock() }, nil
}

func (r *nvmlReader) Read(uuid string) (Sample, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, err := r.handle(uuid)
	if err != nil {
		return Unknown(), err
	}
	return readDevice(h, r.proc, r.has("nvmlDeviceGetMemoryInfo_v2")), nil
}

// handle returns the GPU's handle, from the cache when it is there. The
// caller holds r.mu.
func (r *nvmlReader) handle(uuid string) (nvml.Device, error) {
	if h, ok := r.handles[uuid]; ok {
		return h, nil
	}
	h, ret := r.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GPU %s: %s", uuid, nvml.ErrorString(ret))
	}
	r.handles[uuid] = h
	return h, nil
}

// has reports whether the loaded library exports sym: go-nvml binds
// symbols lazily, and calling one that an older driver lacks would crash
// the process (internal/gpu/nvml checks the same way).
func (r *nvmlReader) has(sym string) bool { return r.lib.Extensions().LookupSymbol(sym) == nil }

// Properties reads the GPU's fixed properties.
func (r *nvmlReader) Properties(uuid string) (Properties, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, err := r.handle(uuid)
	if err != nil {
		return Properties{}, err
	}
	return readProperties(h, r.has), nil
}

// readProperties reads each property on its own; one that NVML does not
// support stays unknown.
func readProperties(h nvml.Device, has func(string) bool) Properties {
	var p Properties
	if has("nvmlDeviceGetNumGpuCores") {
		if n, ret := h.GetNumGpuCores(); ret == nvml.SUCCESS && n > 0 {
			p.Cores = n
		}
	}
	if g, ret := h.GetMaxPcieLinkGeneration(); ret == nvml.SUCCESS && g > 0 {
		p.PCIeMaxGeneration = g
	}
	if w, ret := h.GetMaxPcieLinkWidth(); ret == nvml.SUCCESS && w > 0 {
		p.PCIeMaxWidth = w
	}
	if has("nvmlDeviceGetMemoryBusWidth") {
		if w, ret := h.GetMemoryBusWidth(); ret == nvml.SUCCESS && w > 0 {
			p.MemoryBusWidthBits = int(w)
		}
	}
	if cur, _, ret := h.GetEccMode(); ret == nvml.SUCCESS {
		on := cur == nvml.FEATURE_ENABLED
		p.ECCEnabled = &on
	}
	return p
}

// Peer reads where the PCIe paths of GPUs a and b meet and whether a may
// read b's memory directly.
func (r *nvmlReader) Peer(a, b string) (Peer, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ha, err := r.handle(a)
	if err != nil {
		return Peer{}, err
	}
	hb, err := r.handle(b)
	if err != nil {
		return Peer{}, err
	}
	return readPeer(ha, hb, r.has), nil
}

func readPeer(a, b nvml.Device, has func(string) bool) Peer {
	var p Peer
	if level, ret := a.GetTopologyCommonAncestor(b); ret == nvml.SUCCESS {
		p.Path = pciePath(level)
	}
	if has("nvmlDeviceGetP2PStatus") {
		if st, ret := a.GetP2PStatus(b, nvml.P2P_CAPS_INDEX_READ); ret == nvml.SUCCESS && st != nvml.P2P_STATUS_UNKNOWN {
			ok := st == nvml.P2P_STATUS_OK
			p.P2P = &ok
		}
	}
	return p
}

func pciePath(level nvml.GpuTopologyLevel) PCIePath {
	switch level {
	case nvml.TOPOLOGY_INTERNAL:
		return PCIePathSameBoard
	case nvml.TOPOLOGY_SINGLE:
		return PCIePathSingleSwitch
	case nvml.TOPOLOGY_MULTIPLE:
		return PCIePathMultipleSwitches
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return PCIePathHostBridge
	case nvml.TOPOLOGY_NODE:
		return PCIePathSameNUMANode
	case nvml.TOPOLOGY_SYSTEM:
		return PCIePathCrossNUMANode
	}
	return PCIePathUnknown
}

// readDevice reads every value of one GPU. Each value is read on its own:
// one that NVML does not support on this GPU (or that fails) stays NaN and
// the others are still read.
//
// memV2 reads memory with nvmlDeviceGetMemoryInfo_v2, whose "used" leaves out
// the memory the driver reserves for itself, as nvidia-smi shows it (an idle
// H200: 0 MiB, where the first version says 615 MiB); drivers before R510
// have only the first version.
func readDevice(h nvml.Device, proc string, memV2 bool) Sample {
	s := Unknown()
	if u, ret := h.GetUtilizationRates(); ret == nvml.SUCCESS {
		s.UtilizationPercent, s.MemoryUtilizationPercent = float64(u.Gpu), float64(u.Memory)
	}
	if u, _, ret := h.GetEncoderUtilization(); ret == nvml.SUCCESS {
		s.EncoderUtilizationPercent = float64(u)
	}
	if u, _, ret := h.GetDecoderUtilization(); ret == nvml.SUCCESS {
		s.DecoderUtilizationPercent = float64(u)
	}
	if memV2 {
		if m, ret := h.GetMemoryInfo_v2(); ret == nvml.SUCCESS {
			s.MemoryUsedBytes, s.MemoryTotalBytes = float64(m.Used), float64(m.Total)
		} else {
			memV2 = false
		}
	}
	if !memV2 {
		if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
			s.MemoryUsedBytes, s.MemoryTotalBytes = float64(m.Used), float64(m.Total)
		}
	}
	if t, ret := h.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		s.TemperatureCelsius = float64(t)
	}
	if p, ret := h.GetPowerUsage(); ret == nvml.SUCCESS {
		s.PowerWatts = float64(p) / 1000 // milliwatts
	}
	if p, ret := h.GetPowerManagementLimit(); ret == nvml.SUCCESS {
		s.PowerLimitWatts = float64(p) / 1000
	}
	clock := func(get func(nvml.ClockType) (uint32, nvml.Return), c nvml.ClockType) float64 {
		if v, ret := get(c); ret == nvml.SUCCESS {
			return float64(v)
		}
		return math.NaN()
	}
	s.SMClockMHz = clock(h.GetClockInfo, nvml.CLOCK_SM)
	s.MemoryClockMHz = clock(h.GetClockInfo, nvml.CLOCK_MEM)
	s.MaxSMClockMHz = clock(h.GetMaxClockInfo, nvml.CLOCK_SM)
	s.MaxMemoryClockMHz = clock(h.GetMaxClockInfo, nvml.CLOCK_MEM)
	if b, ret := h.GetBAR1MemoryInfo(); ret == nvml.SUCCESS {
		s.BAR1UsedBytes, s.BAR1TotalBytes = float64(b.Bar1Used), float64(b.Bar1Total)
	}
	pcie := func(c nvml.PcieUtilCounter) float64 {
		if v, ret := h.GetPcieThroughput(c); ret == nvml.SUCCESS {
			return float64(v) * 1000 // KB/s
		}
		return math.NaN()
	}
	s.PCIeRXBytesPerSecond = pcie(nvml.PCIE_UTIL_RX_BYTES)
	s.PCIeTXBytesPerSecond = pcie(nvml.PCIE_UTIL_TX_BYTES)
	ecc := func(loc nvml.MemoryLocation) float64 {
		if v, ret := h.GetMemoryErrorCounter(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC, loc); ret == nvml.SUCCESS {
			return float64(v)
		}
		return math.NaN()
	}
	s.ECCErrorsL1Cache = ecc(nvml.MEMORY_LOCATION_L1_CACHE)
	s.ECCErrorsL2Cache = ecc(nvml.MEMORY_LOCATION_L2_CACHE)
	s.ECCErrorsDeviceMemory = ecc(nvml.MEMORY_LOCATION_DEVICE_MEMORY)
	s.Processes = processes(h, proc)
	return s
}

// processes lists the compute processes, then the graphics ones not already
// listed (a process with both contexts appears in both of NVML's lists).
func processes(h nvml.Device, proc string) []Process {
	var out []Process
	seen := map[uint32]bool{}
	for _, get := range []func() ([]nvml.ProcessInfo, nvml.Return){h.GetComputeRunningProcesses, h.GetGraphicsRunningProcesses} {
		infos, ret := get()
		if ret != nvml.SUCCESS {
			continue
		}
		for _, p := range infos {
			if seen[p.Pid] {
				continue
			}
			seen[p.Pid] = true
			mem := float64(p.UsedGpuMemory)
			if p.UsedGpuMemory == math.MaxUint64 { // NVML_VALUE_NOT_AVAILABLE
				mem = math.NaN()
			}
			out = append(out, Process{PID: p.Pid, Name: ProcessName(proc, p.Pid), UsedMemoryBytes: mem})
		}
	}
	return out
}
