// Package discover turns a configuration into what Gantry knows about a host:
// the GPUs (from NVML or the simulator) and the driver's files (from the driver
// root). It is the one place that chooses a backend, so every front end (the
// gantry CLI, the runtime shim, the device plugin) sees GPUs the same way.
package discover

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/nvml"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
	"github.com/gantry-gpu/gantry/internal/kubeletckpt"
	"github.com/gantry-gpu/gantry/internal/request"
)

// GPUs returns the GPUs the configured backend reports. light is for the
// container-create and CDI paths, which need only each GPU's index, minor,
// UUID and bus id: it reads them from /proc/driver/nvidia (a fraction of a
// millisecond) instead of loading and initialising NVML (11 ms or more on an
// H100 host), and falls back to NVML when procfs cannot answer (MIG devices
// exist, or the driver's proc files are not visible). A binary built without
// NVML (gantry-runtime) gets NVML's answer from the gantry binary: see
// HelperCommand.
func GPUs(c config.Config, light bool) (*gpu.System, error) {
	if spec, ok := strings.CutPrefix(c.GPUs, "sim:"); ok {
		return sim.Load(spec)
	}
	if c.GPUs != "nvml" {
		return nil, fmt.Errorf("--gpus %q: %w", c.GPUs, config.ValidateGPUs(c.GPUs))
	}
	if light {
		if sys, err := nvml.DiscoverProcfs("/proc"); err == nil && len(sys.Devices) > 0 {
			return sys, nil
		}
	}
	return nvmlGPUs(c, light)
}

// nvmlGPUs asks NVML: in this process when the binary links it (gantry, the
// plugins), else through the gantry binary (gantry-runtime, see helper.go).
func nvmlGPUs(c config.Config, light bool) (*gpu.System, error) {
	opts := nvml.Options{DriverRoot: c.DriverRoot, Light: light}
	if nvml.Linked {
		return nvml.Discover(opts)
	}
	self, _ := os.Executable()
	path, err := helperPath(c, self)
	if err != nil {
		return nil, err
	}
	if sameFile(path, self) {
		// A gantry built without NVML would only ask itself again.
		return nvml.Discover(opts)
	}
	return viaHelper(path, c, light)
}

func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// Driver returns the driver files under the configured driver root.
func Driver(c config.Config) (*driver.Inventory, error) {
	return driver.Discover(driver.Options{
		Root:               c.DriverRoot,
		DevRoot:            c.EffectiveDevRoot(),
		LibrarySearchPaths: c.LibrarySearchPaths,
	})
}

// RequestOptions are the host's rules for reading a container's GPU request,
// from the configuration: one place for every front end that reads requests
// (gantry-runtime and gantry-hook), so that they cannot drift apart. It lives
// here, not beside the hooks in containerhook, because the CDI hook binary
// links containerhook and must not link the configuration.
func RequestOptions(cfg config.Config) request.Options {
	opts := request.DefaultOptions()
	opts.AcceptEnvWhenUnprivileged = cfg.Runtime.AcceptEnvUnprivileged
	opts.AcceptVolumeMounts = cfg.Runtime.AcceptVolumeMounts
	opts.DisableRequire = cfg.Runtime.DisableRequire
	opts.SwarmResource = cfg.Runtime.SwarmResource
	if cfg.CDI.Kind != "" {
		opts.DefaultKind = cfg.CDI.Kind
	}
	if cfg.CDI.AnnotationPrefixes != nil {
		opts.AnnotationPrefixes = cfg.CDI.AnnotationPrefixes
	}
	if cfg.Runtime.KubernetesEnv != config.KubernetesEnvAny {
		dir := cfg.Runtime.KubeletDir
		if dir == "" {
			dir = kubeletckpt.DefaultKubeletDir
		}
		opts.Allocated = func(podUID, container string) ([]string, error) {
			return KubeletAllocated(dir, podUID, container)
		}
		opts.KubeletPluginDir = KubeletPluginDir(dir)
	}
	return opts
}

// KubeletRegistrationDirs are the directories under the kubelet's root
// where it takes plugin registrations: device plugins dial kubelet.sock in
// device-plugins/, DRA and CSI plugins put their sockets in plugins_registry/.
var KubeletRegistrationDirs = []string{"device-plugins", "plugins_registry"}

// KubeletPluginDir is request.Options.KubeletPluginDir for the kubelet
// root dir: whether a bind's host source is one of the kubelet's
// registration directories (KubeletRegistrationDirs) or a directory above
// one (a bind of the kubelet's root, or of /, gives the container those
// too). The source must be a clean absolute path; both sides are compared
// as the kernel will mount them, every link resolved: a source that merely looks like the directory (a copy
// elsewhere, a sibling with a longer name, a subdirectory of it) does not
// match, and one that does not exist matches nothing.
func KubeletPluginDir(dir string) func(source string) (string, bool) {
	return func(source string) (string, bool) {
		// Only a clean absolute path (as containerd's CRI hands it,
		// links already resolved): no lexical ".." for a link to redirect.
		if !filepath.IsAbs(source) || filepath.Clean(source) != source {
			return "", false
		}
		src, err := filepath.EvalSymlinks(source)
		if err != nil {
			return "", false
		}
		for _, name := range KubeletRegistrationDirs {
			reg := filepath.Join(dir, name)
			resolved, err := filepath.EvalSymlinks(reg)
			if err != nil {
				continue
			}
			if resolved == src || src == "/" || strings.HasPrefix(resolved, src+"/") {
				return reg, true
			}
		}
		return "", false
	}
}

// KubeletAllocated is the NVIDIA_VISIBLE_DEVICES values the device plugins
// answered for a pod's container, from the kubelet's device checkpoint in
// the kubelet root directory dir (none when it allocated nothing).
func KubeletAllocated(dir, podUID, container string) ([]string, error) {
	cp, err := kubeletckpt.Read(dir)
	if err != nil {
		return nil, err
	}
	var vals []string
	for _, e := range cp.For(podUID, container) {
		if v := e.Env[request.EnvVisibleDevices]; v != "" {
			vals = append(vals, v)
		}
	}
	return vals, nil
}
