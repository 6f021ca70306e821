//go:build !cgo

package nvml

import (
	"fmt"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// Discover cannot load NVML in a binary built without cgo; it says so.
func Discover(opts Options) (*gpu.System, error) {
	return nil, fmt.Errorf("%w: this binary was built without cgo (CGO_ENABLED=0), which loading NVML needs; rebuild with cgo or use --gpus sim:h100x8 to simulate GPUs", ErrNoNVML)
}
