package driver

import (
	"debug/elf"
	"os"
	"path"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gantry-gpu/gantry/internal/ldcache"
)

// libSpec is one driver library Discover looks for.
type libSpec struct {
	// Stem is the name up to and including ".so" ("libcuda.so"); the file
	// that is selected is Stem + "." + driver version.
	Stem string
	Cap  Capability
	// OwnVersion marks libraries NVIDIA ships with a version of their own
	// (the EGL platform libraries, libnvidia-egl-wayland.so.1.1.13): any
	// numeric suffix is accepted for them.
	OwnVersion bool
}

// driverLibraries is the list of user-space driver libraries by capability,
// as NVIDIA's container library documents them, plus the EGL platform and
// Vulkan producer libraries its toolkit adds for graphics.
var driverLibraries = []libSpec{
	{Stem: "libnvidia-ml.so", Cap: Utility},
	{Stem: "libnvidia-cfg.so", Cap: Utility},
	{Stem: "libnvidia-nscq.so", Cap: Utility},

	{Stem: "libcuda.so", Cap: Compute},
	{Stem: "libcudadebugger.so", Cap: Compute},
	{Stem: "libnvidia-opencl.so", Cap: Compute},
	{Stem: "libnvidia-gpucomp.so", Cap: Compute},
	{Stem: "libnvidia-ptxjitcompiler.so", Cap: Compute},
	{Stem: "libnvidia-fatbinaryloader.so", Cap: Compute},
	{Stem: "libnvidia-allocator.so", Cap: Compute},
	{Stem: "libnvidia-compiler.so", Cap: Compute},
	{Stem: "libnvidia-pkcs11.so", Cap: Compute},
	{Stem: "libnvidia-pkcs11-openssl3.so", Cap: Compute},
	{Stem: "libnvidia-nvvm.so", Cap: Compute},
	{Stem: "libnvidia-tileiras.so", Cap: Compute},

	{Stem: "libvdpau_nvidia.so", Cap: Video},
	{Stem: "libnvidia-encode.so", Cap: Video},
	{Stem: "libnvidia-opticalflow.so", Cap: Video},
	{Stem: "libnvcuvid.so", Cap: Video},

	{Stem: "libnvidia-eglcore.so", Cap: Graphics},
	{Stem: "libnvidia-glcore.so", Cap: Graphics},
	{Stem: "libnvidia-tls.so", Cap: Graphics},
	{Stem: "libnvidia-glsi.so", Cap: Graphics},
	{Stem: "libnvidia-fbc.so", Cap: Graphics},
	{Stem: "libnvidia-ifr.so", Cap: Graphics},
	{Stem: "libnvidia-rtcore.so", Cap: Graphics},
	{Stem: "libnvoptix.so", Cap: Graphics},
	{Stem: "libGLX_nvidia.so", Cap: Graphics},
	{Stem: "libEGL_nvidia.so", Cap: Graphics},
	{Stem: "libGLESv2_nvidia.so", Cap: Graphics},
	{Stem: "libGLESv1_CM_nvidia.so", Cap: Graphics},
	{Stem: "libnvidia-glvkspirv.so", Cap: Graphics},
	{Stem: "libnvidia-cbl.so", Cap: Graphics},
	{Stem: "libnvidia-vulkan-producer.so", Cap: Graphics},
	{Stem: "libnvidia-egl-gbm.so", Cap: Graphics, OwnVersion: true},
	{Stem: "libnvidia-egl-wayland.so", Cap: Graphics, OwnVersion: true},
	{Stem: "libnvidia-egl-wayland2.so", Cap: Graphics, OwnVersion: true},
	{Stem: "libnvidia-egl-xcb.so", Cap: Graphics, OwnVersion: true},
	{Stem: "libnvidia-egl-xlib.so", Cap: Graphics, OwnVersion: true},

	{Stem: "libnvidia-ngx.so", Cap: NGX},
}

// libByStem indexes driverLibraries.
var libByStem = func() map[string]int {
	m := make(map[string]int, len(driverLibraries))
	for i, l := range driverLibraries {
		m[l.Stem] = i
	}
	return m
}()

