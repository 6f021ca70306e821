package fakedriver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/driver"
)

// Layouts Build knows.
const (
	// LayoutStandard is a distribution-packaged driver: libraries in
	// /usr/lib/x86_64-linux-gnu, programs in /usr/bin.
	LayoutStandard = "standard"
	// LayoutGKE mirrors our GPU hosts (and GKE nodes): the driver is a
	// self-contained tree under /usr/local/nvidia (bin, lib64, lib -> lib64,
	// firmware, share), listed in ld.so.conf, with SONAME links to it in
	// /usr/lib (/lib -> usr/lib) and a wrapper script at /usr/bin/nvidia-smi.
	LayoutGKE = "gke"
)

// Device numbers of the fake nodes. 195 is the nvidia driver's fixed major;
// UVM and the capability nodes get majors allocated at module load on a
// real host, so any free-looking number will do.
const (
	NvidiaMajor = 195
	UVMMajor    = 511
	CapsMajor   = 510
	IMEXMajor   = 509
)

// DefaultVersion is the driver version Build uses when Options.Version is
// empty.
const DefaultVersion = "550.54.15"

// Options says what fake driver to build.
type Options struct {
	// Version is the driver version (DefaultVersion if empty).
	Version string
	// CUDAVersion is what cuDriverGetVersion reports, as "12.4"; empty
	// picks the CUDA version NVIDIA shipped with the driver branch.
	CUDAVersion string
	// Layout is LayoutStandard (default) or LayoutGKE.
	Layout string
	// GPUs is the number of /dev/nvidiaN nodes; 0 means 8.
	GPUs int
	// DeviceNodes asks for real character devices (mknod, needs root);
	// without it, or when mknod fails, regular files stand in for them.
	DeviceNodes bool
	// Compat32 adds 32-bit builds of the main libraries in
	// /usr/lib/i386-linux-gnu.
	Compat32 bool
	// CacheDir holds compiled objects between builds; empty means
	// $XDG_CACHE_HOME/gantry/fakedriver (or the OS temp dir).
	CacheDir string
	// Identities name the GPUs the fake nvidia-smi -L lists, by device
	// minor (a simulated profile's models and UUIDs); GPUs without one are
	// "Fake NVIDIA GPU" with a made-up UUID.
	Identities []Identity
	// CheckpointDir turns on the record of the fake libcuda's process
	// checkpoint calls (cuCheckpointProcess*): each call appends
	// "OP PID ok|fail [detail]" to CheckpointDir/calls, and a line
	// "OP" or "OP PID" in CheckpointDir/fail makes that call fail
	// (CUDA_ERROR_UNKNOWN). Without it the calls succeed and record
	// nothing. A line "remap" there makes every restore onto another GPU
	// fail with CUDA_ERROR_NOT_SUPPORTED (a driver that cannot remap).
	// With it, libcuda also knows the Identities as its devices (those
	// whose /dev/nvidiaN node the calling process sees, or the root's
	// dev/nvidiaN on the host) and checks a restore as the driver documents
	// it: see checkpointSource.
	CheckpointDir string
	// IMEXChannels is the number of IMEX channel nodes,
	// /dev/nvidia-caps-imex-channels/channel0..N-1 (as the IMEX daemon or
	// nvidia-modprobe -i makes them), listed in proc/devices as
	// nvidia-caps-imex-channels; 0 makes none.
	IMEXChannels int
}

// ckpt is what the fake libcuda is compiled with for Options.CheckpointDir.
func (b *builder) ckpt() ckptParams {
	if b.opts.CheckpointDir == "" {
		return ckptParams{}
	}
	return ckptParams{Dir: b.opts.CheckpointDir, Root: b.res.Root, IDs: b.opts.Identities}
}

// Identity is what the fake nvidia-smi says of the GPU behind /dev/nvidia<Minor>.
type Identity struct {
	Minor      int
	UUID, Name string
}

