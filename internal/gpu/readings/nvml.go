//go:build cgo

package readings

import (
	"fmt"
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
	r := &nvmlReader{lib: lib, handles: map[string]nvml.Device{}}
	return r, func() { r.mu.Lock(); shutdown(); r.mu.Unlock() }, nil
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
