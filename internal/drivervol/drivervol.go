package drivervol

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/procfs"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// The tree's directories, as in nvidia-docker 1.0's volume, and FilesDir,
// which only a set's tree has (EnsureSet).
const (
	BinDir   = "bin"
	LibDir   = "lib"   // 32-bit libraries
	Lib64Dir = "lib64" // 64-bit libraries
	// FilesDir holds a set's other read-only files (firmware, configuration
	// files), each at its container path below it:
	// files/etc/OpenCL/vendors/nvidia.icd.
	FilesDir = "files"
)

// FilePath is where a tree holds a driver file that is no program or
// library: FilesDir and the file's container path
// ("files/lib/firmware/nvidia/580.65.06/gsp_ga10x.bin"). A container path
// that is not absolute and clean has no place ("").
func FilePath(containerPath string) string {
	if !path.IsAbs(containerPath) || path.Clean(containerPath) != containerPath || containerPath == "/" {
		return ""
	}
	return FilesDir + containerPath
}

// DefaultDir is where nvidia-docker-plugin kept the trees of its one volume,
// nvidia_driver: its volume directory (-d, /var/lib/nvidia-docker/volumes)
// and the volume's name.
const DefaultDir = "/var/lib/nvidia-docker/volumes/nvidia_driver"

// ErrNotFound is returned by Load and Remove for a version without a tree.
var ErrNotFound = errors.New("no driver tree for this version")

// staleBuild is how old an unfinished build directory must be before
// Ensure removes it (a younger one may be another process's build).
const staleBuild = 10 * time.Minute

// buildPrefix starts the names of unfinished build directories; Versions
// never lists them.
const buildPrefix = ".build-"

// Store holds the trees, one directory per driver version under Dir.
type Store struct {
	// Dir holds <version>/{bin,lib,lib64}; DefaultDir when empty.
	Dir string
}

func (s Store) dir() string {
	if s.Dir == "" {
		return DefaultDir
	}
	return s.Dir
}

// Path is where the tree of version is (whether or not it exists).
func (s Store) Path(version string) string { return filepath.Join(s.dir(), version) }

// manifest is the file beside a tree that lists it (Tree as JSON), so that
// Load reads one small file instead of every library's ELF header; the
// tree itself holds nothing but the driver's files.
func (s Store) manifest(version string) string {
	return filepath.Join(s.dir(), "."+version+".json")
}

// Tree is one driver version's directory.
type Tree struct {
	Version string
	// Path is the tree's directory on the host.
	Path string `json:"-"`
	// Binaries are the programs' names in bin/.
	Binaries []string
	// Libraries are the library files in lib64/ and lib/, with their SONAMEs.
	Libraries []Library
	// Files are the other files (firmware, configuration files) of a set's
	// tree, relative to it (FilePath), sorted; a full tree has none.
	Files []string `json:",omitempty"`
}

// Library is one library file of a tree.
type Library struct {
	// Path is relative to the tree: "lib64/libcuda.so.580.159.04".
	Path string
	// SONAME is the name the loader asks for ("libcuda.so.1"); a link of that
	// name beside the file points at it.
	SONAME string
	// Bits is 64 (lib64/) or 32 (lib/).
	Bits int
}

// ContainerPath is where the loader finds the library in a container that
// has the tree at mountpoint: its SONAME link there
// ("/usr/local/nvidia/lib64/libcuda.so.1"), or the file itself when it has
// no SONAME. It is what a container's ld.so.cache maps the SONAME to.
func (l Library) ContainerPath(mountpoint string) string {
	name := l.SONAME
	if name == "" {
		name = path.Base(l.Path)
	}
	return path.Join(mountpoint, path.Dir(l.Path), name)
}

func checkVersion(v string) error {
	if !driver.IsVersion(v) {
		return fmt.Errorf("driver version %q: use the form 550.54.15", v)
	}
	return nil
}

// Ensure returns the tree of the inventory's driver version, building it
// from the inventory's programs and libraries when there is none.
func (s Store) Ensure(inv *driver.Inventory) (*Tree, error) {
	if inv == nil {
		return nil, errors.New("no driver inventory")
	}
	if err := checkVersion(inv.Version); err != nil {
		return nil, err
	}
	if t, err := s.Load(inv.Version); err == nil {
		return t, nil
	} else if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	// The full tree is nvidia-docker 1.0's volume: programs and libraries.
	return s.build(fullTree(inv), "", s.Path(inv.Version))
}

