package edits

import (
	"os"
	"slices"
	"strings"
)

// VisibleDevicesVoid is in the common edits of the CDI specs Gantry writes
// (as in NVIDIA's), so that an injector later in the chain sees that nothing
// is left to do. The runtime keeps the container's own value instead, as
// NVIDIA's runtime and hook do outside CDI (workloads read it to learn their
// GPUs), and marks the spec with InjectedAnnotation.
const VisibleDevicesVoid = "NVIDIA_VISIBLE_DEVICES=void"

// InjectedAnnotation marks an OCI spec gantry-runtime has injected GPUs into;
// its value names the devices ("0,1", "GPU-...", or "none" for driver files
// only). gantry-runtime and gantry-hook leave such a spec alone, so that a
// retried create or a hook further down the chain does not inject twice, and
// gantry doctor reports it.
const InjectedAnnotation = "io.github.gantry-gpu.injected"

// CgroupAccess is the device cgroup access granted on every injected node,
// as NVIDIA's CDI specs grant it.
const CgroupAccess = "rwm"

// Mount options for driver files (read-only) and for IPC sockets (writable:
// clients connect to them).
var (
	ReadOnlyOptions = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}
	SocketOptions   = []string{"nosuid", "nodev", "rbind", "rprivate", "noexec"}
)

// Edits is everything to do to one container. The zero value is valid and
// means "nothing"; a nil *Edits means the same.
type Edits struct {
	// Env holds KEY=VALUE pairs; a key set here replaces the container's value.
	Env         []string
	DeviceNodes []DeviceNode
	Mounts      []Mount
	Symlinks    []Symlink
	// LibraryDirs are container directories holding injected libraries,
	// to be added to the container's ld.so.cache.
	LibraryDirs []string
}

// DeviceNode is a device node to create in the container.
type DeviceNode struct {
	// Path in the container, e.g. /dev/nvidia0.
	Path string
	// HostPath is the node on the host (under the device root); it may differ
	// from Path when the device root is not "/".
	HostPath string
	// Type is "c" for the character devices NVIDIA uses.
	Type  string
	Major int64
	Minor int64
	// FileMode is the node's permission bits; 0 leaves it to the runtime
	// (runc uses 0666, CDI copies the host node's mode).
	FileMode os.FileMode
	// Permissions is the cgroup access: some of "rwm".
	Permissions string
}

// Mount is a bind mount from the host into the container.
type Mount struct {
	HostPath      string
	ContainerPath string
	Options       []string
}

// Symlink is a symbolic link created in the container: Link (a container
// path) points at Target (usually a bare file name, relative to Link's dir).
type Symlink struct {
	Target string
	Link   string
}

// Empty reports whether e changes nothing.
func (e *Edits) Empty() bool {
	return e == nil || (len(e.Env) == 0 && len(e.DeviceNodes) == 0 && len(e.Mounts) == 0 &&
		len(e.Symlinks) == 0 && len(e.LibraryDirs) == 0)
}

// Merge adds o to e and returns e, deduplicated and sorted. Where both set
// the same thing (an env key, a node path, a mount or link destination), o
// wins: later edits refine earlier ones. A nil receiver allocates.
func (e *Edits) Merge(o *Edits) *Edits {
	if e == nil {
		e = &Edits{}
	}
	if o != nil {
		e.Env = append(e.Env, o.Env...)
		e.DeviceNodes = append(e.DeviceNodes, o.DeviceNodes...)
		e.Mounts = append(e.Mounts, o.Mounts...)
		e.Symlinks = append(e.Symlinks, o.Symlinks...)
		e.LibraryDirs = append(e.LibraryDirs, o.LibraryDirs...)
	}
	e.normalize()
	return e
}

// Clone returns a deep copy of e, so callers can merge into it freely
// (cached edits are shared by many containers).
func (e *Edits) Clone() *Edits {
	if e == nil {
		return nil
	}
	c := &Edits{
		Env:         slices.Clone(e.Env),
		DeviceNodes: slices.Clone(e.DeviceNodes),
		Mounts:      make([]Mount, len(e.Mounts)),
		Symlinks:    slices.Clone(e.Symlinks),
		LibraryDirs: slices.Clone(e.LibraryDirs),
	}
	for i, m := range e.Mounts {
		m.Options = slices.Clone(m.Options)
		c.Mounts[i] = m
	}
	return c
}

// normalize removes duplicates (the last one wins) and sorts every list, so
// that equal inputs give equal outputs whatever order they were merged in.
func (e *Edits) normalize() {
	e.Env = lastByKey(e.Env, envKey)
	slices.Sort(e.Env)
	e.DeviceNodes = lastByKey(e.DeviceNodes, func(d DeviceNode) string { return d.Path })
	slices.SortFunc(e.DeviceNodes, func(a, b DeviceNode) int { return strings.Compare(a.Path, b.Path) })
	e.Mounts = lastByKey(e.Mounts, func(m Mount) string { return m.ContainerPath })
	// Sorting by destination puts a parent directory before anything mounted
	// inside it, which is the order mounts must be made in.
	slices.SortFunc(e.Mounts, func(a, b Mount) int { return strings.Compare(a.ContainerPath, b.ContainerPath) })
	e.Symlinks = lastByKey(e.Symlinks, func(s Symlink) string { return s.Link })
	slices.SortFunc(e.Symlinks, func(a, b Symlink) int { return strings.Compare(a.Link, b.Link) })
	slices.Sort(e.LibraryDirs)
	e.LibraryDirs = slices.Compact(e.LibraryDirs)
}

// lastByKey keeps, for each key, the last element with that key, at the
// position of its first occurrence.
func lastByKey[T any](in []T, key func(T) string) []T {
	if len(in) < 2 {
		return in
	}
	pos := make(map[string]int, len(in))
	out := in[:0:0]
	for _, v := range in {
		k := key(v)
		if i, ok := pos[k]; ok {
			out[i] = v
			continue
		}
		pos[k] = len(out)
		out = append(out, v)
	}
	return out
}

// envKey is the name part of KEY=VALUE (the whole string when there is no =).
func envKey(kv string) string {
	if i := strings.IndexByte(kv, '='); i >= 0 {
		return kv[:i]
	}
	return kv
}
