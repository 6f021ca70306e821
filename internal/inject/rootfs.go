package inject

import (
	"path"

	"github.com/gantry-gpu/gantry/internal/containerhook"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// NeedsRootfs reports whether e holds changes that must land inside the
// container's root filesystem (FinishRootfs), which neither config.json nor
// the mount namespace can carry: SONAME links and ld.so.cache entries.
// Every field of edits.Edits is classified in rootfsFields or specFields;
// TestEveryEditIsClassified fails for a new field that is in neither, so a
// new kind of edit cannot be skipped silently by the front ends' "is there
// anything to do in the rootfs" test.
func NeedsRootfs(e *edits.Edits) bool {
	return e != nil && (len(e.Symlinks) > 0 || len(e.LibraryDirs) > 0)
}

// rootfsFields are the fields of edits.Edits that FinishRootfs applies
// (NeedsRootfs must see them); specFields those that config.json
// (edits.ApplyToSpec) or the mount namespace (nsmount) carry. Mounts are
// both: a mounted library's ld.so.cache entry is made by FinishRootfs, and
// edits.Common always names its directory in LibraryDirs.
var (
	rootfsFields = []string{"Symlinks", "LibraryDirs"}
	specFields   = []string{"Env", "DeviceNodes", "Mounts"}
)

// FinishRootfs makes the part of the plan's edits that must land inside the
// container's root filesystem, when there is one (NeedsRootfs): open is
// then called for the root (the bundle's rootfs for the runtime, the
// container's view of it through /proc/PID/root for the hooks) and the root
// is closed afterwards. Decisions and warnings go to the record's notes and
// to note, if not nil.
func (p *Plan) FinishRootfs(open func() (*rootfs.Root, error), note func(string)) error {
	if p == nil || !NeedsRootfs(p.Edits) {
		return nil
	}
	root, err := open()
	if err != nil {
		return err
	}
	defer root.Close()
	return applyEdits(root, p.Edits, p.Inventory, p.inTree, p.opts.ForwardCompat, func(s string) {
		p.Record.Notes = append(p.Record.Notes, s)
		if note != nil {
			note(s)
		}
	})
}

// ApplyEdits makes the part of e that must land inside the container's root
// filesystem: the SONAME links, and ld.so.cache entries for every injected
// library under its SONAME, 64-bit and (compat32) 32-bit, known from inv, so
// the libraries need not be mounted yet. When forwardCompat is set and the
// 64-bit libcuda is injected, the image's CUDA forward-compatibility
// libraries go first if they are newer than the host driver
// (containerhook.ForwardCompat). note receives decisions and warnings worth
// a log line.
func ApplyEdits(root *rootfs.Root, e *edits.Edits, inv *driver.Inventory, forwardCompat bool, note func(string)) error {
	return applyEdits(root, e, inv, nil, forwardCompat, note)
}

// applyEdits is ApplyEdits; inTree are the files the driver tree's mount
// provides (Plan.useTree): their ld.so.cache entries name them where the
// container sees them (a link at the per-file path, or the tree itself).
func applyEdits(root *rootfs.Root, e *edits.Edits, inv *driver.Inventory, inTree []edits.Provided, forwardCompat bool, note func(string)) error {
	if e == nil || inv == nil {
		return nil
	}
	if note == nil {
		note = func(string) {}
	}
	links := make([]containerhook.Link, 0, len(e.Symlinks))
	for _, s := range e.Symlinks {
		links = append(links, containerhook.Link{Target: s.Target, Link: s.Link})
	}

	byPath := make(map[string]driver.File, len(inv.Libraries))
	byHost := make(map[string]driver.File, len(inTree))
	for _, f := range inv.Libraries {
		byPath[f.ContainerPath] = f
		if len(inTree) > 0 {
			byHost[f.HostPath] = f
		}
	}
	var libs []containerhook.Library
	cuda := false
	// The injected libraries: mounted at their container path, or (driver
	// tree layout, edits.UseTree) linked there or only in the tree's mount.
	type lib struct {
		at string
		f  driver.File
	}
	injected := make([]lib, 0, len(e.Mounts)+len(inTree))
	for _, m := range e.Mounts {
		if f, ok := byPath[m.ContainerPath]; ok {
			injected = append(injected, lib{m.ContainerPath, f})
		}
	}
	inTreeOnly := false
	for _, t := range inTree {
		if f, ok := byHost[t.HostPath]; ok {
			injected = append(injected, lib{t.Path, f})
			inTreeOnly = inTreeOnly || t.Path != f.ContainerPath
		}
	}
	// Libraries only in the tree: a library of that SONAME that the image
	// carries in the folder (a driver package installed at build time)
	// would still be found there first through LD_LIBRARY_PATH or a
	// RUNPATH, and a stale one fails with a driver/library version
	// mismatch. It is replaced by a link into the tree, as the per-file
	// layout's link replaced it. Each folder is looked into once.
	var stale []containerhook.Link
	byDir := map[string][]string{}
	for _, in := range injected {
		p, f := in.at, in.f
		if f.SONAME == "" {
			continue
		}
		// The inventory marks every 32-bit library Compat32: the bits
		// come from there, and nothing is read from the library here.
		bits32 := f.Capability == driver.Compat32
		libs = append(libs, containerhook.Library{SONAME: f.SONAME, Path: path.Join(path.Dir(p), f.SONAME), Compat32: bits32})
		if p != f.ContainerPath {
			dir := path.Dir(f.ContainerPath)
			stale = append(stale, containerhook.Link{Target: path.Join(path.Dir(p), f.SONAME), Link: path.Join(dir, f.SONAME)})
			byDir[dir] = append(byDir[dir], f.SONAME)
		}
		cuda = cuda || (f.SONAME == "libcuda.so.1" && !bits32)
	}
	present := map[string]bool{}
	for dir, names := range byDir {
		found, err := root.Present(dir, names)
		if err != nil {
			return err
		}
		for n := range found {
			present[path.Join(dir, n)] = true
		}
	}
	for _, l := range stale {
		if present[l.Link] {
			links = append(links, l)
		}
	}
	if len(libs) == 0 {
		return containerhook.CreateSymlinks(root, links)
	}
	dirs := append([]string(nil), e.LibraryDirs...)
	if len(dirs) == 0 || inTreeOnly {
		// The folders the libraries are found in now (the tree's for
		// those only there), for the configuration a later ldconfig in
		// the container reads.
		dirs = dirs[:0]
		seen := map[string]bool{}
		for _, l := range libs {
			if d := path.Dir(l.Path); !seen[d] {
				seen[d] = true
				dirs = append(dirs, d)
			}
		}
	}
	// The image's compat directory is read before anything is written,
	// as it always was.
	if forwardCompat && cuda && inv.Version != "" {
		compat, why, err := containerhook.ForwardCompat(root, inv.Version)
		if err != nil {
			if lerr := containerhook.CreateSymlinks(root, links); lerr != nil {
				return lerr
			}
			return err
		}
		if len(compat) > 0 {
			libs = append(compat, libs...)
			dirs = append([]string{containerhook.CompatDir}, dirs...)
			note("CUDA forward compatibility: " + why)
		}
	}
	// The links (in the libraries' directory) and the loader cache (in
	// /etc) are made at once: they touch different names, each change is
	// atomic on its own, and the filesystem's time on each (a directory
	// entry created, a file renamed over another) is most of this phase.
	// The result is the one made in turn; a failing link is the error
	// reported first, as it was when the links came first.
	if len(links) == 0 {
		return containerhook.AddToLDCache(root, libs, dirs, note)
	}
	linked := make(chan error, 1)
	go func() { linked <- containerhook.CreateSymlinks(root, links) }()
	err := containerhook.AddToLDCache(root, libs, dirs, note)
	if lerr := <-linked; lerr != nil {
		return lerr
	}
	return err
}
