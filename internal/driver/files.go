package driver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// driverBinaries are the driver programs a container may get, with the
// capability that brings each in.
var driverBinaries = []capFile{
	{"nvidia-smi", Utility},
	{"nvidia-debugdump", Utility},
	{"nvidia-persistenced", Utility},
	{"nv-fabricmanager", Utility},
	{"nvidia-cuda-mps-control", Compute},
	{"nvidia-cuda-mps-server", Compute},
}

// binaryDirs are searched in order for each binary. NVIDIA's library walks
// $PATH; we look at the fixed places driver installs use instead, so the
// result does not depend on the environment of whoever runs us.
var binaryDirs = []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/nvidia/bin"}

// findBinaries returns one file per driver binary. A real ELF executable is
// preferred over a script of the same name, because hosts such as ours ship
// /usr/bin/nvidia-smi as a shell wrapper that execs
// /usr/local/nvidia/bin/nvidia-smi, which would not exist in the container.
// Binaries go to /usr/bin in the container, as NVIDIA's library puts them,
// so they are on every image's PATH.
func findBinaries(r *resolver) []File {
	var out []File
	for _, b := range driverBinaries {
		var fallback string
		chosen := ""
		for _, d := range binaryDirs {
			p, err := r.Resolve(path.Join(d, b.Rel))
			if err != nil {
				continue
			}
			fi, err := r.stat(p)
			if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
				continue
			}
			if isELF(r.host(p)) {
				chosen = p
				break
			}
			if fallback == "" {
				fallback = p
			}
		}
		if chosen == "" {
			chosen = fallback
		}
		if chosen == "" {
			continue
		}
		out = append(out, File{
			HostPath:      r.host(chosen),
			ContainerPath: "/usr/bin/" + b.Rel,
			Kind:          KindBinary,
			Capability:    b.Cap,
		})
	}
	return out
}

func isELF(p string) bool {
	f, err := openRaw(p)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	if n, _ := f.ReadAt(magic[:], 0); n < len(magic) {
		return false
	}
	return bytes.Equal(magic[:], []byte("\x7fELF"))
}

// firmwareDirs hold the GSP firmware for driver version %s: the kernel's
// firmware directories, and GKE-style installs that keep it beside the
// libraries.
var firmwareDirs = []string{
	"/lib/firmware/nvidia/%s",
	"/usr/lib/firmware/nvidia/%s",
	"/usr/local/nvidia/firmware/nvidia/%s",
}

// findFirmware returns the gsp*.bin files for version. In the container they
// always appear under /lib/firmware/nvidia/<version>, where NVIDIA puts them.
func findFirmware(r *resolver, version string) []File {
	var out []File
	seen := map[string]bool{}
	for _, f := range firmwareDirs {
		dir, err := r.Resolve(fmt.Sprintf(f, version))
		if err != nil {
			continue
		}
		ents, err := os.ReadDir(r.host(dir))
		if err != nil {
			continue
		}
		for _, e := range ents {
			n := e.Name()
			if !strings.HasPrefix(n, "gsp") || !strings.HasSuffix(n, ".bin") || seen[n] {
				continue
			}
			p, err := r.Resolve(path.Join(dir, n))
			if err != nil {
				continue
			}
			if fi, err := r.stat(p); err != nil || !fi.Mode().IsRegular() {
				continue
			}
			seen[n] = true
			out = append(out, File{
				HostPath:      r.host(p),
				ContainerPath: path.Join("/lib/firmware/nvidia", version, n),
				Kind:          KindFirmware,
			})
		}
	}
	return out
}

// configDirs are where graphics and OpenCL configuration files are looked
// for, in order; /usr/local/nvidia/share is the GKE-style install's copy,
// which goes to /usr/share in the container, where the loaders look.
var configDirs = []string{"/etc", "/usr/local/share", "/usr/share", "/usr/local/nvidia/share"}

// capFile is a file, relative to a search directory, and the capability
// that brings it in.
type capFile struct {
	Rel string
	Cap Capability
}

