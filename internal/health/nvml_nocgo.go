//go:build !cgo

package health

import (
	"context"
	"fmt"

	gpunvml "github.com/gantry-gpu/gantry/internal/gpu/nvml"
)

// NewNVML returns a Source whose Run fails: a binary built without cgo cannot
// load NVML.
func NewNVML(driverRoot string, p Policy) Source { return noNVML{} }

type noNVML struct{}

func (noNVML) Run(context.Context, []string, chan<- Event) error {
	return fmt.Errorf("GPU health: %w: this binary was built without cgo, which loading NVML needs; rebuild with cgo or use simulated GPUs", gpunvml.ErrNoNVML)
}