// fullTree is what a full tree holds of inv: nvidia-docker 1.0's volume,
// programs and libraries.
func fullTree(inv *driver.Inventory) *driver.Inventory {
	return &driver.Inventory{Root: inv.Root, Version: inv.Version, Binaries: inv.Binaries, Libraries: inv.Libraries}
}

// Serve returns the full tree of inv's driver version as the Docker volume
// plugin serves it: at Path, read-only (Protect), built when there is none.
// A tree it builds is never at Path without the read-only mount: it is
// built under a temporary name, renamed to the hidden directory, and
// mounted read-only at Path in one step.
func (s Store) Serve(inv *driver.Inventory) (*Tree, error) {
	if inv == nil {
		return nil, errors.New("no driver inventory")
	}
	if err := checkVersion(inv.Version); err != nil {
		return nil, err
	}
	if err := s.protect(inv.Version, inv); err != nil {
		return nil, err
	}
	return s.Load(inv.Version)
}

// SetsDir is the directory below a Store's Dir that holds the trees of
// file sets (EnsureSet). Its name is no driver version, so Versions never
// lists it, nor any tree in it: the Docker volume plugin serves only the
// full trees.
const SetsDir = ".sets"

// setFormat changes whenever what a set's tree holds for the same host
// paths changes, so that a tree of the old meaning is never taken for one
// of the new (SetKey). 3: the key holds each file's identity; 2: firmware
// and configuration files in FilesDir (1 held programs and libraries only).
const setFormat = "3"

// SetKey names a set of driver files as they are now: the first 6 bytes,
// in hex, of the SHA-256 of the set format (setFormat) and their host
// paths, sorted, each with its identity (device, inode, size and
// modification time; "absent" when it cannot be read), each field ended by
// a NUL. A file replaced or rewritten under the same path and driver
// version (a driver reinstalled, a fake driver root made again) gives the
// set a new key, so a new tree: a tree never serves a file's old content.
// The change time is left out: making the tree hard-links the files, which
// changes theirs. The order and repetitions of hostPaths do not matter.
func SetKey(hostPaths []string) string {
	sorted := slices.Clone(hostPaths)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	h := sha256.New()
	h.Write([]byte("set" + setFormat))
	h.Write([]byte{0})
	for _, p := range sorted {
		h.Write([]byte(p))
		h.Write([]byte{0})
		h.Write([]byte(fileIdentity(p)))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// fileIdentity is what a stat says of the file at p that changes when its
// content is replaced: device, inode, size and modification time.
func fileIdentity(p string) string {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return "absent"
	}
	return strconv.FormatUint(st.Dev, 10) + ":" + strconv.FormatUint(st.Ino, 10) + ":" +
		strconv.FormatInt(st.Size, 10) + ":" + strconv.FormatInt(st.Mtim.Nano(), 10)
}

// Set is the store of the file set key names (SetKey): <Dir>/.sets/<key>,
// holding one tree per driver version as s does (<key>/<version>).
func (s Store) Set(key string) Store {
	return Store{Dir: filepath.Join(s.dir(), SetsDir, key)}
}

// Subset is inv's programs, libraries, firmware and configuration files
// whose host paths are among hostPaths: what a set's tree holds (of the
// last two, the regular files).
func Subset(inv *driver.Inventory, hostPaths []string) *driver.Inventory {
	want := make(map[string]bool, len(hostPaths))
	for _, p := range hostPaths {
		want[p] = true
	}
	keep := func(fs []driver.File) []driver.File {
		var out []driver.File
		for _, f := range fs {
			if want[f.HostPath] {
				out = append(out, f)
			}
		}
		return out
	}
	return &driver.Inventory{Root: inv.Root, Version: inv.Version, Binaries: keep(inv.Binaries), Libraries: keep(inv.Libraries),
		Firmware: keep(inv.Firmware), Configs: keep(inv.Configs)}
}

// EnsureSet returns the tree of inv's driver version that holds exactly the
// programs and libraries of inv whose host paths are among hostPaths (with
// their SONAME links, as a full tree has them) and its firmware and
// configuration files among them that are regular files (in FilesDir, at
// FilePath of their container path), building it when there is none, in
// the store s.Set(SetKey(hostPaths)): one tree per set of files, shared by
// every container that gets that set. Host paths that are no such file of
// inv are left out. A file that cannot be hard-linked
// from the driver (another filesystem) is hard-linked from the version's
// full tree (s.Path(version)) when that holds it with the same bytes and
// can be linked (on the set's filesystem, not a Protect mount), else copied.
// The build is Ensure's: atomic, and racing builders of one set all succeed
// with one tree kept.
func (s Store) EnsureSet(inv *driver.Inventory, hostPaths []string) (*Tree, error) {
	if inv == nil {
		return nil, errors.New("no driver inventory")
	}
	if err := checkVersion(inv.Version); err != nil {
		return nil, err
	}
	set := s.Set(SetKey(hostPaths))
	if t, err := set.Load(inv.Version); err == nil {
		return t, nil
	} else if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	sub := Subset(inv, hostPaths)
	if len(sub.Binaries)+len(sub.Libraries)+len(sub.Firmware)+len(sub.Configs) == 0 {
		return nil, fmt.Errorf("none of the %d files asked for is a program, library, firmware or configuration file of the driver %s under %s", len(hostPaths), inv.Version, inv.Root)
	}
	from := ""
	if d := s.data(inv.Version); d != s.Path(inv.Version) || !isMount(d) {
		if st, err := os.Lstat(d); err == nil && st.IsDir() {
			from = d
		}
	}
	return set.build(sub, from, set.Path(inv.Version))
}

// Load reads the tree of version.
func (s Store) Load(version string) (*Tree, error) {
	if err := checkVersion(version); err != nil {
		return nil, err
	}
	p, d := s.Path(version), s.data(version)
	st, err := os.Lstat(d)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", p, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s is not a directory (remove it, and the tree will be built again)", d)
	}
	if b, err := os.ReadFile(s.manifest(version)); err == nil {
		var t Tree
		if json.Unmarshal(b, &t) == nil && t.Version == version {
			t.Path = p
			return &t, nil
		}
	}
	t, err := scan(version, d)
	if err != nil {
		return nil, err
	}
	t.Path = p
	return t, nil
}

