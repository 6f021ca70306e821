package draplugin

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpuowner"
	"github.com/gantry-gpu/gantry/internal/kubeapi"
	"github.com/gantry-gpu/gantry/internal/kubeletckpt"
)

// One GPU, one owner: the DRA plugin publishes only GPUs no live device
// plugin on the node offers. It learns what the device plugins offer from
// two places: the node's GPU owners directory (package gpuowner), where
// gantry-device-plugin records its GPUs while it runs, and the kubelet's
// device checkpoint (RegisteredDevices: what every device plugin,
// NVIDIA's too, advertised), counted only for resources the Node still has
// allocatable (a device plugin that stopped leaves its devices in the
// checkpoint until the kubelet next writes it). An overlap is refused at
// start, with an Event on the Node.

// selectSetting names the settings that choose this plugin's GPUs.
const selectSetting = "--devices (GANTRY_DRA_DEVICES)"

// OwnedGPUs are the GPUs d publishes (a MIG device as part of its GPU).
func (d *Driver) OwnedGPUs() []gpuowner.GPU {
	var out []gpuowner.GPU
	for _, dev := range d.devices {
		if g, ok := gpuowner.FromID(d.sys, dev.ID); ok && !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out
}

// ownersDir is the owners directory: the flag's, else gantry-gpu-owners in
// the kubelet root directory (the parent of the kubelet's plugins_registry
// directory; inside a registration directory of another name).
func ownersDir(f flags) string {
	if f.ownersDir != "" {
		return f.ownersDir
	}
	return filepath.Join(kubeletRoot(f), gpuowner.DirName)
}

// kubeletRoot is the kubelet root directory as far as the registration
// directory tells it.
func kubeletRoot(f flags) string {
	dir := filepath.Clean(f.registryDir)
	if filepath.Base(dir) == "plugins_registry" {
		dir = filepath.Dir(dir)
	}
	return dir
}

// kubeletRegistered are the device plugins' devices in the kubelet's
// checkpoint at path that map to GPUs of sys, one record per resource whose
// allocatable count on the Node is not zero (allocatable nil: every
// resource counts).
func kubeletRegistered(path string, sys *gpu.System, allocatable func(resource string) bool) ([]gpuowner.Record, error) {
	cp, err := kubeletckpt.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []gpuowner.Record
	for _, res := range slices.Sorted(maps.Keys(cp.Registered)) {
		gpus := gpuowner.FromIDs(sys, cp.Registered[res])
		if len(gpus) == 0 || (allocatable != nil && !allocatable(res)) {
			continue
		}
		out = append(out, gpuowner.Record{
			Owner:  "the device plugin of resource " + res,
			GPUs:   gpus,
			Where:  "registered with the kubelet, " + path,
			Select: "gantry.devices (GANTRY_DEVICES) if it is gantry-device-plugin",
		})
	}
	return out, nil
}

// claimGPUs records d's GPUs in the owners directory, or refuses (with an
// Event on the Node). client, when set, answers the Node's allocatable
// resources.
func claimGPUs(ctx context.Context, f flags, d *Driver, client kubernetes.Interface, log *slog.Logger) (*gpuowner.Registration, error) {
	rec := gpuowner.Record{Owner: gpuowner.DRAPlugin, Node: f.nodeName, GPUs: d.OwnedGPUs(), Select: selectSetting}
	var allocatable func(string) bool
	if client != nil && f.nodeName != "" {
		gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		node, err := client.CoreV1().Nodes().Get(gctx, f.nodeName, metav1.GetOptions{})
		cancel()
		if err != nil {
			log.Warn("reading the Node's allocatable resources; counting every device plugin resource in the kubelet's checkpoint", "err", err)
		} else {
			allocatable = func(res string) bool {
				q, ok := node.Status.Allocatable[corev1.ResourceName(res)]
				return ok && !q.IsZero()
			}
		}
	}
	cpPath := filepath.Join(f.hostRoot, kubeletRoot(f), "device-plugins", kubeletckpt.File)
	extra, err := kubeletRegistered(cpPath, d.sys, allocatable)
	if err != nil {
		log.Warn("reading the kubelet's device checkpoint; only the GPU owners directory is checked", "err", err)
	}
	reg, err := gpuowner.Register(ownersDir(f), rec, extra...)
	if err == nil {
		log.Info("GPU owner recorded", "file", reg.Path(), "gpus", len(rec.GPUs))
		return reg, nil
	}
	if errors.Is(err, gpuowner.ErrConflict) {
		if c, cerr := kubeapi.FromEnvironment(); cerr != nil {
			log.Warn("cannot post the refusal as an Event on the Node", "err", cerr)
		} else if perr := gpuowner.PostRefusal(ctx, c, f.nodeName, gpuowner.DRAPlugin, err); perr != nil {
			log.Warn("posting the refusal as an Event on the Node", "node", f.nodeName, "err", perr)
		}
	}
	return nil, err
}