// Library is one library file Build made.
type Library struct {
	// Path is the real file's path inside the root.
	Path string
	// SONAME is the ELF SONAME it was linked with.
	SONAME     string
	Capability driver.Capability
	// Bits is 64, or 32 for the compat32 builds.
	Bits int
}

// Result lists what Build made; all paths are inside Root.
type Result struct {
	Root    string
	Version string
	Layout  string
	// CUDAVersion is what the fake libcuda reports, major*1000+minor*10.
	CUDAVersion int
	// LibDir is where the 64-bit libraries are.
	LibDir    string
	Libraries []Library
	// Binaries are the real program files; Firmware, Configs and Sockets
	// the other driver files; DeviceNodes every node under /dev.
	Binaries    []string
	Firmware    []string
	Configs     []string
	Sockets     []string
	DeviceNodes []string
	// LDCache reports that ldconfig -r wrote etc/ld.so.cache.
	LDCache bool
	// RealDeviceNodes reports that the device nodes are character devices;
	// false means regular files stand in for them.
	RealDeviceNodes bool
	// Compat32 reports that 32-bit libraries were built.
	Compat32 bool
	// Notes say what was left out or done differently, and why.
	Notes []string
}

// fakeLib is one library of the fake driver.
type fakeLib struct {
	Stem string // "libcuda.so"
	// Major is the SONAME suffix ("1" for libcuda.so.1); empty means the
	// SONAME carries the full driver version, as NVIDIA's internal
	// libraries (libnvidia-glcore.so.550.54.15) do.
	Major string
	Cap   driver.Capability
	// Own is the library's own version for those NVIDIA versions apart
	// from the driver (libnvidia-egl-wayland.so.1.1.13).
	Own string
	// Compat32 libraries also get a 32-bit build.
	Compat32 bool
	// Sub is a subdirectory of the library directory (the standard layout
	// puts VDPAU drivers in vdpau/).
	Sub string
}

// fakeLibraries covers every capability with real NVIDIA names and SONAMEs.
var fakeLibraries = []fakeLib{
	{Stem: "libnvidia-ml.so", Major: "1", Cap: driver.Utility, Compat32: true},
	{Stem: "libnvidia-cfg.so", Major: "1", Cap: driver.Utility},

	{Stem: "libcuda.so", Major: "1", Cap: driver.Compute, Compat32: true},
	{Stem: "libcudadebugger.so", Major: "1", Cap: driver.Compute},
	{Stem: "libnvidia-ptxjitcompiler.so", Major: "1", Cap: driver.Compute, Compat32: true},
	{Stem: "libnvidia-opencl.so", Major: "1", Cap: driver.Compute, Compat32: true},
	{Stem: "libnvidia-nvvm.so", Major: "4", Cap: driver.Compute},
	{Stem: "libnvidia-gpucomp.so", Cap: driver.Compute},
	{Stem: "libnvidia-allocator.so", Major: "1", Cap: driver.Compute},
	{Stem: "libnvidia-pkcs11-openssl3.so", Cap: driver.Compute},

	{Stem: "libnvidia-encode.so", Major: "1", Cap: driver.Video, Compat32: true},
	{Stem: "libnvcuvid.so", Major: "1", Cap: driver.Video, Compat32: true},
	{Stem: "libnvidia-opticalflow.so", Major: "1", Cap: driver.Video},
	{Stem: "libvdpau_nvidia.so", Major: "1", Cap: driver.Video, Sub: "vdpau"},

	{Stem: "libGLX_nvidia.so", Major: "0", Cap: driver.Graphics, Compat32: true},
	{Stem: "libEGL_nvidia.so", Major: "0", Cap: driver.Graphics, Compat32: true},
	{Stem: "libGLESv2_nvidia.so", Major: "2", Cap: driver.Graphics},
	{Stem: "libGLESv1_CM_nvidia.so", Major: "1", Cap: driver.Graphics},
	{Stem: "libnvidia-glcore.so", Cap: driver.Graphics, Compat32: true},
	{Stem: "libnvidia-eglcore.so", Cap: driver.Graphics},
	{Stem: "libnvidia-glsi.so", Cap: driver.Graphics},
	{Stem: "libnvidia-tls.so", Cap: driver.Graphics},
	{Stem: "libnvidia-glvkspirv.so", Cap: driver.Graphics},
	{Stem: "libnvidia-rtcore.so", Cap: driver.Graphics},
	{Stem: "libnvoptix.so", Major: "1", Cap: driver.Graphics},
	{Stem: "libnvidia-fbc.so", Major: "1", Cap: driver.Graphics},
	{Stem: "libnvidia-egl-gbm.so", Major: "1", Own: "1.1.1", Cap: driver.Graphics},
	{Stem: "libnvidia-egl-wayland.so", Major: "1", Own: "1.1.13", Cap: driver.Graphics},

	{Stem: "libnvidia-ngx.so", Major: "1", Cap: driver.NGX},
}