// servedPrefix starts the name of the directory that holds the files of a
// tree served read-only (Serve, Protect): <Dir>/.served-<version>. The
// tree's path (Path) is then only the mount point of a read-only bind of
// it, an empty directory while that is not mounted (after a reboot), so
// the hard links to the driver's files are never reachable there writable.
const servedPrefix = ".served-"

func (s Store) hidden(version string) string {
	return filepath.Join(s.dir(), servedPrefix+version)
}

// data is where the files of version's tree are: the hidden directory of a
// served tree, else Path.
func (s Store) data(version string) string {
	if st, err := os.Lstat(s.hidden(version)); err == nil && st.IsDir() {
		return s.hidden(version)
	}
	return s.Path(version)
}

// scan reads a tree without its manifest.
func scan(version, p string) (*Tree, error) {
	t := &Tree{Version: version, Path: p}
	bins, err := os.ReadDir(filepath.Join(p, BinDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range bins {
		if e.Type().IsRegular() {
			t.Binaries = append(t.Binaries, e.Name())
		}
	}
	for _, d := range []struct {
		name string
		bits int
	}{{Lib64Dir, 64}, {LibDir, 32}} {
		ents, err := os.ReadDir(filepath.Join(p, d.name))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		for _, e := range ents {
			if !e.Type().IsRegular() {
				continue
			}
			rel := path.Join(d.name, e.Name())
			soname, err := sonameOf(filepath.Join(p, rel))
			if err != nil {
				return nil, fmt.Errorf("tree %s: %w", p, err)
			}
			t.Libraries = append(t.Libraries, Library{Path: rel, SONAME: soname, Bits: d.bits})
		}
	}
	err = filepath.WalkDir(filepath.Join(p, FilesDir), func(f string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && f == filepath.Join(p, FilesDir) {
				return filepath.SkipDir
			}
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(p, f)
			t.Files = append(t.Files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(t.Files)
	return t, nil
}

func sonameOf(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	_, _, soname, err := driver.ReadELF(f)
	if err != nil {
		return "", fmt.Errorf("%s: %w", p, err)
	}
	return soname, nil
}

// Versions lists the driver versions that have a tree, sorted.
func (s Store) Versions() ([]string, error) {
	ents, err := os.ReadDir(s.dir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		v := strings.TrimPrefix(e.Name(), servedPrefix)
		if e.IsDir() && driver.IsVersion(v) {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Protect makes the tree of version a read-only mount at Path (ro, nosuid,
// nodev), unless it is one already. A bind of a read-only mount is
// read-only too, so whoever binds the tree into a container, even without
// asking for ro, cannot write to it, and so cannot write to the host's
// driver files that the tree's hard links are. The tree's files move to a
// hidden directory first (servedPrefix), and the read-only bind of it
// appears at Path in one step (open_tree, mount_setattr, move_mount): an
// observer of Path sees no tree, an empty directory or the read-only tree,
// never the writable one. It needs CAP_SYS_ADMIN in the mount namespace
// that the tree's users (Docker) see; the mount lasts until Remove or a
// reboot, and Protect after a reboot makes it again.
func (s Store) Protect(version string) error {
	if err := checkVersion(version); err != nil {
		return err
	}
	return s.protect(version, nil)
}

// protect is Protect, building the tree from inv when there is none.
func (s Store) protect(version string, inv *driver.Inventory) error {
	// One at a time in this process (the volume plugin serves Mount and
	// Remove requests concurrently): no stacked mounts, and no tree
	// removed while it is being mounted.
	protectMu.Lock()
	defer protectMu.Unlock()
	p, h := s.Path(version), s.hidden(version)
	const want = unix.ST_RDONLY | unix.ST_NOSUID | unix.ST_NODEV
	var st unix.Statfs_t
	if isMount(p) && unix.Statfs(p, &st) == nil && st.Flags&want == want {
		return nil
	}
	detach(p)
	if _, err := os.Lstat(h); err != nil {
		// A tree at Path (built by Ensure, or by an older gantry) moves
		// to the hidden directory: Path is then absent for a moment.
		err := os.Rename(p, h)
		switch {
		case err == nil:
		case !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("protecting %s: %w", p, err)
		case inv == nil:
			return fmt.Errorf("%s: %w", p, ErrNotFound)
		default:
			if _, err := s.build(fullTree(inv), "", h); err != nil {
				return err
			}
		}
	}
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("protecting %s: %w", p, err)
	}
	if err := attachReadOnly(h, p, s.staging(version)); err != nil {
		return fmt.Errorf("making %s read-only: %w (run as root)", p, err)
	}
	return nil
}

// stagingPrefix starts the name of the private mount point where, on
// kernels without mount_setattr, the read-only bind of a tree is made
// before it is bound at the served path: <Dir>/.ro-<version>.
const stagingPrefix = ".ro-"

func (s Store) staging(version string) string {
	return filepath.Join(s.dir(), stagingPrefix+version)
}

// LegacyKernel makes this package take the paths it takes on kernels
// before Linux 5.8 even on a newer one: no mount_setattr (5.12) in
// attachReadOnly, no STATX_MNT_ID (5.8) in isMount. Only tests set it (of
// this package and of the volume plugin), before serving a tree.
var LegacyKernel atomic.Bool

// attachReadOnly mounts a read-only, nosuid, nodev bind of dir at p. With
// the mount API of Linux 5.12 the bind is made read-only before it is
// attached (open_tree, mount_setattr, move_mount). Older kernels bind dir
// at the private mount point staging and remount that read-only, then bind
// it at p (a bind copies its source's read-only, nosuid and nodev flags,
// so p is read-only from the moment it is mounted), then detach staging:
// the writable tree is never mounted at p.
func attachReadOnly(dir, p, staging string) error {
	err := error(unix.ENOSYS)
	if !LegacyKernel.Load() {
		err = attachMountAPI(dir, p)
	}
	if !errors.Is(err, unix.ENOSYS) {
		return err
	}
	detach(staging)
	if err := os.Mkdir(staging, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	defer os.Remove(staging)
	if err := unix.Mount(dir, staging, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount: %w", err)
	}
	defer detach(staging)
	if err := unix.Mount("", staging, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("remount: %w", err)
	}
	var st unix.Statfs_t
	const want = unix.ST_RDONLY | unix.ST_NOSUID | unix.ST_NODEV
	if err := unix.Statfs(staging, &st); err != nil || st.Flags&want != want {
		return fmt.Errorf("remount of %s: not read-only, nosuid, nodev (%v)", staging, err)
	}
	if err := unix.Mount(staging, p, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount: %w", err)
	}
	return nil
}

// attachMountAPI is attachReadOnly with the mount API; ENOSYS where the
// kernel lacks it.
func attachMountAPI(dir, p string) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return err
	}
	return unix.MoveMount(fd, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH)
}

// isMount says whether p is a mount point (its mount differs from its
// parent's): by the mount ids of statx, or, before Linux 5.8 (no
// STATX_MNT_ID; no statx before 4.11), by whether /proc/self/mountinfo
// lists a mount at p.
func isMount(p string) bool {
	if !LegacyKernel.Load() {
		var a, b unix.Statx_t
		err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &a)
		if err == nil {
			err = unix.Statx(unix.AT_FDCWD, filepath.Dir(p), 0, unix.STATX_MNT_ID, &b)
		}
		switch {
		case errors.Is(err, unix.ENOSYS): // no statx (before 4.11)
		case err != nil:
			return false
		case a.Mask&b.Mask&unix.STATX_MNT_ID != 0:
			return a.Mnt_id != b.Mnt_id
		}
	}
	return inMountinfo(p)
}

// inMountinfo says whether /proc/self/mountinfo lists a mount at p.
func inMountinfo(p string) bool {
	abs, err := filepath.EvalSymlinks(p)
	if err != nil {
		return false
	}
	if abs, err = filepath.Abs(abs); err != nil {
		return false
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mount-point options ...
		fields := strings.SplitN(sc.Text(), " ", 6)
		if len(fields) == 6 && procfs.UnescapeMountinfo(fields[4]) == abs {
			return true
		}
	}
	return false
}

// protectMu serialises protect and Remove.
var protectMu sync.Mutex

// detach takes every mount off p (none: nothing to do).
func detach(p string) {
	for i := 0; i < 16; i++ {
		if unix.Unmount(p, unix.MNT_DETACH) != nil {
			return
		}
	}
}

// Remove deletes the tree of version. Its read-only mount (Protect) is
// detached first, leaving the empty mount point; containers that have it
// keep their view. The tree is then renamed away, so that it disappears
// whole: no half-removed tree is ever listed. The trees of file sets of
// that version (EnsureSet, in their own stores) stay.
func (s Store) Remove(version string) error {
	if err := checkVersion(version); err != nil {
		return err
	}
	protectMu.Lock()
	defer protectMu.Unlock()
	p, h := s.Path(version), s.hidden(version)
	detach(p)
	detach(s.staging(version)) // left by a process killed in attachReadOnly
	os.Remove(s.staging(version))
	gone, err := os.MkdirTemp(s.dir(), ".remove-")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: %w", p, ErrNotFound)
		}
		return fmt.Errorf("removing %s: %w", p, err)
	}
	defer os.RemoveAll(gone)
	found := false
	// The hidden files first: the mount point left at p is empty.
	for i, d := range []string{h, p} {
		err := os.Rename(d, filepath.Join(gone, strconv.Itoa(i)))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing %s: %w", d, err)
		}
		found = found || err == nil
	}
	if !found {
		return fmt.Errorf("%s: %w", p, ErrNotFound)
	}
	os.Remove(s.manifest(version))
	return os.RemoveAll(gone)
}

// build makes the tree in a new directory and renames it into place.
func (s Store) build(inv *driver.Inventory, from, final string) (t *Tree, err error) {
	if err := os.MkdirAll(s.dir(), 0o755); err != nil {
		return nil, fmt.Errorf("creating the driver tree directory: %w", err)
	}
	s.removeStale()
	tmp, err := os.MkdirTemp(s.dir(), buildPrefix+inv.Version+"-")
	if err != nil {
		return nil, fmt.Errorf("creating the driver tree for %s: %w", inv.Version, err)
	}
	defer func() {
		if tmp != "" {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{BinDir, LibDir, Lib64Dir} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil {
			return nil, err
		}
	}
	root, err := rootfs.Open(inv.Root)
	if err != nil {
		return nil, fmt.Errorf("driver root %s: %w", inv.Root, err)
	}
	defer root.Close()
	b := &builder{root: root, inv: inv, dir: tmp, names: map[string]bool{}, from: from}
	for _, f := range inv.Binaries {
		if err := b.binary(f); err != nil {
			return nil, err
		}
	}
	for _, f := range inv.Libraries {
		if err := b.library(f); err != nil {
			return nil, err
		}
	}
	placed := make(map[string]bool, len(inv.Binaries)+len(inv.Libraries))
	for _, f := range slices.Concat(inv.Binaries, inv.Libraries) {
		placed[f.HostPath] = true
	}
	for _, f := range slices.Concat(inv.Firmware, inv.Configs) {
		// One the tree has as a program or library already (the GBM
		// backend is the allocator library) is not taken twice.
		if placed[f.HostPath] {
			continue
		}
		if err := b.file(f); err != nil {
			return nil, err
		}
	}
	for _, d := range append([]string{BinDir, LibDir, Lib64Dir}, b.dirs...) {
		if err := syncDir(filepath.Join(tmp, d)); err != nil {
			return nil, err
		}
	}
	if err := syncDir(tmp); err != nil {
		return nil, err
	}
	// The manifest first: a tree in place always has the manifest of what
	// it holds (a manifest without its tree is ignored and rewritten).
	t, err = scan(inv.Version, tmp)
	if err != nil {
		return nil, err
	}
	if b, err := json.Marshal(t); err != nil {
		return nil, err
	} else if err := atomicfile.Write(s.manifest(inv.Version), b, atomicfile.Options{Sync: true}); err != nil {
		return nil, fmt.Errorf("writing the driver tree's manifest: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		// Another builder finished first (rename onto a non-empty
		// directory fails): keep its tree.
		if t, lerr := s.Load(inv.Version); lerr == nil {
			return t, nil
		}
		return nil, fmt.Errorf("placing the driver tree at %s: %w", final, err)
	}
	tmp = ""
	if err := syncDir(s.dir()); err != nil {
		return nil, err
	}
	return s.Load(inv.Version)
}

// removeStale deletes unfinished build directories left by a process that died.
func (s Store) removeStale() {
	ents, _ := os.ReadDir(s.dir())
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), buildPrefix) && !strings.HasPrefix(e.Name(), ".remove-") {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleBuild {
			os.RemoveAll(filepath.Join(s.dir(), e.Name()))
		}
	}
}

type builder struct {
	root  *rootfs.Root
	inv   *driver.Inventory
	dir   string
	names map[string]bool // "lib64/libcuda.so.1": taken
	// from, when set, is the version's full tree: a file that cannot be
	// hard-linked from the driver is linked from there when the full tree
	// holds it with the same bytes (EnsureSet).
	from string
	// dirs are the directories made below FilesDir (relative to the
	// tree), deepest last, synced when the tree is complete.
	dirs []string
}

// open opens a driver file inside the driver root; HostPath carries the
// root, which is taken off first.
func (b *builder) open(f driver.File) (*os.File, error) {
	rel, err := filepath.Rel(b.inv.Root, f.HostPath)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("driver file %s is outside the driver root %s: not taken", f.HostPath, b.inv.Root)
	}
	return b.root.OpenFile("/" + rel)
}

func (b *builder) binary(f driver.File) error {
	src, err := b.open(f)
	if err != nil {
		return fmt.Errorf("driver program: %w", err)
	}
	defer src.Close()
	var magic [4]byte
	if _, err := src.ReadAt(magic[:], 0); err != nil || string(magic[:]) != elf.ELFMAG {
		return fmt.Errorf("driver program %s is not an ELF executable (a driver root changed since discovery? run the command again)", f.HostPath)
	}
	return b.place(src, path.Join(BinDir, path.Base(f.ContainerPath)))
}

// file places a firmware or configuration file at FilePath of its container
// path. Anything but a regular file (a directory of application profiles)
// is left out: it keeps a mount of its own.
func (b *builder) file(f driver.File) error {
	rel := FilePath(f.ContainerPath)
	if rel == "" {
		return fmt.Errorf("driver file %s: container path %q is not an absolute, clean path", f.HostPath, f.ContainerPath)
	}
	src, err := b.open(f)
	if errors.Is(err, rootfs.ErrNotRegular) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("driver file: %w", err)
	}
	defer src.Close()
	if err := b.mkdirs(path.Dir(rel)); err != nil {
		return err
	}
	return b.place(src, rel)
}

// mkdirs makes the directory rel (below FilesDir) and its parents in the
// tree, each remembered for the final sync.
func (b *builder) mkdirs(rel string) error {
	if rel == "." || rel == "/" || b.names[rel+"/"] {
		return nil
	}
	if err := b.mkdirs(path.Dir(rel)); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(b.dir, rel), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("driver tree: %w", err)
	}
	b.names[rel+"/"] = true
	b.dirs = append(b.dirs, rel)
	return nil
}