// configFiles are the files looked for in each config dir; %s is the
// driver version.
func configFiles() []capFile {
	files := []capFile{
		{"vulkan/icd.d/nvidia_icd.json", Graphics},
		{"vulkan/icd.d/nvidia_layers.json", Graphics},
		{"vulkan/implicit_layer.d/nvidia_layers.json", Graphics},
		{"glvnd/egl_vendor.d/10_nvidia.json", Graphics},
		{"egl/egl_external_platform.d/15_nvidia_gbm.json", Graphics},
		{"egl/egl_external_platform.d/10_nvidia_wayland.json", Graphics},
		{"egl/egl_external_platform.d/09_nvidia_wayland2.json", Graphics},
		{"egl/egl_external_platform.d/20_nvidia_xcb.json", Graphics},
		{"egl/egl_external_platform.d/20_nvidia_xlib.json", Graphics},
		{"nvidia/nvoptix.bin", Graphics},
		{"nvidia/nvidia-application-profiles-%s-rc", Graphics},
		{"nvidia/nvidia-application-profiles-%s-key-documentation", Graphics},
		{"nvidia/nvidia-application-profiles-rc", Graphics},
		{"nvidia/nvidia-application-profiles-rc.d", Graphics},
		{"OpenCL/vendors/nvidia.icd", Compute},
		{"X11/xorg.conf.d/10-nvidia.conf", Display},
		{"X11/xorg.conf.d/nvidia-drm-outputclass.conf", Display},
	}
	switch runtime.GOARCH {
	case "amd64":
		files = append(files, capFile{"vulkan/icd.d/nvidia_icd.x86_64.json", Graphics})
	case "arm64":
		files = append(files, capFile{"vulkan/icd.d/nvidia_icd.aarch64.json", Graphics})
	}
	return files
}

// xorgDirs hold the X server modules (the NVIDIA DDX driver and the GLX
// server extension); findModules looks in <libcuda's dir>/nvidia/xorg first.
var xorgDirs = []string{
	"/usr/lib/xorg/modules/drivers",
	"/usr/lib/xorg/modules/extensions",
	"/usr/lib/xorg/modules/updates/drivers",
	"/usr/lib/xorg/modules/updates/extensions",
	"/usr/lib64/xorg/modules/drivers",
	"/usr/lib64/xorg/modules/extensions",
	"/usr/lib/x86_64-linux-gnu/nvidia/xorg",
}

// findConfigFiles returns the configuration files (findModules the X
// server modules and the GBM backend, which depend on the libraries). Each
// is taken once, from the first directory that has it, and placed in the
// container where the loaders look (not where the symlinks it may be
// lead), so HostPath is the real file and ContainerPath the lookup path.
func findConfigFiles(r *resolver, version string) []File {
	var out []File
	for _, c := range configFiles() {
		rel := c.Rel
		if strings.Contains(rel, "%s") {
			rel = fmt.Sprintf(rel, version)
		}
		for _, d := range configDirs {
			p, err := r.Resolve(path.Join(d, rel))
			if err != nil {
				continue
			}
			if _, err := r.stat(p); err != nil {
				continue
			}
			cp := path.Join(d, rel)
			if d == "/usr/local/nvidia/share" {
				cp = path.Join("/usr/share", rel)
			}
			out = append(out, File{HostPath: r.host(p), ContainerPath: cp, Kind: KindConfig, Capability: c.Cap})
			break
		}
	}

	return out
}

