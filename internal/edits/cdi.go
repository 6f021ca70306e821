package edits

import (
	"path/filepath"
	"slices"

	cdispecs "tags.cncf.io/container-device-interface/specs-go"
)

// CDI hook names (the OCI lifecycle point) and the hook subcommands the
// hook binary implements.
const (
	cdiCreateContainer = "createContainer"
	hookCreateSymlinks = "create-symlinks"
	hookUpdateLDCache  = "update-ldcache"
)

// CDI converts e to CDI container edits. Symlinks and library directories,
// which a runtime cannot express as mounts or nodes, become createContainer
// hooks running hookPath: `<name> hook create-symlinks --link TARGET::LINK...`
// and `<name> hook update-ldcache --folder DIR...`. When hookPath names
// NVIDIA's nvidia-cdi-hook, whose subcommands are top level, the "hook" word
// is left out so the spec works with that binary too. An empty hookPath
// drops the hooks (the caller then makes those changes some other way).
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
	if base[0] != "nvidia-cdi-hook" {
		base = append(base, "hook")
	}
	if len(e.Symlinks) > 0 {
		args := append(slices.Clone(base), hookCreateSymlinks)
		for _, s := range e.Symlinks {
			args = append(args, "--link", s.Target+"::"+s.Link)
		}
		c.Hooks = append(c.Hooks, &cdispecs.Hook{HookName: cdiCreateContainer, Path: hookPath, Args: args})
	}
	if len(e.LibraryDirs) > 0 {
		args := append(slices.Clone(base), hookUpdateLDCache)
		for _, d := range e.LibraryDirs {
			args = append(args, "--folder", d)
		}
		c.Hooks = append(c.Hooks, &cdispecs.Hook{HookName: cdiCreateContainer, Path: hookPath, Args: args})
	}
	return c
}
