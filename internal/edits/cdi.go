package edits

import (
	"path/filepath"
	"slices"

	cdispecs "tags.cncf.io/container-device-interface/specs-go"
)

// CDI hook names (the OCI lifecycle point) and the hook subcommands the
// hook binary implements (internal/containerhook serves them under these
// names; the spec writer and the hook commands share the constants).
const (
	cdiCreateContainer = "createContainer"
	HookCreateSymlinks = "create-symlinks"
	HookUpdateLDCache  = "update-ldcache"
	// HookEnableCUDACompat is NVIDIA's forward-compatibility hook, which
	// gantry cdi generate puts before update-ldcache for nvidia-cdi-hook.
	HookEnableCUDACompat = "enable-cuda-compat"
)

// HookPATH is the one variable of every hook's environment (HookEnv).
const HookPATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// HookEnv is the whole environment of every OCI hook Gantry writes or
// injects: a fixed PATH and nothing else. runc (and crun) run a
// createContainer hook whose env is empty with the container's process.env,
// the image's: LD_PRELOAD=/proc/self/cwd/evil.so there would load the
// image's code into a root process that still sees the host
// (CVE-2025-23266), and GANTRY_CONFIG would choose the hook's configuration.
// An explicit env, even this small one, replaces all of that. Each call
// returns a new slice.
func HookEnv() []string { return []string{HookPATH} }

// CDI converts e to CDI container edits. Symlinks and library directories,
// which a runtime cannot express as mounts or nodes, become createContainer
// hooks running hookPath, each with the environment HookEnv:
// `gantry-cdi-hook create-symlinks --link TARGET::LINK...` and
// `gantry-cdi-hook update-ldcache --folder DIR...`, NVIDIA's nvidia-cdi-hook
// grammar, which that binary also takes. A hookPath naming the gantry CLI
// itself (base name gantry, as specs before gantry-cdi-hook had) gets its
// form, `gantry hook create-symlinks ...`. An empty hookPath drops the hooks
// (the caller then makes those changes some other way).
func (e *Edits) CDI(hookPath string) cdispecs.ContainerEdits {
	var c cdispecs.ContainerEdits
	if e == nil {
		return c
	}
	c.Env = slices.Clone(e.Env)
	for _, d := range e.DeviceNodes {
		n := &cdispecs.DeviceNode{
			Path:        d.Path,
			HostPath:    d.HostPath,
			Type:        d.Type,
			Major:       d.Major,
			Minor:       d.Minor,
			Permissions: d.Permissions,
		}
		// An equal HostPath says nothing and is a v0.5.0 field: leaving it
		// out keeps the spec readable by older CDI consumers.
		if n.HostPath == n.Path {
			n.HostPath = ""
		}
		if d.FileMode != 0 {
			m := d.FileMode
			n.FileMode = &m
		}
		c.DeviceNodes = append(c.DeviceNodes, n)
	}
	for _, m := range e.Mounts {
		c.Mounts = append(c.Mounts, &cdispecs.Mount{
			HostPath:      m.HostPath,
			ContainerPath: m.ContainerPath,
			Options:       slices.Clone(m.Options),
		})
	}
	if hookPath == "" {
		return c
	}
	base := []string{filepath.Base(hookPath)}
	if base[0] == "gantry" {
		base = append(base, "hook")
	}
	if len(e.Symlinks) > 0 {
		args := append(slices.Clone(base), HookCreateSymlinks)
		for _, s := range e.Symlinks {
			args = append(args, "--link", s.Target+"::"+s.Link)
		}
		c.Hooks = append(c.Hooks, &cdispecs.Hook{HookName: cdiCreateContainer, Path: hookPath, Args: args, Env: HookEnv()})
	}
	if len(e.LibraryDirs) > 0 {
		args := append(slices.Clone(base), HookUpdateLDCache)
		for _, d := range e.LibraryDirs {
			args = append(args, "--folder", d)
		}
		c.Hooks = append(c.Hooks, &cdispecs.Hook{HookName: cdiCreateContainer, Path: hookPath, Args: args, Env: HookEnv()})
	}
	return c
}