// FakeLibraryStems lists the library stems ("libcuda.so") a fake driver has,
// for tests that check discovery finds them all.
func FakeLibraryStems() []string {
	out := make([]string, len(fakeLibraries))
	for i, l := range fakeLibraries {
		out[i] = l.Stem
	}
	return out
}

// fakeBinaries are the driver programs; each is the same fake program,
// which names itself from argv[0].
var fakeBinaries = []string{
	"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
	"nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
}

// cudaByBranch maps a driver branch to the CUDA version it shipped with.
var cudaByBranch = []struct{ branch, cuda int }{
	{450, 11000}, {455, 11010}, {460, 11020}, {465, 11030}, {470, 11040},
	{495, 11050}, {510, 11060}, {515, 11070}, {520, 11080}, {525, 12000},
	{530, 12010}, {535, 12020}, {545, 12030}, {550, 12040}, {555, 12050},
	{560, 12060}, {565, 12070}, {570, 12080}, {575, 12090}, {580, 13000},
}

// CUDAVersionFor returns the CUDA driver API version (major*1000+minor*10)
// that the driver branch of version shipped with: 12040 for 550.54.15.
func CUDAVersionFor(version string) int {
	branch, _ := strconv.Atoi(strings.SplitN(version, ".", 2)[0])
	v := cudaByBranch[0].cuda
	for _, e := range cudaByBranch {
		if branch >= e.branch {
			v = e.cuda
		}
	}
	return v
}

// parseCUDA turns "12.4" into 12040.
func parseCUDA(s string) (int, error) {
	maj, min, ok := strings.Cut(s, ".")
	a, err1 := strconv.Atoi(maj)
	b, err2 := strconv.Atoi(min)
	if !ok || err1 != nil || err2 != nil || a < 1 || b < 0 || b > 99 {
		return 0, fmt.Errorf("CUDA version %q: use the form 12.4", s)
	}
	return a*1000 + b*10, nil
}