func (b *builder) library(f driver.File) error {
	src, err := b.open(f)
	if err != nil {
		return fmt.Errorf("driver library: %w", err)
	}
	defer src.Close()
	class, _, soname, err := driver.ReadELF(src)
	if err != nil {
		return fmt.Errorf("driver library %s: %w", f.HostPath, err)
	}
	dir := Lib64Dir
	if class == elf.ELFCLASS32 {
		dir = LibDir
	}
	name := path.Base(f.HostPath)
	if err := b.place(src, path.Join(dir, name)); err != nil {
		return err
	}
	links := []string{}
	if soname != "" && soname != name && !strings.Contains(soname, "/") {
		links = append(links, soname)
	}
	// The original's two extra names: libcuda.so for programs that
	// dlopen it unversioned, and GLVND's indirect GLX vendor.
	if strings.HasPrefix(soname, "libcuda.so") {
		links = append(links, "libcuda.so")
	}
	if strings.HasPrefix(soname, "libGLX_nvidia.so") {
		links = append(links, "libGLX_indirect.so.0")
	}
	for _, l := range links {
		rel := path.Join(dir, l)
		if b.names[rel] {
			continue
		}
		if err := os.Symlink(name, filepath.Join(b.dir, rel)); err != nil {
			return fmt.Errorf("driver tree: %w", err)
		}
		b.names[rel] = true
	}
	return nil
}

