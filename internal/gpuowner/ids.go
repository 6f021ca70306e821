package gpuowner

import (
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// FromIDs maps device IDs as the device plugins give them to the kubelet
// (GPU and MIG UUIDs, "UUID::N" replicas, indices "0" and "0:1" with
// deviceIDStrategy index) to the GPUs of sys, each once. IDs sys does not
// know are left out (another vendor's devices).
func FromIDs(sys *gpu.System, ids []string) []GPU {
	var out []GPU
	seen := map[GPU]bool{}
	for _, id := range ids {
		g, ok := FromID(sys, id)
		if ok && !seen[g] {
			seen[g] = true
			out = append(out, g)
		}
	}
	return out
}

// FromID maps one device ID (see FromIDs).
func FromID(sys *gpu.System, id string) (GPU, bool) {
	if sys == nil {
		return GPU{}, false
	}
	id, _, _ = strings.Cut(strings.TrimSpace(id), "::")
	for _, d := range sys.Devices {
		idx := strconv.Itoa(d.Index)
		if id == d.UUID || id == idx {
			return GPU{UUID: d.UUID, Index: idx}, true
		}
		for _, m := range d.MIGDevices {
			if id == m.UUID || id == m.Name() {
				return GPU{UUID: d.UUID, Index: idx, MIG: m.UUID}, true
			}
		}
	}
	return GPU{}, false
}
