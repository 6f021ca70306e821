package inject

import (
	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpuholders"
	"github.com/gantry-gpu/gantry/internal/kubeletckpt"
	"github.com/gantry-gpu/gantry/internal/request"
)

// checkHolders refuses the selected GPUs of a container a kubelet created
// when another running pod holds one (runtime.exclusive-gpus, package
// gpuholders): the last line against a GPU handed out twice on a
// Kubernetes node, after the plugins' own refusal to offer one GPU twice.
// Other containers (docker run on the node, tests) are not checked: the
// kubelet's records are about pods, and a create outside Kubernetes reads
// none of its files.
func checkHolders(cfg config.Config, req *request.Request, sys *gpu.System, sel []edits.Selected) error {
	if !cfg.Runtime.ExclusiveGPUs || len(sel) == 0 || req.PodUID == "" {
		return nil
	}
	units := make([]gpuholders.Unit, 0, len(sel))
	for _, s := range sel {
		u := gpuholders.Unit{UUID: s.GPU.UUID, Index: s.GPU.Index}
		if s.MIG != nil {
			u.MIG = s.MIG.UUID
		}
		units = append(units, u)
	}
	dir := cfg.Runtime.KubeletDir
	if dir == "" {
		dir = kubeletckpt.DefaultKubeletDir
	}
	// A kubelet plugin by construction (request.Request.KubeletPlugin) is
	// trusted as a privileged plugin pod is: it could hand itself the GPUs
	// through the kubelet anyway, and must start while pods hold them.
	return gpuholders.Check(gpuholders.Options{KubeletDir: dir}, sys, req.PodUID, req.Container, req.Privileged || req.KubeletPlugin != "", units)
}
