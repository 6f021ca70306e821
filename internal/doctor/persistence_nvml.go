//go:build cgo

package doctor

import (
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gantry-gpu/gantry/internal/gpu/nvml"
)

// persistenceModes reads every GPU's persistence mode through NVML.
func persistenceModes(driverRoot string) ([]gpuPersistence, error) {
	lib, shutdown, err := nvml.Open(driverRoot)
	if err != nil {
		return nil, err
	}
	defer shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("counting GPUs: %s", gonvml.ErrorString(ret))
	}
	modes := make([]gpuPersistence, 0, n)
	for i := 0; i < n; i++ {
		m := gpuPersistence{Index: i}
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret == gonvml.SUCCESS {
			var mode gonvml.EnableState
			mode, ret = dev.GetPersistenceMode()
			m.Enabled = mode == gonvml.FEATURE_ENABLED
		}
		if ret != gonvml.SUCCESS {
			m.Err = fmt.Errorf("%s", gonvml.ErrorString(ret))
		}
		modes = append(modes, m)
	}
	return modes, nil
}
