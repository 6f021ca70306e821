package request

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/parser"
)

// Names of the variables of the NVIDIA env contract.
const (
	EnvVisibleDevices     = "NVIDIA_VISIBLE_DEVICES"
	EnvDriverCapabilities = "NVIDIA_DRIVER_CAPABILITIES"
	EnvRequirePrefix      = "NVIDIA_REQUIRE_"
	EnvRequireCUDA        = "NVIDIA_REQUIRE_CUDA"
	EnvRequireJetpack     = "NVIDIA_REQUIRE_JETPACK" // a Jetson option, not a requirement
	EnvDisableRequire     = "NVIDIA_DISABLE_REQUIRE"
	EnvMIGConfigDevices   = "NVIDIA_MIG_CONFIG_DEVICES"
	EnvMIGMonitorDevices  = "NVIDIA_MIG_MONITOR_DEVICES"
	EnvCUDAVersion        = "CUDA_VERSION"
)

// VolumeMountsRoot is the container directory under which mount
// destinations name devices (…/0, …/GPU-uuid, …/all, …/cdi/vendor/class/name).
const VolumeMountsRoot = "/var/run/nvidia-container-devices"

// configFile is Gantry's config file, named in errors that a setting of it
// fixes (internal/config.DefaultPath; request does not import config).
const configFile = "/etc/gantry/config.toml"

// DefaultAnnotationPrefix is the annotation key prefix whose values are
// comma lists of CDI device names.
const DefaultAnnotationPrefix = "cdi.k8s.io/"

// DefaultKind is the CDI kind of NVIDIA GPUs.
const DefaultKind = "nvidia.com/gpu"

// ErrNotPrivileged is wrapped by the error for a request only privileged
// containers (CAP_SYS_ADMIN in the bounding set) may make.
var ErrNotPrivileged = errors.New("container is not privileged")

// Input is the part of an OCI runtime spec a request is read from.
type Input struct {
	// Env is process.env: KEY=VALUE entries; for a repeated key the last wins.
	Env []string
	// Annotations are the spec's annotations.
	Annotations map[string]string
	// MountDestinations are the destinations of the spec's mounts whose
	// source is /dev/null (NVIDIA reads only those; see DeviceMountDestinations).
	MountDestinations []string
	// Privileged is whether CAP_SYS_ADMIN is in the process's bounding
	// capability set (see IsPrivileged).
	Privileged bool
	// Binds are the spec's bind mounts (BindMounts), read only for a
	// Kubernetes container under Options.Allocated (KubeletPluginDir).
	Binds []Bind
}

// Options are the host's settings for reading requests.
type Options struct {
	// AcceptEnvWhenUnprivileged honours NVIDIA_VISIBLE_DEVICES in containers
	// that are not privileged (accept-nvidia-visible-devices-envvar-when-unprivileged).
	AcceptEnvWhenUnprivileged bool
	// AcceptVolumeMounts reads the device list from mounts under
	// VolumeMountsRoot (accept-nvidia-visible-devices-as-volume-mounts).
	AcceptVolumeMounts bool
	// AnnotationPrefixes are the annotation key prefixes holding CDI names.
	AnnotationPrefixes []string
	// DefaultKind is the CDI kind bare device IDs belong to (Request.Kind).
	DefaultKind string
	// SwarmResource names env variables read instead of
	// NVIDIA_VISIBLE_DEVICES when any of them is set (Docker Swarm's
	// generic resources, e.g. DOCKER_RESOURCE_GPU); their lists are joined.
	SwarmResource []string
	// DisableRequire skips every NVIDIA_REQUIRE_* check, as the image's
	// NVIDIA_DISABLE_REQUIRE=true does (the host's disable-require).
	DisableRequire bool
	// LenientCapabilities drops unknown NVIDIA_DRIVER_CAPABILITIES names
	// with a warning instead of refusing the container.
	LenientCapabilities bool
	// Allocated, when set, is asked what the kubelet allocated to a
	// container a kubelet created (KubernetesContainer): the
	// NVIDIA_VISIBLE_DEVICES values its device plugins answered. An
	// unprivileged Kubernetes container then gets from the env only devices
	// among those, so an image or pod that sets the variable itself gets no
	// GPU (runtime.kubernetes-env = "allocated").
	Allocated func(podUID, container string) ([]string, error)
	// KubeletPluginDir, when set with Allocated, reports whether a bind's
	// host source gives the container a directory where the kubelet takes
	// plugin registrations (the directory itself or a parent of it), and
	// which one. A Kubernetes container with such a writable bind is a
	// kubelet plugin by construction: its own NVIDIA_VISIBLE_DEVICES is
	// honoured as it stands (Request.KubeletPlugin says why).
	KubeletPluginDir func(source string) (dir string, ok bool)
}