// stemOf returns the index of the driver library a file name belongs to
// ("libcuda.so.1" and "libcuda.so.550.54.15" both belong to "libcuda.so").
func stemOf(name string) (int, bool) {
	i := strings.Index(name, ".so")
	if i < 0 {
		return 0, false
	}
	rest := name[i+3:]
	if rest != "" && rest[0] != '.' {
		return 0, false
	}
	idx, ok := libByStem[name[:i+3]]
	return idx, ok
}

// libraryDirs are the directories (inside the driver root) searched besides
// ld.so.cache, in order: the distributions' library directories, the
// Debian/Ubuntu driver package and VDPAU subdirectories, the 32-bit
// directories, and the GKE-style /usr/local/nvidia install.
var libraryDirs = []string{
	"/usr/lib/x86_64-linux-gnu",
	"/usr/lib/aarch64-linux-gnu",
	"/usr/lib64",
	"/lib/x86_64-linux-gnu",
	"/lib/aarch64-linux-gnu",
	"/lib64",
	"/usr/lib",
	"/lib",
	"/usr/lib/x86_64-linux-gnu/nvidia/current",
	"/usr/lib/x86_64-linux-gnu/vdpau",
	"/usr/lib64/vdpau",
	"/usr/lib/vdpau",
	"/usr/lib/i386-linux-gnu",
	"/usr/lib32",
	"/lib/i386-linux-gnu",
	"/lib32",
	"/usr/local/nvidia/lib64",
	"/usr/local/nvidia/lib",
}

// nativeMachines are the ELF machines of this build's 64-bit and 32-bit
// libraries.
func nativeMachines() (elf.Machine, elf.Machine) {
	if runtime.GOARCH == "arm64" {
		return elf.EM_AARCH64, elf.EM_ARM
	}
	return elf.EM_X86_64, elf.EM_386
}

// candidate is a driver library file found by name, before version selection.
type candidate struct {
	lib  int    // index in driverLibraries
	path string // in-root path, symlinks resolved
}

// libraryScan gathers library candidates from ld.so.cache and the library
// directories, in that order, resolving each through the root.
type libraryScan struct {
	r     *resolver
	cands []candidate
	seen  map[string]bool // real paths taken
	asked map[string]bool // paths already resolved, to skip repeats cheaply
}

func (s *libraryScan) add(lib int, p string) {
	if s.asked[p] {
		return
	}
	s.asked[p] = true
	real, err := s.r.Resolve(p)
	if err != nil || s.seen[real] {
		return
	}
	s.seen[real] = true
	s.cands = append(s.cands, candidate{lib: lib, path: real})
}

// addResolved adds the in-root path p, which has no symlink in it.
func (s *libraryScan) addResolved(lib int, p string) {
	if s.asked[p] {
		return
	}
	s.asked[p] = true
	if s.seen[p] {
		return
	}
	s.seen[p] = true
	s.cands = append(s.cands, candidate{lib: lib, path: p})
}

// fromCache adds the cache entries that name driver libraries. A missing or
// unreadable cache is not an error: the directory scan still finds the files.
func (s *libraryScan) fromCache(cachePath string) error {
	if _, err := os.Stat(cachePath); err != nil {
		return nil
	}
	c, err := ldcache.Open(cachePath)
	if err != nil {
		return err
	}
	for _, e := range c.Entries {
		if i, ok := stemOf(e.Name); ok {
			s.add(i, e.Path)
		}
		// Entries are keyed by SONAME; the versioned file a SONAME link
		// points to is found by resolving the entry's path.
	}
	return nil
}

// fromDir adds the driver libraries in one directory.
func (s *libraryScan) fromDir(dir string, done map[string]bool) {
	rd, err := s.r.Resolve(dir)
	if err != nil || done[rd] {
		return
	}
	done[rd] = true
	ents, err := os.ReadDir(s.r.host(rd))
	if err != nil {
		return
	}
	for _, e := range ents {
		i, ok := stemOf(e.Name())
		if !ok {
			continue
		}
		p := path.Join(rd, e.Name())
		if e.Type().IsRegular() {
			// rd has no symlinks left and this is no symlink: p is its
			// own resolution, without an lstat.
			s.addResolved(i, p)
			continue
		}
		s.add(i, p)
	}
}