// place puts the open file at rel in the tree: a hard link to it when the
// tree and the driver are on one filesystem, else a copy. The first file of
// a name wins.
func (b *builder) place(src *os.File, rel string) error {
	if b.names[rel] {
		return nil
	}
	b.names[rel] = true
	dst := filepath.Join(b.dir, rel)
	// Link the open file itself, not its path: what was checked is what is
	// linked. /proc/self/fd/N with AT_SYMLINK_FOLLOW needs no privilege.
	err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(src.Fd())), unix.AT_FDCWD, dst, unix.AT_SYMLINK_FOLLOW)
	if err == nil {
		return nil
	}
	if b.from != "" && linkSame(src, filepath.Join(b.from, rel), dst) {
		return nil
	}
	return copyFile(src, dst)
}

// linkSame hard-links the file at other to dst when it is a regular file
// with src's bytes, and reports whether it did. The file linked is the one
// compared (through its descriptor).
func linkSame(src *os.File, other, dst string) bool {
	fd, err := unix.Open(other, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), other)
	defer f.Close()
	so, err := f.Stat()
	if err != nil || !so.Mode().IsRegular() {
		return false
	}
	ss, err := src.Stat()
	if err != nil || ss.Size() != so.Size() || ss.Mode().Perm()&0o755 != so.Mode().Perm() {
		return false
	}
	if !os.SameFile(ss, so) && !sameBytes(src, f, ss.Size()) {
		return false
	}
	return unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.AT_FDCWD, dst, unix.AT_SYMLINK_FOLLOW) == nil
}

// sameBytes compares the first size bytes of a and b (each read from 0).
func sameBytes(a, b *os.File, size int64) bool {
	ba, bb := make([]byte, 1<<16), make([]byte, 1<<16)
	for off := int64(0); off < size; {
		n := int64(len(ba))
		if size-off < n {
			n = size - off
		}
		if _, err := a.ReadAt(ba[:n], off); err != nil {
			return false
		}
		if _, err := b.ReadAt(bb[:n], off); err != nil {
			return false
		}
		if !bytes.Equal(ba[:n], bb[:n]) {
			return false
		}
		off += n
	}
	return true
}

func copyFile(src *os.File, dst string) (err error) {
	st, err := src.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, st.Mode().Perm()&0o755)
	if err != nil {
		return fmt.Errorf("driver tree: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err := io.Copy(out, io.NewSectionReader(src, 0, st.Size())); err != nil {
		return fmt.Errorf("copying %s to %s: %w", src.Name(), dst, err)
	}
	if err := out.Chmod(st.Mode().Perm() & 0o755); err != nil {
		return err
	}
	return out.Sync()
}

func syncDir(p string) error {
	d, err := os.Open(p)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", p, err)
	}
	return nil
}