// Build makes a fake driver root at root (created if missing; files of an
// earlier build are replaced). It needs gcc; ldconfig and root privileges
// make it more faithful (a real ld.so.cache, real device nodes), and their
// absence is reported in Result.Notes rather than failing.
func Build(root string, opts Options) (*Result, error) {
	if opts.Version == "" {
		opts.Version = DefaultVersion
	}
	if !driver.IsVersion(opts.Version) {
		return nil, fmt.Errorf("fake driver version %q: use the form 550.54.15", opts.Version)
	}
	switch opts.Layout {
	case "":
		opts.Layout = LayoutStandard
	case LayoutStandard, LayoutGKE:
	default:
		return nil, fmt.Errorf("fake driver layout %q: use %s or %s", opts.Layout, LayoutStandard, LayoutGKE)
	}
	if opts.GPUs == 0 {
		opts.GPUs = 8
	}
	if opts.GPUs < 0 || opts.GPUs > 64 {
		return nil, fmt.Errorf("fake driver GPU count %d: use 1 to 64", opts.GPUs)
	}
	cuda := CUDAVersionFor(opts.Version)
	if opts.CUDAVersion != "" {
		var err error
		if cuda, err = parseCUDA(opts.CUDAVersion); err != nil {
			return nil, err
		}
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		return nil, fmt.Errorf("building a fake driver needs gcc: install it (apt-get install gcc): %w", err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("fake driver root %q: %w", root, err)
	}
	if opts.CacheDir == "" {
		opts.CacheDir = defaultCacheDir()
	}

	b := &builder{
		root: abs, opts: opts, cuda: cuda,
		cc:  &compiler{cacheDir: opts.CacheDir},
		res: &Result{Root: abs, Version: opts.Version, Layout: opts.Layout, CUDAVersion: cuda},
	}
	steps := []func() error{b.skeleton, b.libraries, b.programs, b.files, b.ldcache, b.devices}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, fmt.Errorf("building a fake driver in %s: %w", abs, err)
		}
	}
	return b.res, nil
}

func defaultCacheDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "gantry", "fakedriver")
	}
	return filepath.Join(os.TempDir(), "gantry-fakedriver-cache")
}

type builder struct {
	root string
	opts Options
	cuda int
	cc   *compiler
	res  *Result
}

// host returns the host path of an in-root path.
func (b *builder) host(p string) string { return filepath.Join(b.root, p) }

func (b *builder) note(format string, args ...any) {
	b.res.Notes = append(b.res.Notes, fmt.Sprintf(format, args...))
}

func (b *builder) write(p string, data string, perm os.FileMode) error {
	h := b.host(p)
	if err := os.MkdirAll(filepath.Dir(h), 0o755); err != nil {
		return err
	}
	os.Remove(h)
	return os.WriteFile(h, []byte(data), perm)
}

// link makes the symlink p -> target, replacing whatever is at p.
func (b *builder) link(target, p string) error {
	h := b.host(p)
	if err := os.MkdirAll(filepath.Dir(h), 0o755); err != nil {
		return err
	}
	os.Remove(h)
	return os.Symlink(target, h)
}

// skeleton makes a merged-/usr tree, as current Debian, Ubuntu and Fedora
// have: /lib, /lib64, /bin and /sbin are links into /usr.
func (b *builder) skeleton() error {
	for _, d := range []string{"usr/lib", "usr/lib64", "usr/bin", "usr/sbin", "etc", "dev", "tmp", "run"} {
		if err := os.MkdirAll(b.host(d), 0o755); err != nil {
			return err
		}
	}
	for _, l := range []string{"lib", "lib64", "bin", "sbin"} {
		if _, err := os.Lstat(b.host(l)); err == nil {
			continue // an earlier build's, or a real directory the caller made
		}
		if err := os.Symlink("usr/"+l, b.host(l)); err != nil {
			return err
		}
	}
	if b.opts.Layout == LayoutGKE {
		b.res.LibDir = "/usr/local/nvidia/lib64"
	} else {
		b.res.LibDir = "/usr/lib/x86_64-linux-gnu"
	}
	return nil
}