// findModules returns the X server modules and the GBM backend, placed as
// findConfigFiles places its files.
func findModules(r *resolver, version string, libs []File) []File {
	var out []File
	// X server modules, next to libcuda first (NVIDIA's .run installer),
	// then the X server's own module directories.
	dirs := []string{}
	for _, l := range libs {
		if strings.HasPrefix(path.Base(l.ContainerPath), "libcuda.so.") && l.Capability == Compute {
			dirs = append(dirs, path.Join(path.Dir(l.ContainerPath), "nvidia/xorg"))
		}
	}
	dirs = append(dirs, xorgDirs...)
	for _, name := range []string{"nvidia_drv.so", "libglxserver_nvidia.so." + version} {
		for _, d := range dirs {
			p, err := r.Resolve(path.Join(d, name))
			if err != nil {
				continue
			}
			if fi, err := r.stat(p); err != nil || !fi.Mode().IsRegular() {
				continue
			}
			out = append(out, File{HostPath: r.host(p), ContainerPath: path.Join(d, name), Kind: KindConfig, Capability: Display})
			break
		}
	}

	// The GBM backend is gbm/nvidia-drm_gbm.so beside libnvidia-allocator,
	// a link to it; the container gets the allocator at that path whether or
	// not the host has the link.
	for _, l := range libs {
		if strings.HasPrefix(path.Base(l.ContainerPath), "libnvidia-allocator.so.") && l.Capability == Compute {
			out = append(out, File{
				HostPath:      l.HostPath,
				ContainerPath: path.Join(path.Dir(l.ContainerPath), "gbm/nvidia-drm_gbm.so"),
				Kind:          KindConfig,
				Capability:    Graphics,
			})
			break
		}
	}
	return out
}

// ipcEndpoints are the driver daemons' sockets and pipe directories; only
// the ones that exist are listed, since a bind mount of a missing source
// fails the container.
var ipcEndpoints = []capFile{
	{"/run/nvidia-persistenced/socket", Utility},
	{"/var/run/nvidia-persistenced/socket", Utility},
	{"/run/nvidia-fabricmanager/socket", Utility},
	{"/var/run/nvidia-fabricmanager/socket", Utility},
	{"/tmp/nvidia-mps", Compute},
}

func findSockets(r *resolver) []File {
	var out []File
	seen := map[string]bool{}
	for _, e := range ipcEndpoints {
		p, err := r.Resolve(e.Rel)
		if err != nil || seen[p] {
			continue
		}
		if _, err := r.stat(p); err != nil {
			continue
		}
		seen[p] = true
		out = append(out, File{HostPath: r.host(p), ContainerPath: p, Kind: KindSocket, Capability: e.Cap})
	}
	return out
}

// controlDevices are the driver's device nodes that are not per GPU.
// nvidiactl goes to every GPU container; UVM serves CUDA's unified memory
// and modeset the display engine. The MIG capability nodes under
// /dev/nvidia-caps are not listed: they are granted per device and only to
// privileged requests, through StatDevice.
var controlDevices = []capFile{
	{"/dev/nvidiactl", ""},
	{"/dev/nvidia-uvm", Compute},
	{"/dev/nvidia-uvm-tools", Compute},
	{"/dev/nvidia-modeset", Display},
}

func findDevices(devRoot string) []File {
	var out []File
	for _, d := range controlDevices {
		f, err := StatDevice(devRoot, d.Rel)
		if err != nil {
			continue
		}
		f.Capability = d.Cap
		out = append(out, f)
	}
	return out
}

// ErrNotDevice is returned by StatDevice for a path that exists but is not a
// character device (a fake driver root made without root privileges has
// regular files there).
var ErrNotDevice = errors.New("not a character device")

// StatDevice returns the device node p (e.g. /dev/nvidia3 or
// /dev/nvidia-caps/nvidia-cap12) found under devRoot ("" or "/" for the
// host), with its major and minor numbers. ContainerPath is p; HostPath is
// where it is on the host, resolved inside devRoot.
func StatDevice(devRoot, p string) (File, error) {
	if devRoot == "" {
		devRoot = "/"
	}
	p = path.Clean("/" + p)
	r := newResolver(devRoot)
	in, err := r.Resolve(p)
	if err != nil {
		return File{}, fmt.Errorf("device node %s under %s: %w (is the NVIDIA kernel module loaded? set --dev-root if /dev is elsewhere)", p, devRoot, err)
	}
	host := r.host(in)
	var st unix.Stat_t
	if err := unix.Stat(host, &st); err != nil {
		return File{}, fmt.Errorf("device node %s: %w", host, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return File{}, fmt.Errorf("device node %s: %w", host, ErrNotDevice)
	}
	return File{
		HostPath:      filepath.Clean(host),
		ContainerPath: p,
		Kind:          KindDevice,
		Major:         int64(unix.Major(st.Rdev)),
		Minor:         int64(unix.Minor(st.Rdev)),
	}, nil
}
