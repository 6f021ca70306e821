package edits

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gantry-gpu/gantry/internal/request"
)

// featureNodes are the device node globs (under the device root) each
// gated feature brings, as NVIDIA's runtime discovers them.
var featureNodes = map[request.Feature][]string{
	request.FeatureGDS:      {"/dev/nvidia-fs*"},
	request.FeatureMOFED:    {"/dev/infiniband/uverbs*", "/dev/infiniband/rdma_cm"},
	request.FeatureGDRCopy:  {"/dev/gdrdrv"},
	request.FeatureNVSwitch: {"/dev/nvidia-nvswitchctl", "/dev/nvidia-nvswitch*"},
}

// featureMounts are the host paths (under the driver root) a feature
// mounts read-only at the same path when they exist.
var featureMounts = map[request.Feature][]string{
	request.FeatureGDS: {"/etc/cufile.json", "/run/udev"},
}

// imexChannelDir holds the IMEX channel nodes, channel0, channel1, ...
const imexChannelDir = "/dev/nvidia-caps-imex-channels"

// featureEdits are the nodes and mounts of the features a request switched
// on and of its IMEX channels. A feature whose nodes are absent on this
// host is an error naming the variable: the image asked for a device class
// the node does not have, and running it without would fail later and
// less clearly.
func featureEdits(req *request.Request, devRoot, driverRoot string) (*Edits, error) {
	e := &Edits{}
	for _, fe := range request.FeatureEnv {
		if !hasFeature(req.Features, fe.Feature) {
			continue
		}
		var found int
		for _, pattern := range featureNodes[fe.Feature] {
			matches, err := filepath.Glob(filepath.Join(devRoot, pattern))
			if err != nil {
				return nil, err
			}
			sort.Strings(matches)
			for _, m := range matches {
				p := "/" + strings.TrimPrefix(strings.TrimPrefix(m, filepath.Clean(devRoot)), "/")
				n, err := statNode(devRoot, p)
				if err != nil {
					return nil, fmt.Errorf("%s=enabled: %w", fe.Env, err)
				}
				e.DeviceNodes = append(e.DeviceNodes, n)
				found++
			}
		}
		if found == 0 {
			return nil, fmt.Errorf("%w: %s=enabled but this host has none of %s under %s: load the driver for it, or unset %s",
				ErrFeatureMissing, fe.Env, strings.Join(featureNodes[fe.Feature], ", "), devRoot, fe.Env)
		}
		for _, p := range featureMounts[fe.Feature] {
			host := filepath.Join(driverRoot, p)
			if _, err := os.Stat(host); err == nil {
				e.Mounts = append(e.Mounts, Mount{HostPath: host, ContainerPath: p, Options: []string{"ro", "nosuid", "nodev", "bind"}})
			}
		}
	}
	switch req.IMEXChannels.Mode {
	case request.All:
		matches, err := filepath.Glob(filepath.Join(devRoot, imexChannelDir, "channel*"))
		if err != nil {
			return nil, err
		}
		sort.Strings(matches)
		for _, m := range matches {
			n, err := statNode(devRoot, imexChannelDir+"/"+filepath.Base(m))
			if err != nil {
				return nil, fmt.Errorf("%s=all: %w", request.EnvIMEXChannels, err)
			}
			e.DeviceNodes = append(e.DeviceNodes, n)
		}
	case request.List:
		for _, id := range req.IMEXChannels.IDs {
			n, err := statNode(devRoot, imexChannelDir+"/channel"+id)
			if err != nil {
				return nil, fmt.Errorf("%s: channel %s: %w (create it with the IMEX daemon, or ask for a channel that exists)", request.EnvIMEXChannels, id, err)
			}
			e.DeviceNodes = append(e.DeviceNodes, n)
		}
	}
	return e, nil
}

// ErrFeatureMissing means an enabled feature has no device on this host.
var ErrFeatureMissing = errors.New("device class not present")

func hasFeature(fs []request.Feature, f request.Feature) bool {
	for _, x := range fs {
		if x == f {
			return true
		}
	}
	return false
}

// DRINodes are the DRM card and render nodes of the selected GPUs, for
// containers asking for graphics or display: the udev links
// /dev/dri/by-path/pci-<domain:bus:dev.fn>-card and -render under the
// device root name them by the GPU's PCI address. A GPU without them (no
// nvidia-drm loaded, as on most compute nodes) gets none, silently.
func DRINodes(selected []Selected, devRoot string) (*Edits, error) {
	e := &Edits{}
	seen := map[string]bool{}
	for _, s := range selected {
		addr := kernelPCIAddress(s.GPU.PCIBusID)
		if addr == "" || seen[addr] {
			continue
		}
		seen[addr] = true
		for _, kind := range []string{"card", "render"} {
			link := filepath.Join(devRoot, "dev/dri/by-path", "pci-"+addr+"-"+kind)
			target, err := os.Readlink(link)
			if err != nil {
				continue
			}
			name := filepath.Base(target)
			if !strings.HasPrefix(name, "card") && !strings.HasPrefix(name, "renderD") {
				return nil, fmt.Errorf("%s points at %q, not a DRM card or render node", link, target)
			}
			n, err := statNode(devRoot, "/dev/dri/"+name)
			if err != nil {
				return nil, fmt.Errorf("GPU %s (%s): %w", s.Name(), s.GPU.PCIBusID, err)
			}
			e.DeviceNodes = append(e.DeviceNodes, n)
		}
	}
	return e, nil
}

// kernelPCIAddress turns NVML's "00000000:1B:00.0" into the kernel's
// "0000:1b:00.0" (a 4-digit domain, lower case), as sysfs and udev name it.
func kernelPCIAddress(busID string) string {
	domain, rest, ok := strings.Cut(strings.ToLower(busID), ":")
	if !ok || len(domain) < 4 || rest == "" {
		return ""
	}
	return domain[len(domain)-4:] + ":" + rest
}
