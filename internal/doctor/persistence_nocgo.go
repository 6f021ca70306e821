//go:build !cgo

package doctor

import "errors"

// persistenceModes needs NVML, which a binary without cgo cannot load.
func persistenceModes(string) ([]gpuPersistence, error) {
	return nil, errors.New("this binary was built without cgo, which loading NVML needs")
}
