//go:build !cgo || nonvml

package nvml

import (
	"fmt"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// Linked reports whether this binary can load NVML itself. gantry-runtime
// is built with the nonvml tag (a static binary, which cannot dlopen a
// library linked against the host's C library) and asks the gantry binary
// instead (see package discover).
const Linked = false

// Discover cannot load NVML in a binary built without cgo or with the
// nonvml tag; it says so.
func Discover(opts Options) (*gpu.System, error) {
	return nil, fmt.Errorf("%w: this binary was built without NVML (without cgo, or with the nonvml tag); use the gantry binary, rebuild it with cgo, or %s", ErrNoNVML, gpu.SimulateAdvice)
}
