package containerhook

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/ldcache"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// Files UpdateLDCache writes inside the container.
const (
	// CacheFile is the loader's cache.
	CacheFile = "/etc/ld.so.cache"
	// ConfFile lists the injected folders for a later ldconfig run inside
	// the container, which would otherwise drop them from the cache it
	// writes. "000-" sorts it first among ld.so.conf.d files.
	ConfFile = "/etc/ld.so.conf.d/000-gantry.conf"
)

// ErrUnsupportedArch is returned by UpdateLDCache on hosts whose
// architecture it has no loader cache flags for.
var ErrUnsupportedArch = errors.New("update-ldcache supports amd64 and arm64 hosts only")

// UpdateLDCache adds every shared library in folders (absolute container
// paths) to the container's /etc/ld.so.cache, ahead of the image's own
// entries of the same name, and writes ConfFile. No program is run.
//
// An image without a cache gets one with our entries only; so does an image
// whose cache is unreadable (corrupt, too large, not a regular file), and
// warn is told (nil warn writes to os.Stderr). Other failures are errors:
// the container should not start half configured.
func UpdateLDCache(root *rootfs.Root, folders []string, warn func(string)) error {
	return UpdateLDCacheCompat(root, folders, "", warn)
}

// UpdateLDCacheCompat is UpdateLDCache that, given the host's driver
// version, also applies CUDA forward compatibility (ForwardCompat): when
// the image's compat libcuda is newer than the host driver, its libraries
// go ahead of the folders' and CompatDir heads ConfFile. An empty
// hostDriver is UpdateLDCache.
func UpdateLDCacheCompat(root *rootfs.Root, folders []string, hostDriver string, warn func(string)) error {
	native, compat, err := hostABIs()
	if err != nil {
		return err
	}
	dirs, err := cleanFolders(folders)
	if err != nil {
		return err
	}
	var ours []ldcache.Entry
	if hostDriver != "" {
		fwd, _, err := ForwardCompat(root, hostDriver)
		if err != nil {
			return err
		}
		for _, l := range fwd {
			ours = append(ours, ldcache.Entry{Name: l.SONAME, Path: l.Path, Flags: native.flags})
		}
		if len(fwd) > 0 {
			dirs = append([]string{CompatDir}, dirs...)
		}
	}
	abis := []abi{native}
	if compat != nil {
		abis = append(abis, *compat)
	}
	for _, dir := range dirs {
		entries, err := libraries(root, dir, abis)
		if err != nil {
			return err
		}
		ours = append(ours, entries...)
	}
	return writeCache(root, ours, dirs, warn)
}

// Library is a shared library that will be in the container, known by
// its SONAME and the container path the loader should open for it.
type Library struct {
	SONAME string
	Path   string
	// Compat32 marks a 32-bit library (the compat32 capability's i386
	// builds on an x86-64 host), entered with the flags the 32-bit loader
	// looks for. The caller knows it from the host inventory, so the
	// library is not read.
	Compat32 bool
}

// AddToLDCache puts libs into the container's /etc/ld.so.cache ahead of the
// image's entries of the same name, and lists dirs in ConfFile. Unlike
// UpdateLDCache it reads nothing of the libraries themselves: the runtime
// shim calls it before the runtime has mounted them, with the SONAMEs
// learned from the host's files. The other rules are UpdateLDCache's.
//
// A SONAME may come twice, 64-bit and Compat32: the cache keeps both and each
// loader takes the entry with its own flags. On hosts with no 32-bit ABI of
// their own (arm64) Compat32 libraries are left out of the cache.
func AddToLDCache(root *rootfs.Root, libs []Library, dirs []string, warn func(string)) error {
	native, compat, err := hostABIs()
	if err != nil {
		return err
	}
	clean, err := cleanFolders(dirs)
	if err != nil {
		return err
	}
	ours := make([]ldcache.Entry, 0, len(libs))
	for _, l := range libs {
		if l.SONAME == "" || strings.ContainsAny(l.SONAME, "/\x00") || !path.IsAbs(l.Path) {
			return fmt.Errorf("library %q at %q: want a bare SONAME and an absolute container path", l.SONAME, l.Path)
		}
		flags := native.flags
		if l.Compat32 {
			if compat == nil {
				continue
			}
			flags = compat.flags
		}
		ours = append(ours, ldcache.Entry{Name: l.SONAME, Path: path.Clean(l.Path), Flags: flags})
	}
	return writeCache(root, ours, clean, warn)
}

