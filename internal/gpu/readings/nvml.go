//go:build cgo

package readings

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// libDirs are where NVML lives under a driver root, in the layouts
// internal/gpu/nvml supports.
var libDirs = []string{
	"usr/local/nvidia/lib64",
	"usr/lib/x86_64-linux-gnu",
	"usr/lib/aarch64-linux-gnu",
	"usr/lib64",
	"lib",
	"lib64",
}

// nvmlReader keeps NVML loaded for the life of the exporter (a scrape must
// not pay for NVML's start) and caches device handles.
type nvmlReader struct {
	mu      sync.Mutex
	lib     nvml.Interface
	handles map[string]nvml.Device
}

// NewNVML loads NVML (first as the dynamic loader finds it, then from the
// library directories under driverRoot) and returns a Reader and the
// function that unloads NVML again.
func NewNVML(driverRoot string) (Reader, func(), error) {
	if driverRoot == "" {
		driverRoot = "/"
	}
	paths := []string{""}
	for _, dir := range libDirs {
		p := filepath.Join(driverRoot, dir, "libnvidia-ml.so.1")
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
			r := &nvmlReader{lib: lib, handles: map[string]nvml.Device{}}
			return r, func() { r.mu.Lock(); lib.Shutdown(); r.mu.Unlock() }, nil
		case nvml.ERROR_LIBRARY_NOT_FOUND:
			continue
		default:
			return nil, nil, fmt.Errorf("initialising NVML for metrics: %s; check the driver with nvidia-smi, or use simulated GPUs", nvml.ErrorString(ret))
		}
	}
	return nil, nil, fmt.Errorf("NVML (libnvidia-ml.so.1) not found under %s; metrics need the NVIDIA driver", driverRoot)
}

func (r *nvmlReader) Read(uuid string) (Sample, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.handles[uuid]
	if !ok {
		var ret nvml.Return
		if h, ret = r.lib.DeviceGetHandleByUUID(uuid); ret != nvml.SUCCESS {
			return Unknown(), fmt.Errorf("GPU %s: %s", uuid, nvml.ErrorString(ret))
		}
		r.handles[uuid] = h
	}
	s := Unknown()
	if u, ret := h.GetUtilizationRates(); ret == nvml.SUCCESS {
		s.UtilizationPercent, s.MemoryUtilizationPercent = float64(u.Gpu), float64(u.Memory)
	}
	if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
		s.MemoryUsedBytes, s.MemoryTotalBytes = float64(m.Used), float64(m.Total)
	}
	if t, ret := h.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		s.TemperatureCelsius = float64(t)
	}
	if p, ret := h.GetPowerUsage(); ret == nvml.SUCCESS {
		s.PowerWatts = float64(p) / 1000 // milliwatts
	}
	return s, nil
}
