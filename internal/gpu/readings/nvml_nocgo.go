//go:build !cgo

package readings

import "errors"

// NewNVML needs cgo (go-nvml); this binary was built without it.
func NewNVML(driverRoot string) (Reader, func(), error) {
	return nil, nil, errors.New("NVML readings need a binary built with cgo (CGO_ENABLED=1)")
}
