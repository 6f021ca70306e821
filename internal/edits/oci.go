package edits

import (
	"errors"
	"fmt"
	"path"
	"slices"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
)

// ErrInvalidEdits is wrapped by ApplyToSpec errors for edits that cannot be
// applied (a relative container path, an unknown node type).
var ErrInvalidEdits = errors.New("invalid container edits")

// ApplyToSpec applies the environment, device nodes (with their cgroup allow
// rules) and mounts of e to an OCI runtime spec, in memory. Applying the same
// edits twice leaves the spec as after the first time: an env key, a device
// path or a mount destination already present is replaced in place, and an
// allow rule already in force is not added again.
//
// Symlinks and LibraryDirs are not represented in an OCI spec; they are made
// inside the root filesystem (package containerhook, run by package inject)
// or by the CDI hooks.
func (e *Edits) ApplyToSpec(spec *ocispecs.Spec) error {
	return e.ApplyToSpecWith(spec, SpecOptions{})
}

// SpecOptions change what ApplyToSpecWith writes.
type SpecOptions struct {
	// NoCgroups leaves linux.resources.devices alone: the nodes are
	// listed in linux.devices without allow rules (NVIDIA's
	// nvidia-container-cli.no-cgroups, for rootless engines, whose
	// runtimes cannot manage a device cgroup; access is granted another way).
	NoCgroups bool
}

// ApplyToSpecWith is ApplyToSpec with options.
func (e *Edits) ApplyToSpecWith(spec *ocispecs.Spec, o SpecOptions) error {
	if spec == nil {
		return fmt.Errorf("%w: nil OCI spec", ErrInvalidEdits)
	}
	if e.Empty() {
		return nil
	}
	if err := e.validate(); err != nil {
		return err
	}

	if len(e.Env) > 0 {
		if spec.Process == nil {
			spec.Process = &ocispecs.Process{}
		}
		spec.Process.Env = setEnv(spec.Process.Env, e.Env)
	}

	if len(e.DeviceNodes) > 0 {
		if spec.Linux == nil {
			spec.Linux = &ocispecs.Linux{}
		}
		if spec.Linux.Resources == nil && !o.NoCgroups {
			spec.Linux.Resources = &ocispecs.LinuxResources{}
		}
		for _, d := range e.DeviceNodes {
			dev := ocispecs.LinuxDevice{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor}
			if d.FileMode != 0 {
				m := d.FileMode
				dev.FileMode = &m
			}
			// As the CDI library does: a node owned by the container's user
			// lets a non-root process open it even with a restrictive mode.
			if p := spec.Process; p != nil {
				if uid := p.User.UID; uid > 0 {
					dev.UID = &uid
				}
				if gid := p.User.GID; gid > 0 {
					dev.GID = &gid
				}
			}
			if i := slices.IndexFunc(spec.Linux.Devices, func(x ocispecs.LinuxDevice) bool { return x.Path == d.Path }); i >= 0 {
				spec.Linux.Devices[i] = dev
			} else {
				spec.Linux.Devices = append(spec.Linux.Devices, dev)
			}
			if o.NoCgroups {
				continue
			}
			access := d.Permissions
			if access == "" {
				access = CgroupAccess
			}
			spec.Linux.Resources.Devices = allowDevice(spec.Linux.Resources.Devices, d.Type, d.Major, d.Minor, access)
		}
	}

	for _, m := range e.Mounts {
		mnt := ocispecs.Mount{Destination: m.ContainerPath, Type: "bind", Source: m.HostPath, Options: slices.Clone(m.Options)}
		if i := slices.IndexFunc(spec.Mounts, func(x ocispecs.Mount) bool { return path.Clean(x.Destination) == m.ContainerPath }); i >= 0 {
			spec.Mounts[i] = mnt
		} else {
			spec.Mounts = append(spec.Mounts, mnt)
		}
	}
	return nil
}

// validate rejects edits a runtime would choke on later, with less context.
func (e *Edits) validate() error {
	for _, kv := range e.Env {
		if envKey(kv) == "" || envKey(kv) == kv {
			return fmt.Errorf("%w: environment entry %q is not KEY=VALUE", ErrInvalidEdits, kv)
		}
	}
	for _, d := range e.DeviceNodes {
		if !path.IsAbs(d.Path) || path.Clean(d.Path) != d.Path {
			return fmt.Errorf("%w: device node path %q must be absolute and clean", ErrInvalidEdits, d.Path)
		}
		switch d.Type {
		case "c", "b", "u":
		default:
			return fmt.Errorf("%w: device node %s has type %q: use c, b or u", ErrInvalidEdits, d.Path, d.Type)
		}
	}
	for _, m := range e.Mounts {
		if !path.IsAbs(m.ContainerPath) || path.Clean(m.ContainerPath) != m.ContainerPath || !path.IsAbs(m.HostPath) {
			return fmt.Errorf("%w: mount %q -> %q needs absolute, clean paths", ErrInvalidEdits, m.HostPath, m.ContainerPath)
		}
	}
	return nil
}

// setEnv sets each KEY=VALUE of add in env, replacing the first entry with
// the same key in place and dropping later duplicates of it.
func setEnv(env, add []string) []string {
	for _, kv := range add {
		k := envKey(kv)
		found := false
		out := env[:0:0]
		for _, old := range env {
			if envKey(old) != k {
				out = append(out, old)
				continue
			}
			if !found {
				out = append(out, kv)
				found = true
			}
		}
		if !found {
			out = append(out, kv)
		}
		env = out
	}
	return env
}

// allowDevice appends an allow rule unless an identical one already takes
// effect: rules apply in order, so an equal rule followed by any deny rule
// does not count.
func allowDevice(rules []ocispecs.LinuxDeviceCgroup, typ string, major, minor int64, access string) []ocispecs.LinuxDeviceCgroup {
	for i := len(rules) - 1; i >= 0; i-- {
		r := rules[i]
		if !r.Allow {
			break
		}
		if r.Type == typ && r.Major != nil && *r.Major == major && r.Minor != nil && *r.Minor == minor && r.Access == access {
			return rules
		}
	}
	return append(rules, ocispecs.LinuxDeviceCgroup{Allow: true, Type: typ, Major: &major, Minor: &minor, Access: access})
}
