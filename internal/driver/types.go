package driver

import (
	"fmt"
	"slices"
)

// Capability is one value of NVIDIA_DRIVER_CAPABILITIES: a group of driver
// files a container may ask for.
type Capability string

const (
	Compute  Capability = "compute"
	Compat32 Capability = "compat32"
	Graphics Capability = "graphics"
	Utility  Capability = "utility"
	Video    Capability = "video"
	Display  Capability = "display"
	NGX      Capability = "ngx"
)

// AllCapabilities lists every capability, in the order NVIDIA documents them.
var AllCapabilities = []Capability{Compute, Compat32, Graphics, Utility, Video, Display, NGX}

// DefaultCapabilities is what a container gets when NVIDIA_DRIVER_CAPABILITIES
// is unset or empty.
var DefaultCapabilities = []Capability{Utility, Compute}

// ParseCapability returns the capability named s, or an error naming the
// allowed values.
func ParseCapability(s string) (Capability, error) {
	for _, c := range AllCapabilities {
		if string(c) == s {
			return c, nil
		}
	}
	return "", fmt.Errorf("unknown driver capability %q: use one of compute, compat32, graphics, utility, video, display, ngx or all", s)
}

// FileKind says what a driver file is for, which decides how it is injected.
type FileKind string

const (
	KindLibrary  FileKind = "library"
	KindBinary   FileKind = "binary"
	KindSocket   FileKind = "socket"
	KindFirmware FileKind = "firmware"
	KindConfig   FileKind = "config" // Vulkan ICD, EGL vendor, GLX, GBM, OpenCL ICD, ...
	KindDevice   FileKind = "device" // a control device node
)

// File is one driver file found on the host.
type File struct {
	// HostPath is the absolute path on the host, driver root included, with
	// symlinks resolved to the real file (what gets bind-mounted).
	HostPath string `json:"hostPath"`
	// ContainerPath is where the file goes in a container: HostPath with the
	// driver root stripped (a library found at /run/nvidia/driver/usr/lib/x/libcuda.so.1
	// goes to /usr/lib/x/libcuda.so.1).
	ContainerPath string   `json:"containerPath"`
	Kind          FileKind `json:"kind"`
	// Capability is the capability that brings the file in; empty for files
	// every GPU container gets (nvidiactl, GSP firmware). Compat32 marks the
	// 32-bit libraries.
	Capability Capability `json:"capability,omitempty"`
	// SONAME for libraries (e.g. "libcuda.so.1"); the container gets a
	// SONAME symlink to the file when the names differ.
	SONAME string `json:"soname,omitempty"`
	// Major and Minor for device nodes.
	Major int64 `json:"major,omitempty"`
	Minor int64 `json:"minor,omitempty"`
}

// Inventory is everything the driver provides under one driver root.
type Inventory struct {
	// Root is the driver root the files were found under ("/" by default).
	Root string `json:"root"`
	// Version is the kernel driver version, e.g. "550.54.15".
	Version string `json:"version"`
	// Libraries, Binaries, Sockets, Firmware, Configs and DeviceNodes are the
	// files found, each list sorted by ContainerPath.
	Libraries   []File `json:"libraries"`
	Binaries    []File `json:"binaries"`
	Sockets     []File `json:"sockets"`
	Firmware    []File `json:"firmware"`
	Configs     []File `json:"configs"`
	DeviceNodes []File `json:"deviceNodes"`
	// Missing names the core pieces every working driver has that were not
	// found (libcuda.so, libnvidia-ml.so, nvidia-smi, /dev/nvidiactl): a
	// partial driver, or the wrong driver root.
	Missing []string `json:"missing,omitempty"`
	// Warnings are problems met on the way that did not stop discovery
	// (an unreadable ld.so.cache, say).
	Warnings []string `json:"warnings,omitempty"`
}

// All returns every file in the inventory: libraries, binaries, firmware,
// configs, sockets and device nodes, in that order.
func (inv *Inventory) All() []File {
	if inv == nil {
		return nil
	}
	var out []File
	for _, g := range [][]File{inv.Libraries, inv.Binaries, inv.Firmware, inv.Configs, inv.Sockets, inv.DeviceNodes} {
		out = append(out, g...)
	}
	return out
}

// Files returns what a container asking for caps gets: the files of those
// capabilities and the files every GPU container gets (empty Capability),
// in the order of All.
func (inv *Inventory) Files(caps []Capability) []File {
	var out []File
	for _, f := range inv.All() {
		if f.Capability == "" || slices.Contains(caps, f.Capability) {
			out = append(out, f)
		}
	}
	return out
}