// libraries compiles (or takes from the cache) and installs every library,
// with its SONAME link and development link.
func (b *builder) libraries() error {
	v := b.opts.Version
	type job struct {
		lib    fakeLib
		bits   int
		src    string
		args   []string
		out    string // cached object, filled in by the compile
		err    error
		file   string // in-root path of the real file
		soname string
		capab  driver.Capability
	}
	var jobs []*job
	add := func(l fakeLib, bits int) {
		file := l.Stem + "." + v
		soname := file
		if l.Own != "" {
			file = l.Stem + "." + l.Own
		}
		if l.Major != "" {
			soname = l.Stem + "." + l.Major
		}
		dir := b.res.LibDir
		c := l.Cap
		args := []string{"-shared", "-fPIC", "-O2", "-Wl,-soname," + soname}
		if bits == 32 {
			dir = "/usr/lib/i386-linux-gnu"
			c = driver.Compat32
			args = append([]string{"-m32", "-nostdlib"}, args...)
		} else if l.Sub != "" && b.opts.Layout == LayoutStandard {
			dir = path.Join(dir, l.Sub)
		}
		jobs = append(jobs, &job{
			lib: l, bits: bits, src: librarySource(l.Stem, v, b.cuda, b.ckpt()), args: args,
			file: path.Join(dir, file), soname: soname, capab: c,
		})
	}
	for _, l := range fakeLibraries {
		add(l, 64)
	}
	if b.opts.Compat32 {
		if runtime.GOARCH != "amd64" {
			b.note("compat32 libraries skipped: they are built only on x86-64 hosts")
		} else {
			for _, l := range fakeLibraries {
				if l.Compat32 {
					add(l, 32)
				}
			}
		}
	}

	// Compile in parallel: a cold cache means ~40 gcc runs.
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(2, runtime.NumCPU()))
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			j.out, j.err = b.cc.build(j.src, j.args)
		}()
	}
	wg.Wait()

	var err32 error
	for _, j := range jobs {
		if j.bits == 32 && j.err != nil && err32 == nil {
			err32 = j.err
			b.note("compat32 libraries skipped: gcc cannot build 32-bit objects here (%v)", j.err)
		}
	}
	for _, j := range jobs {
		if j.bits == 32 && err32 != nil {
			continue // all or none, so the root is consistent
		}
		if j.err != nil {
			return j.err
		}
		if err := os.MkdirAll(b.host(path.Dir(j.file)), 0o755); err != nil {
			return err
		}
		if err := copyFile(j.out, b.host(j.file), 0o755); err != nil {
			return err
		}
		dir, name := path.Split(j.file)
		// SONAME link and the unversioned development link, as the driver
		// installers make them.
		if j.soname != name {
			if err := b.link(name, path.Join(dir, j.soname)); err != nil {
				return err
			}
		}
		if err := b.link(j.soname, path.Join(dir, j.lib.Stem)); err != nil {
			return err
		}
		if j.bits == 32 {
			b.res.Compat32 = true
		}
		if j.bits == 64 && b.opts.Layout == LayoutGKE {
			// Our GPU hosts link the SONAME and development names from
			// /usr/lib (reached as /lib) into the driver tree, by absolute path.
			for _, n := range []string{j.soname, j.lib.Stem} {
				if err := b.link(path.Join(dir, n), path.Join("/usr/lib", n)); err != nil {
					return err
				}
			}
		}
		b.res.Libraries = append(b.res.Libraries, Library{Path: j.file, SONAME: j.soname, Capability: j.capab, Bits: j.bits})
	}
	if b.opts.Layout == LayoutGKE {
		if err := b.link("lib64", "/usr/local/nvidia/lib"); err != nil {
			return err
		}
	}
	// The GBM backend is a link to the allocator.
	return b.link("../libnvidia-allocator.so.1", path.Join(b.res.LibDir, "gbm/nvidia-drm_gbm.so"))
}

