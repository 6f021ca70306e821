package driver

import (
	"os"
	"path"
	"strings"

	"github.com/gantry-gpu/gantry/internal/ldcache"
)

// LoaderLibrary is a driver library as the dynamic loader finds it by its
// SONAME under a driver root, and the driver version in its file's name.
type LoaderLibrary struct {
	SONAME string
	// Link is the in-root path the loader opens (the cache entry, or the
	// SONAME link in a library directory); Path is the file it leads to.
	Link, Path string
	// Version is the driver version in Path's name ("" when it carries none).
	Version string
}

// LoaderLibraries finds libnvidia-ml.so.1 and libcuda.so.1 under root as
// the loader would (root's ld.so.cache first, then the library
// directories), resolved inside the root to the versioned files they lead
// to. These are the user-space half of the driver, whatever version the
// kernel module has: after a driver upgrade without a reboot the two
// differ. A library not found is left out.
func LoaderLibraries(root string) []LoaderLibrary {
	r := newResolver(root)
	want := []struct{ soname, stem string }{{"libnvidia-ml.so.1", "libnvidia-ml.so"}, {"libcuda.so.1", "libcuda.so"}}
	var cached []ldcache.Entry
	if p, err := r.Resolve("/etc/ld.so.cache"); err == nil {
		if _, err := os.Stat(r.host(p)); err == nil {
			if c, err := ldcache.Open(r.host(p)); err == nil {
				cached = c.Entries
			}
		}
	}
	m64, _ := nativeMachines()
	var out []LoaderLibrary
	for _, w := range want {
		var links []string
		for _, e := range cached {
			if e.Name == w.soname {
				links = append(links, e.Path)
			}
		}
		for _, d := range libraryDirs {
			links = append(links, path.Join(d, w.soname))
		}
		for _, l := range links {
			real, err := r.Resolve(l)
			if err != nil {
				continue
			}
			if info, err := readELFFile(r.host(real)); err != nil || info.Machine != m64 {
				continue // a 32-bit copy, or not a library
			}
			v, _ := strings.CutPrefix(path.Base(real), w.stem+".")
			if !IsVersion(v) {
				v = ""
			}
			out = append(out, LoaderLibrary{SONAME: w.soname, Link: l, Path: real, Version: v})
			break
		}
	}
	return out
}
