package drivervol

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/driver"
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