// DefaultOptions are NVIDIA's defaults.
func DefaultOptions() Options {
	return Options{
		AcceptEnvWhenUnprivileged: true,
		AnnotationPrefixes:        []string{DefaultAnnotationPrefix},
		DefaultKind:               DefaultKind,
	}
}

// Parse decides what a container asks for. Where the device request comes
// from, first match wins: CDI annotations; then, if AcceptVolumeMounts,
// mounts under VolumeMountsRoot; then the env (NVIDIA_VISIBLE_DEVICES or
// the swarm variables), if the container is privileged or
// AcceptEnvWhenUnprivileged. A container that asks for nothing gets a Void
// request and no error, whatever else its env says.
func Parse(in Input, opts Options) (*Request, error) {
	env, err := ParseEnv(in.Env)
	if err != nil {
		return nil, err
	}
	req := &Request{Kind: opts.DefaultKind}
	req.Legacy = env[EnvCUDAVersion] != "" && env[EnvRequireCUDA] == ""

	if err := req.devicesFrom(in, env, opts); err != nil {
		return nil, err
	}
	if !req.Wants() {
		return &Request{Kind: opts.DefaultKind, Legacy: req.Legacy, Warnings: req.Warnings}, nil
	}

	caps, set := env[EnvDriverCapabilities]
	switch {
	case !set && req.Legacy:
		// Images from before the variable existed expect every library.
		req.Capabilities, _, _ = ParseCapabilities("all", false)
	default:
		var ignored []string
		req.Capabilities, ignored, err = ParseCapabilities(caps, opts.LenientCapabilities)
		if err != nil {
			return nil, err
		}
		for _, c := range ignored {
			req.Warnings = append(req.Warnings, fmt.Sprintf("ignoring unknown driver capability %q in %s", c, EnvDriverCapabilities))
		}
	}

	if req.Requirements, err = requirementsFrom(env, opts.DisableRequire, req.Legacy); err != nil {
		return nil, err
	}
	for _, m := range []struct {
		name string
		dst  *Selection
	}{{EnvMIGConfigDevices, &req.MIGConfig}, {EnvMIGMonitorDevices, &req.MIGMonitor}} {
		v := env[m.name]
		if strings.TrimSpace(v) == "" {
			continue
		}
		if !in.Privileged {
			return nil, fmt.Errorf("%w: %s=%q is only honoured in privileged containers; run the container privileged (CAP_SYS_ADMIN) or unset it", ErrNotPrivileged, m.name, v)
		}
		if *m.dst, err = ParseMIGSelection(m.name, v); err != nil {
			return nil, err
		}
	}
	req.Features = featuresFrom(env)
	req.Privileged = in.Privileged
	req.PodUID, req.Container, _ = KubernetesContainer(in.Annotations)
	if v, ok := env[EnvIMEXChannels]; ok {
		sel, err := ParseIMEXChannels(v)
		if err != nil {
			return nil, err
		}
		if sel.Mode != Void {
			if in.Privileged || opts.AcceptEnvWhenUnprivileged {
				req.IMEXChannels = sel
			} else {
				req.Warnings = append(req.Warnings, fmt.Sprintf("ignoring %s in an unprivileged container (runtime.accept-env-unprivileged is false)", EnvIMEXChannels))
			}
		}
	}
	if opts.AcceptVolumeMounts {
		if err := req.addIMEXMounts(in.MountDestinations); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// devicesFrom fills Source, Devices and CDIDevices.
func (req *Request) devicesFrom(in Input, env map[string]string, opts Options) error {
	names, err := annotationDevices(in.Annotations, opts.AnnotationPrefixes)
	if err != nil {
		return err
	}
	if len(names) > 0 {
		req.Source, req.CDIDevices = SourceCDIAnnotations, names
		return nil
	}

	if opts.AcceptVolumeMounts {
		items, cdi, err := mountDevices(in.MountDestinations)
		if err != nil {
			return err
		}
		if len(items) > 0 || len(cdi) > 0 {
			sel, more, err := ParseSelection("volume-mount device list", strings.Join(items, ","))
			if err != nil {
				return err
			}
			req.Source, req.Devices, req.CDIDevices = SourceMounts, sel, appendUnique(cdi, more...)
			return nil
		}
	}

	vars := []string{}
	for _, v := range opts.SwarmResource {
		if _, ok := env[v]; ok {
			vars = append(vars, v)
		}
	}
	if len(vars) == 0 {
		vars = []string{EnvVisibleDevices}
	}
	var values []string
	set := false
	for _, v := range vars {
		if val, ok := env[v]; ok {
			set = true
			values = append(values, val)
		}
	}
	name := strings.Join(vars, ",")
	value := strings.Join(values, ",")
	if !set && req.Legacy {
		value = "all"
	}
	sel, cdi, err := ParseSelection(name, value)
	if err != nil {
		if !opts.AcceptVolumeMounts && path.Clean(strings.TrimSpace(value)) == VolumeMountsRoot {
			// The device plugin's volume-mounts strategy: the list is in the
			// mounts, which this node's runtime was not told to read.
			return fmt.Errorf("%w: %s=%s: the devices are listed as volume mounts under %s (the device plugin's volume-mounts strategy), which this runtime does not read: set runtime.accept-volume-mounts = true in the node's Gantry config (%s, or the file GANTRY_CONFIG names; NVIDIA's accept-nvidia-visible-devices-as-volume-mounts), or use another device list strategy",
				ErrInvalid, name, value, VolumeMountsRoot, configFile)
		}
		return err
	}
	if sel.Mode == Void && len(cdi) == 0 {
		return nil
	}
	if opts.Allocated != nil && !in.Privileged {
		if pod, ctr, ok := KubernetesContainer(in.Annotations); ok {
			// A kubelet plugin by construction keeps its own variable.
			if req.KubeletPlugin = kubeletPluginRule(in.Binds, opts); req.KubeletPlugin == "" {
				vals, err := opts.Allocated(pod, ctr)
				if err != nil {
					req.Warnings = append(req.Warnings, fmt.Sprintf("ignoring %s=%s: the kubelet's allocations cannot be read (%v); runtime.kubernetes-env = \"any\" trusts the variable", name, value, err))
					return nil
				}
				allowed := strings.Join(vals, ",")
				if allowed == "" {
					req.Warnings = append(req.Warnings, fmt.Sprintf("ignoring %s=%s: the kubelet allocated no GPU to pod %s container %s (an image's or pod's own variable does not count: ask for nvidia.com/gpu in resources.limits)", name, value, pod, ctr))
					return nil
				}
				if !subset(value, allowed) {
					req.Warnings = append(req.Warnings, fmt.Sprintf("%s=%s is not what the kubelet allocated to pod %s container %s: using its allocation %s", name, value, pod, ctr, allowed))
					if sel, cdi, err = ParseSelection("the kubelet's allocation", allowed); err != nil {
						return err
					}
					req.VisibleDevices = allowed
				} else if name == EnvVisibleDevices {
					// One entry with the value used: an env that lists the
					// variable twice (the image's all, then the kubelet's
					// value) reads all to a program that takes the first.
					req.VisibleDevices = value
				}
			}
		}
	}
	if !in.Privileged && !opts.AcceptEnvWhenUnprivileged {
		req.Warnings = append(req.Warnings, fmt.Sprintf("ignoring %s in an unprivileged container (runtime.accept-env-unprivileged is false; NVIDIA's accept-nvidia-visible-devices-envvar-when-unprivileged); use volume mounts or CDI annotations", name))
		return nil
	}
	req.Source, req.Devices, req.CDIDevices = SourceEnv, sel, cdi
	return nil
}

// subset reports whether every item of the comma list value is in the
// comma list of.
func subset(value, of string) bool {
	set := map[string]bool{}
	for it := range strings.SplitSeq(of, ",") {
		set[strings.TrimSpace(it)] = true
	}
	for it := range strings.SplitSeq(value, ",") {
		if it = strings.TrimSpace(it); it != "" && !set[it] {
			return false
		}
	}
	return true
}

// ParseEnv turns OCI process.env entries into a map; for a repeated key
// the last entry wins, as in Go's os/exec and runc. An entry without '=' is
// refused, as NVIDIA's runtime and runc refuse it.
func ParseEnv(entries []string) (map[string]string, error) {
	env := make(map[string]string, len(entries))
	for _, e := range entries {
		k, v, ok := strings.Cut(e, "=")
		if !ok {
			return nil, fmt.Errorf("%w: environment entry %q has no '=': write it as %s= or remove it", ErrInvalid, e, e)
		}
		env[k] = v
	}
	return env, nil
}

// requirementsFrom collects NVIDIA_REQUIRE_* (but NVIDIA_REQUIRE_JETPACK),
// sorted by name so errors are stable, then the legacy CUDA_VERSION rule.
func requirementsFrom(env map[string]string, disable, legacy bool) ([]Requirement, error) {
	if disable {
		return nil, nil
	}
	if v, ok := env[EnvDisableRequire]; ok {
		// NVIDIA reads it with strconv.ParseBool; anything unparsable is false.
		if d, _ := strconv.ParseBool(v); d {
			return nil, nil
		}
	}
	var names []string
	for k, v := range env {
		if strings.HasPrefix(k, EnvRequirePrefix) && !strings.HasPrefix(k, EnvRequireJetpack) && strings.TrimSpace(v) != "" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var reqs []Requirement
	for _, k := range names {
		r, err := ParseRequirement(k, env[k])
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, r)
	}
	if legacy {
		r, err := legacyRequirement(env[EnvCUDAVersion])
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, r)
	}
	return reqs, nil
}

// annotationDevices reads CDI names from annotations whose key has one of
// prefixes, keys in sorted order, each value a comma list.
func annotationDevices(annotations map[string]string, prefixes []string) ([]string, error) {
	var keys []string
	for k := range annotations {
		for _, p := range prefixes {
			if p != "" && strings.HasPrefix(k, p) {
				keys = append(keys, k)
				break
			}
		}
	}
	sort.Strings(keys)
	var names []string
	for _, k := range keys {
		for item := range strings.SplitSeq(annotations[k], ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			if _, _, _, err := parser.ParseQualifiedName(item); err != nil {
				return nil, fmt.Errorf("%w: annotation %s=%q: %q is not a fully qualified CDI device name (%v); write vendor.com/class=name, e.g. %s=0", ErrInvalid, k, annotations[k], item, err, DefaultKind)
			}
			names = appendUnique(names, item)
		}
	}
	return names, nil
}

// mountDevices reads the device list from mount destinations under
// VolumeMountsRoot: plain items (…/0, …/all) and CDI names
// (…/cdi/vendor/class/name or …/cdi/vendor/class=name). IMEX channel
// requests (…/imex/N) are skipped.
func mountDevices(dests []string) (items, cdi []string, err error) {
	root := VolumeMountsRoot + "/"
	seen := map[string]bool{}
	for _, d := range dests {
		d = path.Clean(d)
		if seen[d] || !strings.HasPrefix(d, root) {
			continue
		}
		seen[d] = true
		dev := strings.Trim(strings.TrimPrefix(d, root), "/")
		switch {
		case dev == "", strings.HasPrefix(dev, "imex/"):
			continue
		case strings.HasPrefix(dev, "cdi/"):
			n := strings.TrimPrefix(dev, "cdi/")
			if !parser.IsQualifiedName(n) {
				if parts := strings.SplitN(n, "/", 3); len(parts) == 3 {
					n = parts[0] + "/" + parts[1] + "=" + parts[2]
				}
			}
			if _, _, _, perr := parser.ParseQualifiedName(n); perr != nil {
				return nil, nil, fmt.Errorf("%w: mount %s: %q is not a CDI device name (%v); mount at %s/cdi/VENDOR/CLASS/NAME", ErrInvalid, d, n, perr, VolumeMountsRoot)
			}
			cdi = appendUnique(cdi, n)
		default:
			items = append(items, dev)
		}
	}
	return items, cdi, nil
}

func appendUnique(list []string, items ...string) []string {
	for _, it := range items {
		if !slices.Contains(list, it) {
			list = append(list, it)
		}
	}
	return list
}
