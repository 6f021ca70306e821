package edits

import (
	"path"
	"slices"
	"strings"
)

// DefaultTreePath is where the driver tree layout binds the tree in a
// container: nvidia-docker 1.0's volume path, which the official CUDA images
// already name in LD_LIBRARY_PATH (/usr/local/nvidia/lib64) and PATH
// (/usr/local/nvidia/bin).
const DefaultTreePath = "/usr/local/nvidia"

// Tree is a directory of driver files (package drivervol builds one per
// driver version and set of files: those a container's capabilities
// select) that a container can be given as one read-only mount instead of
// one mount per file: programs, libraries, firmware and configuration files.
type Tree struct {
	// HostPath is the tree's directory on the host.
	HostPath string
	// ContainerPath is where the container sees it (DefaultTreePath).
	ContainerPath string
	// Files maps the host path of each driver file the tree holds to its
	// path relative to the tree ("lib64/libcuda.so.580.65.06",
	// "files/etc/OpenCL/vendors/nvidia.icd": drivervol.FilePath).
	Files map[string]string
	// FilesDir is the tree's folder of files that are no program or
	// library ("files": drivervol.FilesDir), "" for none: a file below it
	// is no library the container's ld.so.cache finds, wherever it goes.
	FilesDir string
	// Links are the symbolic links the tree holds, relative to it
	// ("lib64/libcuda.so.1", "lib64/libcuda.so").
	Links map[string]bool
}

// Provided is a driver file the tree gives a container: where the
// container sees it (a link at its per-file path, or its place in the
// tree) and the host file it is.
type Provided struct {
	Path, HostPath string
}

// UseTree hands the container t as one read-only mount. A program, a
// firmware or configuration file (GSP firmware, an ICD or vendor JSON file:
// the loaders and readers open them by path and follow links), or any
// other file outside the folders the container's ld.so.cache names becomes
// a symlink at its per-file container path into the tree's mount, so every
// path the per-file layout gives (nvidia-smi in /usr/bin, the Vulkan ICD
// file in /usr/share/vulkan/icd.d, a vendor file's library_path, a loader's
// module folder) still leads to the same file. Only a mount with "ro" is
// moved: an IPC socket (mounted read-write) keeps its mount whatever the
// tree holds. A library directly in one of those folders (e.LibraryDirs;
// a file in the tree's library folders, not in t.FilesDir) gets no
// link at all: its ld.so.cache entry names its SONAME link in the tree instead, and
// the tree's own links (SONAME and development links) replace the ones the
// per-file layout makes beside it. That leaves a runtime one mount where it
// made one per driver file (the mounts are most of what runc spends on a
// GPU container) and a few links where it made one per file (creating them
// is most of what Gantry spends in the root filesystem). The tree's mount
// is added when at least one file moved; other mounts (IPC sockets, files
// the tree does not hold, such as a directory of application profiles)
// stay as they are.
//
// A file whose container path is already its place in the tree (a driver
// installed under /usr/local/nvidia) needs no link. Anything else at or
// below the tree's container path would be hidden by the mount or need a
// mount point inside it; then UseTree reports false and leaves e as it was
// (the per-file layout). Otherwise it returns the files the tree now
// provides: their ld.so.cache entries are still due.
func (e *Edits) UseTree(t Tree) ([]Provided, bool) {
	if e == nil || len(t.Files) == 0 || t.HostPath == "" || !path.IsAbs(t.ContainerPath) {
		return nil, false
	}
	at := path.Clean(t.ContainerPath)
	under := func(p string) bool { return p == at || strings.HasPrefix(p, at+"/") }
	// cached: a library the container's ld.so.cache finds in the tree.
	// A file of the tree's FilesDir is none, wherever it goes.
	cached := func(p, rel string) bool {
		return slices.Contains(e.LibraryDirs, path.Dir(p)) && (t.FilesDir == "" || !strings.HasPrefix(rel, t.FilesDir+"/"))
	}
	var kept []Mount
	var links []Symlink
	var provided []Provided
	inTree := map[string]bool{} // container paths the tree's mount provides
	// moved: each library folder whose libraries are now only in the
	// tree, and the tree's folder that has them (lib64, or lib for 32-bit).
	moved := map[string]string{}
	for _, m := range e.Mounts {
		rel, ok := t.Files[m.HostPath]
		if !ok || !slices.Contains(m.Options, "ro") || !validRel(rel) {
			if under(m.ContainerPath) {
				return nil, false
			}
			kept = append(kept, m)
			continue
		}
		loc := path.Join(at, rel)
		inTree[loc] = true
		if m.ContainerPath == loc {
			provided = append(provided, Provided{Path: loc, HostPath: m.HostPath})
			continue
		}
		if under(m.ContainerPath) {
			return nil, false
		}
		if cached(m.ContainerPath, rel) {
			provided = append(provided, Provided{Path: loc, HostPath: m.HostPath})
			moved[path.Dir(m.ContainerPath)] = path.Dir(loc)
			continue
		}
		provided = append(provided, Provided{Path: m.ContainerPath, HostPath: m.HostPath})
		links = append(links, Symlink{Target: loc, Link: m.ContainerPath})
	}
	if len(inTree) == 0 {
		return nil, false
	}
	// held is the tree's own link or file of that name in the tree
	// folder dir moved to, as a container path.
	held := func(dir, name string) string {
		p := path.Join(dir, name)
		if rel := strings.TrimPrefix(p, at+"/"); t.Links[rel] || inTree[p] {
			return p
		}
		return ""
	}
	for _, s := range e.Symlinks {
		if under(s.Link) {
			if rel := strings.TrimPrefix(s.Link, at+"/"); !t.Links[rel] {
				return nil, false
			}
			continue
		}
		if dir, ok := moved[path.Dir(s.Link)]; ok {
			if p := held(dir, path.Base(s.Link)); p != "" {
				if !strings.HasSuffix(s.Link, ".so") {
					continue // the tree has it beside the library
				}
				// A development link (libcuda.so) stays where a
				// compiler's -lcuda and dlopen("libcuda.so") look, which
				// no ld.so.cache entry serves: into the tree's.
				links = append(links, Symlink{Target: p, Link: s.Link})
				continue
			}
		}
		// A link to a library that is now only in the tree (a development
		// link beside it, GBM's backend link from gbm/) points there.
		target := s.Target
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(s.Link), target)
		}
		if dir, ok := moved[path.Dir(target)]; ok {
			if p := held(dir, path.Base(target)); p != "" {
				s.Target = p
			}
		}
		links = append(links, s)
	}
	e.Mounts = append(kept, Mount{HostPath: t.HostPath, ContainerPath: at, Options: slices.Clone(ReadOnlyOptions)})
	e.Symlinks = links
	e.normalize()
	return provided, true
}

// validRel reports whether rel is a plain relative path inside a tree.
func validRel(rel string) bool {
	return rel != "" && !path.IsAbs(rel) && path.Clean(rel) == rel && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}
