//go:build cgo && !nonvml

package nvml

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// Open loads and initialises NVML for a caller that keeps it open, such as
// the device plugin's health watcher, looking under driverRoot as Discover
// does. Call shutdown when done. Loading and unloading share Discover's lock,
// since go-nvml keeps process-wide state.
func Open(driverRoot string) (lib nvml.Interface, shutdown func(), err error) {
	mu.Lock()
	defer mu.Unlock()
	lib, err = open(driverRoot)
	if err != nil {
		return nil, nil, err
	}
	return lib, func() {
		mu.Lock()
		defer mu.Unlock()
		lib.Shutdown()
	}, nil
}
