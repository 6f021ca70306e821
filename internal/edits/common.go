package edits

import (
	"path"
	"slices"
	"strings"

	"github.com/gantry-gpu/gantry/internal/driver"
)

// Common returns the edits every GPU container with the capabilities caps
// gets, whatever devices it asked for: driver libraries, binaries, firmware
// and config files (read-only bind mounts), IPC sockets and control device
// nodes. Files the inventory marks with a capability are included when caps
// holds it; unmarked files follow NVIDIA's rules (see the package doc). A nil
// inventory gives empty edits.
func Common(inv *driver.Inventory, caps []driver.Capability) *Edits {
	e := &Edits{}
	if inv == nil {
		return e
	}
	want := func(c driver.Capability) bool { return slices.Contains(caps, c) }

	for _, f := range inv.Libraries {
		if f.Capability != "" && !want(f.Capability) {
			continue
		}
		e.Mounts = append(e.Mounts, roMount(f))
		dir := path.Dir(f.ContainerPath)
		e.LibraryDirs = append(e.LibraryDirs, dir)
		e.Symlinks = append(e.Symlinks, librarySymlinks(f, inv.Version)...)
	}
	for _, group := range [][]driver.File{inv.Binaries, inv.Firmware, inv.Configs} {
		for _, f := range group {
			if f.Capability != "" && !want(f.Capability) {
				continue
			}
			e.Mounts = append(e.Mounts, roMount(f))
		}
	}
	for _, f := range inv.Sockets {
		if !want(socketCapability(f)) {
			continue
		}
		e.Mounts = append(e.Mounts, Mount{HostPath: f.HostPath, ContainerPath: f.ContainerPath, Options: slices.Clone(SocketOptions)})
	}
	for _, f := range inv.DeviceNodes {
		c := deviceCapability(f)
		if c != "" && !want(c) {
			continue
		}
		e.DeviceNodes = append(e.DeviceNodes, DeviceNode{
			Path: f.ContainerPath, HostPath: f.HostPath, Type: "c",
			Major: f.Major, Minor: f.Minor, Permissions: CgroupAccess,
		})
	}
	e.normalize()
	return e
}

func roMount(f driver.File) Mount {
	return Mount{HostPath: f.HostPath, ContainerPath: f.ContainerPath, Options: slices.Clone(ReadOnlyOptions)}
}

// socketCapability is the capability that brings an IPC socket: the one the
// inventory gives, else utility for the persistenced and fabric-manager
// sockets and compute for every other endpoint (MPS).
func socketCapability(f driver.File) driver.Capability {
	if f.Capability != "" {
		return f.Capability
	}
	p := f.ContainerPath
	if strings.Contains(p, "nvidia-persistenced") || strings.Contains(p, "nvidia-fabricmanager") {
		return driver.Utility
	}
	return driver.Compute
}

// nvidiaMajor is the fixed character major of the nvidia driver (nvidiactl,
// nvidia<N>, nvidia-modeset); UVM and caps have majors allocated at load.
const nvidiaMajor = 195

// deviceCapability is the capability a control device node needs, "" for
// nodes every GPU container gets (nvidiactl).
func deviceCapability(f driver.File) driver.Capability {
	if f.Capability != "" {
		return f.Capability
	}
	base := path.Base(f.ContainerPath)
	switch {
	case base == "nvidia-modeset":
		return driver.Display
	case strings.HasPrefix(base, "nvidia-uvm"):
		return driver.Compute
	case f.Major != 0 && f.Major != nvidiaMajor:
		// Any other node outside the nvidia major came with a compute-only
		// kernel module, as UVM does.
		return driver.Compute
	}
	return ""
}

// librarySymlinks returns the links a library needs in the container: its
// SONAME when the file name differs, and NVIDIA's fixed development links.
func librarySymlinks(f driver.File, version string) []Symlink {
	dir, name := path.Split(f.ContainerPath)
	var out []Symlink
	if f.SONAME != "" && f.SONAME != name {
		out = append(out, Symlink{Target: name, Link: dir + f.SONAME})
	}
	soname := f.SONAME
	if soname == "" {
		soname = name
	}
	switch {
	case strings.HasPrefix(soname, "libcuda.so."):
		out = append(out, Symlink{Target: soname, Link: dir + "libcuda.so"})
	case strings.HasPrefix(soname, "libnvidia-opticalflow.so."):
		out = append(out, Symlink{Target: soname, Link: dir + "libnvidia-opticalflow.so"})
	case strings.HasPrefix(name, "libGLX_nvidia.so.") && (version == "" || strings.HasSuffix(name, "."+version)):
		out = append(out, Symlink{Target: name, Link: dir + "libGLX_indirect.so.0"})
	}
	return out
}
