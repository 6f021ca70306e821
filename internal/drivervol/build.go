package drivervol

import (
	"bytes"
	"debug/elf"
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
	"time"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

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
