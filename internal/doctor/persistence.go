package doctor

import (
	"fmt"
	"strings"

	"github.com/gantry-gpu/gantry/internal/config"
)

// gpuPersistence is one GPU's persistence mode as NVML reports it.
type gpuPersistence struct {
	Index   int
	Enabled bool
	// Err is set when NVML could not read the mode of this GPU.
	Err error
}

// checkPersistence reports whether every GPU has persistence mode on. It
// is advice, never a failure: without it the driver tears the GPUs down
// when the last client exits, so each container start pays their
// initialisation again.
func checkPersistence(cfg config.Config, nvmlCheck Check) Check {
	if isSim(cfg) {
		return skip(CheckPersistence, "not read: GPUs are simulated (--gpus %s)", cfg.GPUs)
	}
	if c := after(CheckPersistence, nvmlCheck); c != nil {
		return *c
	}
	modes, err := persistenceModes(cfg.DriverRoot)
	if err != nil {
		return skip(CheckPersistence, "not read: %v", err)
	}
	return persistenceCheck(modes)
}

// persistenceCheck turns the GPUs' modes into the check: always a pass,
// naming the GPUs that run without persistence mode and what to do.
func persistenceCheck(modes []gpuPersistence) Check {
	if len(modes) == 0 {
		return skip(CheckPersistence, "not read: NVML lists no GPUs")
	}
	var off, unknown []string
	for _, m := range modes {
		switch {
		case m.Err != nil:
			unknown = append(unknown, fmt.Sprintf("GPU %d (%v)", m.Index, m.Err))
		case !m.Enabled:
			off = append(off, fmt.Sprint(m.Index))
		}
	}
	if len(off) == 0 && len(unknown) == 0 {
		return pass(CheckPersistence, "enabled on all %d GPUs", len(modes))
	}
	var parts []string
	if len(off) > 0 {
		gpus := "GPU " + off[0]
		if len(off) > 1 {
			gpus = "GPUs " + strings.Join(off, ", ")
		}
		parts = append(parts, fmt.Sprintf("persistence mode off on %s (containers start slower; nvidia-smi -pm 1 or nvidia-persistenced)", gpus))
	}
	if len(unknown) > 0 {
		parts = append(parts, "mode unreadable on "+strings.Join(unknown, ", "))
	}
	return pass(CheckPersistence, "%s", strings.Join(parts, "; "))
}