// programs installs the fake driver programs and the X server modules.
func (b *builder) programs() error {
	src := programSource(b.opts.Version, b.cuda, b.opts.Identities)
	prog, err := b.cc.build(src, []string{"-O2", "-static"})
	if err != nil {
		b.note("nvidia-smi is dynamically linked: static linking failed (%v)", err)
		if prog, err = b.cc.build(src, []string{"-O2"}); err != nil {
			return err
		}
	}
	binDir := "/usr/bin"
	if b.opts.Layout == LayoutGKE {
		binDir = "/usr/local/nvidia/bin"
	}
	for _, name := range fakeBinaries {
		p := path.Join(binDir, name)
		if err := os.MkdirAll(b.host(binDir), 0o755); err != nil {
			return err
		}
		if err := copyFile(prog, b.host(p), 0o755); err != nil {
			return err
		}
		b.res.Binaries = append(b.res.Binaries, p)
	}
	if b.opts.Layout == LayoutGKE {
		// Our GPU hosts have a shell wrapper here that runs the real
		// program from the driver tree.
		wrapper := "#!/bin/sh\n# gantry fakedriver: the driver's programs live in /usr/local/nvidia/bin.\n" +
			"export LD_LIBRARY_PATH=\"${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/nvidia/lib64\"\n" +
			"exec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n"
		if err := b.write("/usr/bin/nvidia-smi", wrapper, 0o755); err != nil {
			return err
		}
	}

	// X server modules: the DDX driver and the GLX server extension.
	v := b.opts.Version
	for _, m := range []struct{ path, soname string }{
		{"/usr/lib/xorg/modules/drivers/nvidia_drv.so", ""},
		{"/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so." + v, "libglxserver_nvidia.so." + v},
	} {
		args := []string{"-shared", "-fPIC", "-O2"}
		if m.soname != "" {
			args = append(args, "-Wl,-soname,"+m.soname)
		}
		obj, err := b.cc.build(librarySource(path.Base(m.path), v, b.cuda, ckptParams{}), args)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(b.host(path.Dir(m.path)), 0o755); err != nil {
			return err
		}
		if err := copyFile(obj, b.host(m.path), 0o755); err != nil {
			return err
		}
		b.res.Configs = append(b.res.Configs, m.path)
	}
	return b.link("libglxserver_nvidia.so."+v, "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so")
}

