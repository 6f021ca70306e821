package request

import (
	"fmt"
	"path"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Bind is one bind mount of a container: its host source and whether the
// container may write through it.
type Bind struct {
	Source   string
	ReadOnly bool
}

// BindMounts returns the spec's bind mounts (type "bind", or a "bind" or
// "rbind" option, as runc reads them), in order. A mount of any other type
// is left out whatever its source says: runc does not mount its source.
func BindMounts(mounts []specs.Mount) []Bind {
	var out []Bind
	for _, m := range mounts {
		bind := m.Type == "bind"
		ro := false
		for _, o := range m.Options {
			switch o {
			case "bind", "rbind":
				bind = true
			case "ro":
				ro = true
			case "rw":
				ro = false
			}
		}
		if bind {
			out = append(out, Bind{Source: m.Source, ReadOnly: ro})
		}
	}
	return out
}

// kubeletPluginRule is why a Kubernetes container's own
// NVIDIA_VISIBLE_DEVICES is honoured beyond what the kubelet allocated to
// it, or "" when it is not: the container is a kubelet plugin by
// construction, because one of its writable binds gives it the directory
// where the kubelet takes plugin registrations (device-plugins/, with
// kubelet.sock, or plugins_registry/ for DRA plugins), as
// Options.KubeletPluginDir decides from the bind's host source.
//
// Such a container can register any extended resource with the kubelet and
// hand itself, or any pod, any GPU through its Allocate answers, so
// honouring its variable gives it nothing it does not have; every other
// unprivileged container stays bounded by its allocation. The decision
// reads only the spec's mounts, as the runtime will make them: never the
// image's name, the pod's labels, its namespace or its env, all of which a
// pod author chooses freely.
func kubeletPluginRule(binds []Bind, opts Options) string {
	if opts.KubeletPluginDir == nil {
		return ""
	}
	for _, b := range binds {
		// A read-only bind cannot hold the plugin's own socket, which the
		// kubelet must call back to: no plugin can be served through it.
		if b.ReadOnly || !path.IsAbs(b.Source) {
			continue
		}
		if dir, ok := opts.KubeletPluginDir(b.Source); ok {
			return fmt.Sprintf("%s honoured beyond the kubelet's allocation: the container binds %s writable, which gives it the kubelet's plugin registration directory %s; it is a kubelet plugin that can hand itself any GPU through the kubelet, so its own variable gives it nothing more (runtime.kubernetes-env = \"allocated\")",
				EnvVisibleDevices, path.Clean(b.Source), dir)
		}
	}
	return ""
}