// writeCache merges ours ahead of the image's cache and writes the cache and
// ConfFile (listing dirs) through root.
func writeCache(root *rootfs.Root, ours []ldcache.Entry, dirs []string, warn func(string)) error {
	if warn == nil {
		warn = func(s string) { fmt.Fprintf(os.Stderr, "warning: %s\n", s) }
	}
	cache := &ldcache.Cache{}
	b, err := root.ReadFileMax(CacheFile, ldcache.MaxFileSize)
	switch {
	case err == nil:
		if c, perr := ldcache.Parse(b); perr == nil {
			cache = c
		} else {
			warn(fmt.Sprintf("the image's %s is unreadable (%v); replacing it with one holding the injected libraries only", CacheFile, perr))
		}
	case errors.Is(err, fs.ErrNotExist):
		// A minimal image: the cache we write is its first.
	case errors.Is(err, rootfs.ErrNotRegular), errors.Is(err, rootfs.ErrTooLarge):
		warn(fmt.Sprintf("the image's %s is unusable (%v); replacing it with one holding the injected libraries only", CacheFile, err))
	default:
		return fmt.Errorf("reading the container's %s: %w", CacheFile, err)
	}
	cache.Entries = merge(ours, cache.Entries)
	// ldcache's Sort is stable (slices.SortStableFunc): among entries of
	// equal name and flags ours stay first, and the loader takes the first.
	cache.Sort()
	out, err := cache.MarshalBinary()
	if err != nil {
		return fmt.Errorf("encoding the container's %s: %w", CacheFile, err)
	}
	if err := root.MkdirAll(path.Dir(ConfFile), 0o755); err != nil {
		return fmt.Errorf("creating the container's %s: %w", path.Dir(ConfFile), err)
	}
	if err := root.WriteFileAtomic(CacheFile, out, 0o644); err != nil {
		return fmt.Errorf("writing the container's %s: %w", CacheFile, err)
	}
	conf := "# Written by Gantry: folders of libraries injected into this container\n# (CUDA forward-compatibility libraries first, when in use).\n" + strings.Join(dirs, "\n") + "\n"
	if err := root.WriteFileAtomic(ConfFile, []byte(conf), 0o644); err != nil {
		return fmt.Errorf("writing the container's %s: %w", ConfFile, err)
	}
	return nil
}

