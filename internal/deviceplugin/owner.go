package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpuowner"
	"github.com/gantry-gpu/gantry/internal/kubeapi"
	"github.com/gantry-gpu/gantry/internal/request"
)

// One GPU, one owner: on a node where the DRA plugin offers some GPUs, this
// plugin offers only the others (gantry.devices), and it refuses to start
// when a live DRA plugin (or any other owner in the node's GPU owners
// directory, package gpuowner) already offers one of its GPUs. The refusal
// names the GPUs, the other plugin and the settings that fix it, and is
// posted as an Event on the Node.

// selectSetting names the settings that choose this plugin's GPUs, for the
// other plugin's error.
const selectSetting = "gantry.devices (GANTRY_DEVICES, --devices)"

// onlyDevices keeps the GPUs that ids (a comma list of indices, UUIDs or
// bus IDs; empty: all) names, with their MIG devices. from names where ids
// came from, for errors.
func onlyDevices(sys *gpu.System, ids, from string) (*gpu.System, error) {
	if strings.TrimSpace(ids) == "" {
		return sys, nil
	}
	sel, err := edits.Resolve(sys, request.Selection{Mode: request.List, IDs: strings.Split(ids, ",")})
	if err != nil {
		return nil, fmt.Errorf("%w: gantry.devices %q (%s): %v", ErrConfig, ids, from, err)
	}
	keep := map[string]bool{}
	for _, s := range sel {
		if s.MIG != nil {
			return nil, fmt.Errorf("%w: gantry.devices %q (%s): %s is a MIG device; name whole GPUs (index, UUID or bus ID): the plugin offers a GPU's MIG devices with it", ErrConfig, ids, from, s.Name())
		}
		keep[s.GPU.UUID] = true
	}
	out := *sys
	out.Devices = nil
	for _, d := range sys.Devices {
		if keep[d.UUID] {
			out.Devices = append(out.Devices, d)
		}
	}
	return &out, nil
}

// ownersDir is the owners directory: the configured one, else
// gantry-gpu-owners in the kubelet root directory (the parent of the
// kubelet's device-plugins directory), as the DRA plugin finds it. A
// kubelet directory of another name says nothing of the root: the owners
// directory is then inside it.
func ownersDir(cfg Config) string {
	if cfg.Gantry.OwnersDir != "" {
		return cfg.Gantry.OwnersDir
	}
	dir := filepath.Clean(cfg.Gantry.KubeletDir)
	if filepath.Base(dir) == "device-plugins" {
		dir = filepath.Dir(dir)
	}
	return filepath.Join(dir, gpuowner.DirName)
}

// ownedGPUs are the GPUs p offers, each once, in device order.
func ownedGPUs(p *Plugin) []gpuowner.GPU {
	var out []gpuowner.GPU
	seen := map[gpuowner.GPU]bool{}
	for _, r := range p.Resources() {
		for _, d := range r.Devices {
			g := gpuowner.GPU{UUID: d.GPU, Index: strconv.Itoa(d.GPUIndex)}
			if d.MIG {
				g.MIG = d.UUID
			}
			if !seen[g] {
				seen[g] = true
				out = append(out, g)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b gpuowner.GPU) int {
		x, _ := strconv.Atoi(a.Index)
		y, _ := strconv.Atoi(b.Index)
		return x - y
	})
	return out
}

// claimGPUs records p's GPUs in the node's owners directory, or refuses
// (with an Event on the Node when the API server can be reached).
func claimGPUs(ctx context.Context, cfg Config, p *Plugin, getenv func(string) string, log *slog.Logger) (*gpuowner.Registration, error) {
	node := getenv("NODE_NAME")
	rec := gpuowner.Record{Owner: gpuowner.DevicePlugin, Node: node, GPUs: ownedGPUs(p), Select: selectSetting}
	dir := ownersDir(cfg)
	reg, err := gpuowner.Register(dir, rec)
	if err == nil {
		log.Info("GPU owner recorded", "file", reg.Path(), "gpus", len(rec.GPUs))
		return reg, nil
	}
	if errors.Is(err, gpuowner.ErrConflict) && node != "" {
		if c, cerr := kubeapi.FromEnv(getenv); cerr != nil {
			log.Warn("cannot post the refusal as an Event on the Node", "err", cerr)
		} else if perr := gpuowner.PostRefusal(ctx, c, node, gpuowner.DevicePlugin, err); perr != nil {
			log.Warn("posting the refusal as an Event on the Node", "node", node, "err", perr)
		}
	}
	return nil, err
}
