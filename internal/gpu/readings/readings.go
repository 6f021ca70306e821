// Package readings reads a GPU's live values (utilisation, memory,
// temperature, power) through NVML, or deterministic ones for simulated
// GPUs. It is kept apart from package metrics so that front ends that only
// need readings (gantry serve) do not link Prometheus and gRPC.
package readings

import (
	"fmt"
	"hash/fnv"
	"math"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// Sample is one reading of a GPU. A field the GPU cannot report (such as
// utilisation on a MIG-enabled GPU) is NaN, and its metric is left out.
type Sample struct {
	UtilizationPercent       float64
	MemoryUtilizationPercent float64
	MemoryUsedBytes          float64
	MemoryTotalBytes         float64
	TemperatureCelsius       float64
	PowerWatts               float64
}

// Unknown is a Sample with every field unknown.
func Unknown() Sample {
	n := math.NaN()
	return Sample{n, n, n, n, n, n}
}

// Reader reads a GPU's current values by UUID.
type Reader interface {
	Read(uuid string) (Sample, error)
}

// simReader gives simulated GPUs steady values made from their UUIDs, so
// that dashboards and tests see distinct, repeatable numbers.
type simReader struct {
	devices map[string]gpu.Device
}

// NewSim returns the Reader of a simulated system.
func NewSim(sys *gpu.System) Reader {
	r := simReader{devices: map[string]gpu.Device{}}
	for _, d := range sys.Devices {
		r.devices[d.UUID] = d
	}
	return r
}

func (r simReader) Read(uuid string) (Sample, error) {
	d, ok := r.devices[uuid]
	if !ok {
		return Unknown(), fmt.Errorf("simulated GPU %s: no such GPU", uuid)
	}
	h := fnv.New32a()
	h.Write([]byte(uuid))
	v := h.Sum32()
	total := float64(d.MemoryMiB) * (1 << 20)
	s := Sample{
		UtilizationPercent:       float64(v % 101),
		MemoryUtilizationPercent: float64(v / 101 % 101),
		MemoryTotalBytes:         total,
		MemoryUsedBytes:          float64(uint64(total) / 100 * uint64(v/7%100)),
		TemperatureCelsius:       float64(30 + v/11%50),
		PowerWatts:               float64(60 + v/13%600),
	}
	if d.MIGEnabled {
		// As on real GPUs: NVML has no GPU utilisation for a MIG-enabled GPU.
		s.UtilizationPercent, s.MemoryUtilizationPercent = math.NaN(), math.NaN()
	}
	return s, nil
}