// cleanFolders checks and deduplicates the --folder values.
func cleanFolders(folders []string) ([]string, error) {
	var dirs []string
	seen := map[string]bool{}
	for _, f := range folders {
		if !path.IsAbs(f) || strings.ContainsAny(f, "\x00\n") {
			return nil, fmt.Errorf("--folder %q: want an absolute container path (no NUL or newline)", f)
		}
		d := path.Clean(f)
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	if len(dirs) == 0 {
		return nil, errors.New("no --folder given: nothing to add to the container's ld.so.cache")
	}
	return dirs, nil
}

// merge puts ours first, then the image's entries except those ours
// duplicate exactly (the same name, path and flags: a second run of the hook,
// or an image that already lists the folder).
func merge(ours, image []ldcache.Entry) []ldcache.Entry {
	type key struct {
		name, path string
		flags      int32
	}
	seen := map[key]bool{}
	out := make([]ldcache.Entry, 0, len(ours)+len(image))
	for _, e := range ours {
		seen[key{e.Name, e.Path, e.Flags}] = true
		out = append(out, e)
	}
	// The loader's order puts a higher OSVersion (from an ABI note) first
	// among equal names; lift ours to the image's highest so that the tie
	// falls to the stable sort, which keeps ours first.
	maxOS := map[key]uint32{}
	for _, e := range image {
		if e.HWCap == 0 && e.HWCapsSubdir == "" && seen[key{e.Name, e.Path, e.Flags}] {
			continue
		}
		k := key{e.Name, "", e.Flags}
		maxOS[k] = max(maxOS[k], e.OSVersion)
		out = append(out, e)
	}
	for i := range ours {
		if v := maxOS[key{ours[i].Name, "", ours[i].Flags}]; v > out[i].OSVersion {
			out[i].OSVersion = v
		}
	}
	return out
}

// libraries returns cache entries for the shared objects in dir that one of
// the host's loaders (abis) can use, keyed by SONAME and ABI and pointing at
// the SONAME link when the folder has one (as ldconfig does), else at the
// file found.
func libraries(root *rootfs.Root, dir string, abis []abi) ([]ldcache.Entry, error) {
	names, err := root.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing --folder %s in the container: %w", dir, err)
	}
	sort.Strings(names)
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	type key struct {
		soname string
		flags  int32
	}
	var out []ldcache.Entry
	done := map[key]bool{}
	for _, n := range names {
		if !strings.HasPrefix(n, "lib") || !strings.Contains(n, ".so") {
			continue
		}
		soname, flags, ok := readSONAME(root, path.Join(dir, n), abis)
		if !ok || done[key{soname, flags}] {
			continue
		}
		done[key{soname, flags}] = true
		p := path.Join(dir, n)
		if have[soname] {
			p = path.Join(dir, soname)
		}
		out = append(out, ldcache.Entry{Name: soname, Path: p, Flags: flags})
	}
	return out, nil
}

// readSONAME reads the ELF headers of the file at p (through the root; a
// symlink resolves inside it) and returns its DT_SONAME and the cache flags
// of the first of abis whose class and machine it has. Anything else — a
// directory, a dangling link, a FIFO, another architecture's library, a
// linker script named libfoo.so — is skipped.
func readSONAME(root *rootfs.Root, p string, abis []abi) (string, int32, bool) {
	f, err := root.OpenFile(p)
	if err != nil {
		return "", 0, false
	}
	defer f.Close()
	var r io.ReaderAt = f
	class, m, soname, err := driver.ReadELF(r)
	if err != nil || soname == "" {
		return "", 0, false
	}
	// A SONAME is a file name; one with a slash or NUL would put an entry
	// the loader matches against paths.
	if strings.ContainsAny(soname, "/\x00") || len(soname) > 255 {
		return "", 0, false
	}
	for _, a := range abis {
		if class == a.class && m == a.machine {
			return soname, a.flags, true
		}
	}
	return "", 0, false
}

// abi is one kind of library a loader on the host uses: its ELF class and
// machine, and the flags word its cache entries carry.
type abi struct {
	flags   int32
	class   elf.Class
	machine elf.Machine
}

// hostABIs returns the host's native 64-bit ABI and, where the driver ships
// 32-bit libraries for it, the 32-bit one (nil otherwise).
//
// On x86-64 the compat32 libraries are i386 objects, entered with the flags
// ldconfig gives them (FlagsI386), which only the i386 loader accepts. On
// arm64 the cache stays 64-bit only: NVIDIA ships no 32-bit Arm driver
// libraries, and an armhf entry would only serve a loader with no driver to
// load.
func hostABIs() (native abi, compat *abi, err error) {
	switch runtime.GOARCH {
	case "amd64":
		return abi{ldcache.FlagsX8664, elf.ELFCLASS64, elf.EM_X86_64},
			&abi{ldcache.FlagsI386, elf.ELFCLASS32, elf.EM_386}, nil
	case "arm64":
		return abi{ldcache.FlagsAArch64, elf.ELFCLASS64, elf.EM_AARCH64}, nil, nil
	}
	return abi{}, nil, fmt.Errorf("%w (this host is %s)", ErrUnsupportedArch, runtime.GOARCH)
}
