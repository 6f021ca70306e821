package request

import (
	"strconv"

	"github.com/gantry-gpu/gantry/internal/driver"
)

// Mode says how a device list was given.
type Mode int

const (
	// Void: no GPU and nothing injected; the container is left untouched
	// (NVIDIA_VISIBLE_DEVICES unset, empty or "void").
	Void Mode = iota
	// None: no GPU device, but the driver files for the capabilities are injected.
	None
	// All: every GPU of the host.
	All
	// List: the devices named in IDs.
	List
)

// String returns the mode as the env contract spells it ("list" for List).
func (m Mode) String() string {
	switch m {
	case Void:
		return "void"
	case None:
		return "none"
	case All:
		return "all"
	case List:
		return "list"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// Selection is a device list: NVIDIA_VISIBLE_DEVICES, the volume-mount list,
// NVIDIA_MIG_CONFIG_DEVICES, ...
type Selection struct {
	Mode Mode
	// IDs, for Mode == List, in the order given, duplicates removed: GPU
	// indices ("0"), GPU UUIDs ("GPU-..."), MIG names ("0:1") and MIG UUIDs ("MIG-...").
	IDs []string
}

// Source says where the device request came from.
type Source string

const (
	SourceEnv            Source = "env"             // NVIDIA_VISIBLE_DEVICES
	SourceMounts         Source = "volume-mounts"   // /var/run/nvidia-container-devices/...
	SourceCDIAnnotations Source = "cdi-annotations" // cdi.k8s.io/* annotations
	SourceNone           Source = ""
)

// Request is what one container asks for, decided from its spec.
type Request struct {
	Source  Source
	Devices Selection
	// CDIDevices are fully qualified CDI names (vendor.com/class=name) from
	// annotations or the runtime's CDI field, in order, duplicates removed.
	CDIDevices []string
	// Capabilities, deduplicated, in the order of driver.AllCapabilities.
	Capabilities []driver.Capability
	// Requirements are the NVIDIA_REQUIRE_* expressions (and the legacy
	// cuda>=CUDA_VERSION rule), unless NVIDIA_DISABLE_REQUIRE is true.
	Requirements []Requirement
	// MIGConfig and MIGMonitor are NVIDIA_MIG_CONFIG_DEVICES and
	// NVIDIA_MIG_MONITOR_DEVICES (honoured for privileged containers only).
	MIGConfig  Selection
	MIGMonitor Selection
	// Features are the device classes the image switched on
	// (NVIDIA_GDS=enabled, ...), for a container that asks for GPUs.
	Features []Feature
	// IMEXChannels is NVIDIA_IMEX_CHANNELS (honoured where the device
	// variable is: privileged containers, or accept-env-unprivileged).
	IMEXChannels Selection

	// VisibleDevices, when set, is what NVIDIA_VISIBLE_DEVICES must read in
	// the container because the devices given are not what the variable
	// says: the kubelet's allocation used in place of an image's "all".
	// NVIDIA's stack shows the device plugin's value there (UUIDs, or
	// indexes with deviceIDStrategy index), and so does this one.
	VisibleDevices string

	// Kind is the CDI kind ("nvidia.com/gpu") that the bare IDs in Devices
	// belong to when the request is served through CDI; see CDINames.
	Kind string
	// Legacy is true for images built for old CUDA: CUDA_VERSION set and
	// NVIDIA_REQUIRE_CUDA unset or empty. It changed the defaults used above.
	Legacy bool
	// PodUID and Container name the Kubernetes pod and container a
	// kubelet created the container for (KubernetesContainer); "" outside
	// Kubernetes.
	PodUID, Container string
	// Privileged is Input.Privileged: CAP_SYS_ADMIN in the bounding set.
	Privileged bool
	// KubeletPlugin, when set, says why an unprivileged Kubernetes
	// container's own NVIDIA_VISIBLE_DEVICES was honoured beyond the
	// kubelet's allocation (Options.KubeletPluginDir): it is a kubelet
	// plugin by construction, trusted as a privileged container is (the
	// GPU holders check too). Front ends log it.
	KubeletPlugin string
	// Warnings name inputs that were ignored on purpose (an env request in an
	// unprivileged container, unknown capabilities in lenient mode, ...), so
	// a front end can log them; they never change the outcome.
	Warnings []string
}

// Wants reports whether the container gets anything injected at all.
func (r *Request) Wants() bool {
	return r != nil && (r.Devices.Mode != Void || len(r.CDIDevices) > 0)
}

// CDINames returns the whole device request as fully qualified CDI names, as
// a CDI-mode runtime injects it: Devices mapped into r.Kind ("all" for All,
// one name per ID for List, nothing for None and Void), then CDIDevices,
// duplicates removed. It returns nil when Kind is empty and Devices needs it.
func (r *Request) CDINames() []string {
	if r == nil {
		return nil
	}
	var out []string
	seen := map[string]bool{}
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	switch r.Devices.Mode {
	case All:
		if r.Kind == "" {
			return nil
		}
		add(r.Kind + "=all")
	case List:
		if r.Kind == "" {
			return nil
		}
		for _, id := range r.Devices.IDs {
			add(r.Kind + "=" + id)
		}
	}
	for _, n := range r.CDIDevices {
		add(n)
	}
	return out
}