// files writes the version file, firmware and configuration files.
func (b *builder) files() error {
	v := b.opts.Version
	gke := b.opts.Layout == LayoutGKE
	procVersion := fmt.Sprintf("NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n", v)
	if gke {
		// Our GPU hosts run the open kernel module, which words it so.
		procVersion = fmt.Sprintf("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (builder@fake)  \nGCC version:  gcc version 12.3.0 (GCC) \n", v)
	}
	if err := b.write("/proc/driver/nvidia/version", procVersion, 0o444); err != nil {
		return err
	}
	// The kernel's character-device majors, as /proc/devices lists them, so
	// tools that check node numbers (gantry doctor) see the fake ones.
	imex := ""
	if b.opts.IMEXChannels > 0 {
		imex = fmt.Sprintf("%d nvidia-caps-imex-channels\n", IMEXMajor)
	}
	procDevices := fmt.Sprintf("Character devices:\n  1 mem\n%d nvidia-frontend\n%d nvidia-caps\n%s%d nvidia-uvm\n\nBlock devices:\n  8 sd\n", NvidiaMajor, CapsMajor, imex, UVMMajor)
	if err := b.write("/proc/devices", procDevices, 0o444); err != nil {
		return err
	}

	fwDir := "/usr/lib/firmware/nvidia/" + v // /lib/firmware through the /lib link
	if gke {
		fwDir = "/usr/local/nvidia/firmware/nvidia/" + v
		if err := b.write("/usr/local/nvidia/version", v, 0o644); err != nil {
			return err
		}
	}
	for _, n := range []string{"gsp_ga10x.bin", "gsp_tu10x.bin"} {
		p := path.Join(fwDir, n)
		if err := b.write(p, "gantry fakedriver GSP firmware "+n+" "+v+"\n", 0o644); err != nil {
			return err
		}
		b.res.Firmware = append(b.res.Firmware, p)
	}

	share := "/usr/share"
	if gke {
		share = "/usr/local/nvidia/share"
	}
	icd := func(lib string) string {
		return fmt.Sprintf("{\n    \"file_format_version\" : \"1.0.0\",\n    \"ICD\" : {\n        \"library_path\" : %q\n    }\n}\n", lib)
	}
	configs := []struct{ path, data string }{
		{share + "/vulkan/icd.d/nvidia_icd.json", "{\n    \"file_format_version\" : \"1.0.1\",\n    \"ICD\": {\n        \"library_path\": \"libGLX_nvidia.so.0\",\n        \"api_version\" : \"1.3.277\"\n    }\n}\n"},
		{share + "/vulkan/implicit_layer.d/nvidia_layers.json", "{\n    \"file_format_version\" : \"1.0.0\",\n    \"layer\": {\n        \"name\": \"VK_LAYER_NV_optimus\",\n        \"type\": \"INSTANCE\",\n        \"library_path\": \"libGLX_nvidia.so.0\",\n        \"api_version\" : \"1.3.277\",\n        \"implementation_version\" : \"1\",\n        \"description\" : \"NVIDIA Optimus layer\"\n    }\n}\n"},
		{share + "/glvnd/egl_vendor.d/10_nvidia.json", icd("libEGL_nvidia.so.0")},
	}
	if !gke {
		configs = append(configs, []struct{ path, data string }{
			{"/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json", icd("libnvidia-egl-gbm.so.1")},
			{"/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json", icd("libnvidia-egl-wayland.so.1")},
			{"/etc/OpenCL/vendors/nvidia.icd", "libnvidia-opencl.so.1\n"},
			{"/usr/share/nvidia/nvidia-application-profiles-" + v + "-rc", "{\n    \"rules\": [],\n    \"profiles\": []\n}\n"},
			{"/usr/share/X11/xorg.conf.d/10-nvidia.conf", "Section \"OutputClass\"\n    Identifier \"nvidia\"\n    MatchDriver \"nvidia-drm\"\n    Driver \"nvidia\"\n    ModulePath \"/usr/lib/x86_64-linux-gnu/nvidia/xorg\"\nEndSection\n"},
		}...)
	}
	for _, c := range configs {
		if err := b.write(c.path, c.data, 0o644); err != nil {
			return err
		}
		b.res.Configs = append(b.res.Configs, c.path)
	}
	if gke {
		// The host's loaders look in /usr/share; our GPU hosts have the
		// files there too, here as absolute links into the driver tree.
		for _, rel := range []string{"vulkan/icd.d/nvidia_icd.json", "glvnd/egl_vendor.d/10_nvidia.json"} {
			if err := b.link(path.Join(share, rel), path.Join("/usr/share", rel)); err != nil {
				return err
			}
		}
	}
	return nil
}

// ldcache writes etc/ld.so.conf and runs ldconfig -r on the root. The GKE
// layout lists /usr/local/nvidia/lib64 and /usr/local/nvidia/lib, as our GPU
// hosts' /etc/ld.so.conf.d/nvidia.conf does (GKE's own nodes rely on
// LD_LIBRARY_PATH instead; listing the tree is what makes the host's cache
// and a container's agree).
func (b *builder) ldcache() error {
	confs := map[string]string{
		"/etc/ld.so.conf":                         "include /etc/ld.so.conf.d/*.conf\n",
		"/etc/ld.so.conf.d/libc.conf":             "# libc default configuration\n/usr/local/lib\n",
		"/etc/ld.so.conf.d/x86_64-linux-gnu.conf": "# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n",
	}
	if b.res.Compat32 {
		confs["/etc/ld.so.conf.d/i386-linux-gnu.conf"] = "# Multiarch support\n/usr/local/lib/i386-linux-gnu\n/lib/i386-linux-gnu\n/usr/lib/i386-linux-gnu\n"
	}
	if b.opts.Layout == LayoutGKE {
		confs["/etc/ld.so.conf.d/nvidia.conf"] = "/usr/local/nvidia/lib64\n/usr/local/nvidia/lib\n"
	}
	for p, data := range confs {
		if err := b.write(p, data, 0o644); err != nil {
			return err
		}
	}
	ldconfig := ""
	for _, c := range []string{"ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"} {
		if p, err := exec.LookPath(c); err == nil {
			ldconfig = p
			break
		}
	}
	if ldconfig == "" {
		b.note("no etc/ld.so.cache: ldconfig not found (discovery falls back to the library directories)")
		return nil
	}
	// -r chroots into the root, which needs root privileges.
	out, err := exec.Command(ldconfig, "-r", b.root).CombinedOutput()
	if err != nil {
		b.note("no etc/ld.so.cache: %s -r failed: %v: %s", ldconfig, err, firstLine(string(out)))
		return nil
	}
	b.res.LDCache = true
	return nil
}

