package containerhook

import (
	"path"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// ApplyEdits makes the part of e that must land inside the container's root
// filesystem, for the front ends that do it in-process (the runtime shim,
// the prestart hook, nvidia-container-cli configure): the SONAME links, and
// ld.so.cache entries for every injected library under its SONAME, 64-bit
// and (compat32) 32-bit, known from inv, so the libraries need not be
// mounted yet. When forwardCompat is set and the 64-bit libcuda is injected,
// the image's CUDA forward-compatibility libraries go first if they are newer
// than the host driver (ForwardCompat).
// note receives decisions and warnings worth a log line.
func ApplyEdits(root *rootfs.Root, e *edits.Edits, inv *driver.Inventory, forwardCompat bool, note func(string)) error {
	if e == nil || inv == nil {
		return nil
	}
	if note == nil {
		note = func(string) {}
	}
	links := make([]Link, 0, len(e.Symlinks))
	for _, s := range e.Symlinks {
		links = append(links, Link{Target: s.Target, Link: s.Link})
	}
	if err := CreateSymlinks(root, links); err != nil {
		return err
	}

	byPath := make(map[string]driver.File, len(inv.Libraries))
	for _, f := range inv.Libraries {
		byPath[f.ContainerPath] = f
	}
	var libs []Library
	cuda := false
	for _, m := range e.Mounts {
		f, ok := byPath[m.ContainerPath]
		if !ok || f.SONAME == "" {
			continue
		}
		// The inventory marks every 32-bit library Compat32: the bits
		// come from there, and nothing is read from the library here.
		bits32 := f.Capability == driver.Compat32
		libs = append(libs, Library{SONAME: f.SONAME, Path: path.Join(path.Dir(m.ContainerPath), f.SONAME), Compat32: bits32})
		cuda = cuda || (f.SONAME == "libcuda.so.1" && !bits32)
	}
	if len(libs) == 0 {
		return nil
	}
	dirs := append([]string(nil), e.LibraryDirs...)
	if len(dirs) == 0 {
		seen := map[string]bool{}
		for _, l := range libs {
			if d := path.Dir(l.Path); !seen[d] {
				seen[d] = true
				dirs = append(dirs, d)
			}
		}
	}
	if forwardCompat && cuda && inv.Version != "" {
		compat, why, err := ForwardCompat(root, inv.Version)
		if err != nil {
			return err
		}
		if len(compat) > 0 {
			libs = append(compat, libs...)
			dirs = append([]string{CompatDir}, dirs...)
			note("CUDA forward compatibility: " + why)
		}
	}
	return AddToLDCache(root, libs, dirs, note)
}