// versionFromLibraries infers the driver version from the file name of
// libcuda.so.X.Y(.Z) or libnvidia-ml.so.X.Y(.Z), as NVIDIA's toolkit does
// when it cannot ask the kernel module.
func versionFromLibraries(cands []candidate) string {
	for _, stem := range []string{"libcuda.so", "libnvidia-ml.so"} {
		for _, c := range cands {
			if driverLibraries[c.lib].Stem != stem {
				continue
			}
			if v, ok := strings.CutPrefix(path.Base(c.path), stem+"."); ok && IsVersion(v) {
				return v
			}
		}
	}
	return ""
}

// selectLibraries keeps the candidates whose file name carries the driver
// version, reads their ELF headers, and picks one file per library and word
// size, the first in search order (ld.so.cache first). Libraries with a
// version of their own are taken only from a directory that holds
// driver-versioned libraries, so a distribution's unrelated copy elsewhere,
// or a root without this driver version, does not contribute them.
func selectLibraries(r *resolver, cands []candidate, version string) []File {
	m64, m32 := nativeMachines()
	type key struct {
		lib  int
		bits int
	}
	taken := map[key]bool{}
	driverDirs := map[string]bool{}
	infos := readELFs(r, cands, version)
	var out []File
	for pass := 0; pass < 2; pass++ {
		for _, c := range cands {
			spec := driverLibraries[c.lib]
			if spec.OwnVersion != (pass == 1) {
				continue
			}
			suffix, ok := strings.CutPrefix(path.Base(c.path), spec.Stem+".")
			if !ok {
				continue
			}
			if spec.OwnVersion {
				if !(IsVersion(suffix) || isNumber(suffix)) || !driverDirs[path.Dir(c.path)] {
					continue
				}
			} else if suffix != version {
				continue
			}
			got, ok := infos[c.path]
			if !ok || got.err != nil {
				continue
			}
			info := got.info
			bits := 0
			switch {
			case info.Class == elf.ELFCLASS64 && info.Machine == m64:
				bits = 64
			case info.Class == elf.ELFCLASS32 && info.Machine == m32:
				bits = 32
			default:
				continue // another architecture's library
			}
			k := key{c.lib, bits}
			if taken[k] {
				continue
			}
			taken[k] = true
			driverDirs[path.Dir(c.path)] = true
			capability := spec.Cap
			if bits == 32 {
				capability = Compat32
			}
			out = append(out, File{
				HostPath:      r.host(c.path),
				ContainerPath: c.path,
				Kind:          KindLibrary,
				Capability:    capability,
				SONAME:        info.SONAME,
			})
		}
	}
	return out
}

// elfResult is one readELFFile outcome.
type elfResult struct {
	info elfInfo
	err  error
}

// maxELFReaders bounds the goroutines readELFs reads with: each may cost
// the runtime a new thread, tens of microseconds in a fresh process.
const maxELFReaders = 4

// readELFs reads the ELF facts of every candidate whose name selectLibraries
// may take (the driver's version, or a version of the library's own), by
// in-root path, several files at a time: they are the bulk of a discovery's
// reads, each a few small reads of another file. The selection itself stays
// in search order, so the result does not depend on which read ends first.
func readELFs(r *resolver, cands []candidate, version string) map[string]elfResult {
	var paths []string
	for _, c := range cands {
		spec := driverLibraries[c.lib]
		suffix, ok := strings.CutPrefix(path.Base(c.path), spec.Stem+".")
		if !ok {
			continue
		}
		if spec.OwnVersion && (IsVersion(suffix) || isNumber(suffix)) || !spec.OwnVersion && suffix == version {
			paths = append(paths, c.path)
		}
	}
	out := make(map[string]elfResult, len(paths))
	results := make([]elfResult, len(paths))
	workers := min(runtime.GOMAXPROCS(0), maxELFReaders, len(paths)/4)
	if workers < 2 {
		for i, p := range paths {
			results[i].info, results[i].err = readELFFile(r.host(p))
		}
	} else {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for {
					i := int(next.Add(1) - 1)
					if i >= len(paths) {
						return
					}
					results[i].info, results[i].err = readELFFile(r.host(paths[i]))
				}
			})
		}
		wg.Wait()
	}
	for i, p := range paths {
		out[p] = results[i]
	}
	return out
}

func isNumber(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