// devices makes the device nodes and the persistenced socket.
func (b *builder) devices() error {
	type node struct {
		path         string
		major, minor uint32
	}
	var nodes []node
	for i := 0; i < b.opts.GPUs; i++ {
		nodes = append(nodes, node{fmt.Sprintf("/dev/nvidia%d", i), NvidiaMajor, uint32(i)})
	}
	nodes = append(nodes,
		node{"/dev/nvidiactl", NvidiaMajor, 255},
		node{"/dev/nvidia-modeset", NvidiaMajor, 254},
		node{"/dev/nvidia-uvm", UVMMajor, 0},
		node{"/dev/nvidia-uvm-tools", UVMMajor, 1},
		node{"/dev/nvidia-caps/nvidia-cap1", CapsMajor, 1},
		node{"/dev/nvidia-caps/nvidia-cap2", CapsMajor, 2},
	)
	for i := 0; i < b.opts.IMEXChannels; i++ {
		nodes = append(nodes, node{fmt.Sprintf("/dev/nvidia-caps-imex-channels/channel%d", i), IMEXMajor, uint32(i)})
	}
	real := b.opts.DeviceNodes
	var mknodErr error
	for _, n := range nodes {
		h := b.host(n.path)
		if err := os.MkdirAll(filepath.Dir(h), 0o755); err != nil {
			return err
		}
		os.Remove(h)
		if real {
			err := unix.Mknod(h, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor)))
			if err == nil {
				err = os.Chmod(h, 0o666) // mknod honours the umask
			}
			if err != nil {
				real, mknodErr = false, err
				// Replace the nodes made so far, so the root is consistent.
				for _, done := range b.res.DeviceNodes {
					os.Remove(b.host(done))
					if err := os.WriteFile(b.host(done), nil, 0o666); err != nil {
						return err
					}
				}
			}
		}
		if !real {
			if err := os.WriteFile(h, nil, 0o666); err != nil {
				return err
			}
		}
		b.res.DeviceNodes = append(b.res.DeviceNodes, n.path)
	}
	b.res.RealDeviceNodes = real
	switch {
	case mknodErr != nil:
		b.note("device nodes are regular files: mknod failed (%v); run as root for character devices", mknodErr)
	case !b.opts.DeviceNodes:
		b.note("device nodes are regular files: Options.DeviceNodes is off")
	}

	// nvidia-persistenced's socket, as a socket inode with nobody listening
	// (mknod of a socket needs no privilege, and no path length limit
	// applies as it would to bind).
	sock := "/run/nvidia-persistenced/socket"
	h := b.host(sock)
	if err := os.MkdirAll(filepath.Dir(h), 0o755); err != nil {
		return err
	}
	os.Remove(h)
	if err := unix.Mknod(h, unix.S_IFSOCK|0o666, 0); err != nil {
		if !errors.Is(err, unix.EPERM) {
			return fmt.Errorf("creating %s: %w", h, err)
		}
		b.note("no persistenced socket: %v", err)
		return nil
	}
	b.res.Sockets = append(b.res.Sockets, sock)
	return nil
}
