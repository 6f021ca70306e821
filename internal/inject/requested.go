package inject

import (
	"fmt"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

// RequestedGPUs is the physical GPUs spec's request names on sys (env,
// annotations, mounts, and CDI names of Gantry's own kind), whatever was
// injected into the spec already: for a MIG device, its GPU. A restore
// compares them with the GPUs the spec gives the container.
func RequestedGPUs(spec *ocispecs.Spec, cfg config.Config, sys *gpu.System) ([]gpu.Device, error) {
	req, err := ReadRequest(spec, cfg, NewRecord(FrontEndRuntime, "", ""))
	if err != nil {
		return nil, err
	}
	if _, err := ownCDINames(req, cfg.CDI.Kind); err != nil {
		return nil, err
	}
	sel, err := edits.Resolve(sys, req.Devices)
	if err != nil {
		return nil, fmt.Errorf("the request's devices: %w", err)
	}
	seen := map[int]bool{}
	var out []gpu.Device
	for _, s := range sel {
		if !seen[s.GPU.Minor] {
			seen[s.GPU.Minor] = true
			out = append(out, s.GPU)
		}
	}
	return out, nil
}
