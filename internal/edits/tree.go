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
// one mount per file.
type Tree struct {
	// HostPath is the tree's directory on the host.
	HostPath string
	// ContainerPath is where the container sees it (DefaultTreePath).
	ContainerPath string
	// Files maps the host path of each driver file the tree holds to its
	// path relative to the tree ("lib64/libcuda.so.580.65.06").
	Files map[string]string
	// Links are the symbolic links the tree holds, relative to it
	// ("lib64/libcuda.so.1", "lib64/libcuda.so").
	Links map[string]bool
}

// UseTree hands the container t as one read-only mount: each read-only mount
// of a file the tree holds becomes a symlink at the same container path that
// points into the tree's mount, so every path the per-file layout gives
// (the library directories the container's ld.so.cache names, nvidia-smi in
// /usr/bin, a vendor file's library_path) still leads to the same file. The
// tree's mount is added when at least one file moved; other mounts (IPC
// sockets, firmware, configuration files the tree does not hold) stay as
// they are. A runtime then makes one mount where it made one per driver
// file: the mounts are most of what runc spends on a GPU container.
//
// A file whose container path is already its place in the tree (a driver
// installed under /usr/local/nvidia) needs no link, nor does a link beside
// it that the tree holds too (its SONAME links). Anything else at or below the tree's
// container path would be hidden by the mount or need a mount point inside
// it; then UseTree reports false and leaves e as it was (the per-file layout).
// Otherwise it returns the container paths of the files the tree now
// provides (linked or in place): their ld.so.cache entries are still due.
func (e *Edits) UseTree(t Tree) ([]string, bool) {
	if e == nil || len(t.Files) == 0 || t.HostPath == "" || !path.IsAbs(t.ContainerPath) {
		return nil, false
	}
	at := path.Clean(t.ContainerPath)
	under := func(p string) bool { return p == at || strings.HasPrefix(p, at+"/") }
	var kept []Mount
	var links []Symlink
	var provided []string
	inTree := map[string]bool{} // container paths the tree's mount provides
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
		provided = append(provided, m.ContainerPath)
		if m.ContainerPath == loc {
			continue
		}
		if under(m.ContainerPath) {
			return nil, false
		}
		links = append(links, Symlink{Target: loc, Link: m.ContainerPath})
	}
	if len(inTree) == 0 {
		return nil, false
	}
	for _, s := range e.Symlinks {
		if !under(s.Link) {
			links = append(links, s)
			continue
		}
		if rel := strings.TrimPrefix(s.Link, at+"/"); !t.Links[rel] {
			return nil, false
		}
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
