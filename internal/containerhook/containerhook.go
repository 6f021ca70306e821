// Package containerhook implements the OCI hooks that Gantry's CDI specs
// run at createContainer time: `gantry hook create-symlinks` (the SONAME links
// of the injected driver libraries) and `gantry hook update-ldcache` (adding
// the injected library directories to the container's ld.so.cache).
//
// The hooks run with host privileges on a root filesystem full of image
// content, so they touch it only through package rootfs (every path resolved
// inside the root) and never run a program from the image: the loader cache
// is parsed and rewritten by package ldcache instead of running ldconfig.
package containerhook

import (
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/ldcache"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// RootPath reads the container state the runtime passes a hook on stdin and
// returns the host path of the container's root filesystem.
func RootPath(state io.Reader) (string, error) {
	var st specs.State
	if err := json.NewDecoder(io.LimitReader(state, 1<<20)).Decode(&st); err != nil {
		return "", fmt.Errorf("reading the container state on stdin: %w (this command is an OCI hook; the runtime provides the state)", err)
	}
	if st.Bundle == "" {
		return "", errors.New("container state on stdin has no bundle")
	}
	cfgPath := filepath.Join(st.Bundle, "config.json")
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", cfgPath, err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", fmt.Errorf("parsing %s: %w", cfgPath, err)
	}
	if spec.Root == nil || spec.Root.Path == "" {
		return "", fmt.Errorf("%s has no root.path", cfgPath)
	}
	root := spec.Root.Path
	if !filepath.IsAbs(root) {
		root = filepath.Join(st.Bundle, root)
	}
	return root, nil
}

// Link is one symlink to create: Link (an absolute container path) pointing to Target.
type Link struct{ Target, Link string }

// ParseLink parses the TARGET::LINK form of --link.
func ParseLink(s string) (Link, error) {
	t, l, ok := strings.Cut(s, "::")
	switch {
	case !ok || t == "" || l == "":
		return Link{}, fmt.Errorf("--link %q: want TARGET::LINK, e.g. libcuda.so.580.159.04::/usr/lib/x86_64-linux-gnu/libcuda.so.1", s)
	case !path.IsAbs(l):
		return Link{}, fmt.Errorf("--link %q: the link %q must be an absolute container path", s, l)
	case strings.ContainsRune(s, 0):
		return Link{}, fmt.Errorf("--link %q: contains a NUL byte", s)
	}
	return Link{Target: t, Link: path.Clean(l)}, nil
}

// CreateSymlinks creates each link inside root, making parent directories
// as needed. An existing file at a link's path is replaced.
func CreateSymlinks(root *rootfs.Root, links []Link) error {
	for _, l := range links {
		if err := root.MkdirAll(path.Dir(l.Link), 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", path.Dir(l.Link), err)
		}
		if err := root.Symlink(l.Target, l.Link); err != nil {
			return fmt.Errorf("linking %s -> %s: %w", l.Link, l.Target, err)
		}
	}
	return nil
}

// ConfFile lists the injected folders for a later ldconfig run inside the
// container (which would otherwise drop them from the cache it writes).
const ConfFile = "/etc/ld.so.conf.d/000-gantry.conf"

// UpdateLDCache adds every shared library in folders (container paths) to
// the container's /etc/ld.so.cache, ahead of the image's own entries of the
// same name, and writes ConfFile. warn receives non-fatal problems (a
// corrupt cache in the image, which is then rebuilt from our entries only).
func UpdateLDCache(root *rootfs.Root, folders []string, warn func(string)) error {
	cache := &ldcache.Cache{}
	b, err := root.ReadFile("/etc/ld.so.cache")
	switch {
	case err == nil:
		if c, perr := ldcache.Parse(b); perr == nil {
			cache = c
		} else {
			warn(fmt.Sprintf("the image's /etc/ld.so.cache is unreadable (%v); writing one with the injected libraries only", perr))
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return fmt.Errorf("reading /etc/ld.so.cache: %w", err)
	}

	var ours []ldcache.Entry
	for _, dir := range folders {
		dir = path.Clean(dir)
		if !path.IsAbs(dir) {
			return fmt.Errorf("--folder %q: must be an absolute container path", dir)
		}
		entries, err := libraries(root, dir)
		if err != nil {
			return err
		}
		ours = append(ours, entries...)
	}
	seen := map[[2]string]bool{}
	for _, e := range ours {
		seen[[2]string{e.Name, e.Path}] = true
	}
	merged := ours
	for _, e := range cache.Entries {
		if !seen[[2]string{e.Name, e.Path}] {
			merged = append(merged, e)
		}
	}
	// The loader takes the first of equal names: the stable sort keeps ours first.
	cache.Entries = merged
	cache.Sort()
	out, err := cache.MarshalBinary()
	if err != nil {
		return fmt.Errorf("writing /etc/ld.so.cache: %w", err)
	}
	if err := root.MkdirAll("/etc/ld.so.conf.d", 0o755); err != nil {
		return err
	}
	if err := root.WriteFileAtomic("/etc/ld.so.cache", out, 0o644); err != nil {
		return err
	}
	conf := "# Written by gantry: driver libraries injected into this container.\n" + strings.Join(folders, "\n") + "\n"
	return root.WriteFileAtomic(ConfFile, []byte(conf), 0o644)
}

// libraries returns cache entries for the native shared objects in dir,
// keyed by SONAME and pointing at the SONAME link when the folder has one.
func libraries(root *rootfs.Root, dir string) ([]ldcache.Entry, error) {
	names, err := root.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing --folder %s: %w", dir, err)
	}
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
	}
	sort.Strings(names)
	flags, machine := nativeFlags()
	var out []ldcache.Entry
	done := map[string]bool{}
	for _, n := range names {
		if !strings.HasPrefix(n, "lib") || !strings.Contains(n, ".so") {
			continue
		}
		f, err := root.Open(path.Join(dir, n))
		if err != nil {
			continue // a dangling link or a directory: nothing to cache
		}
		class, m, soname, err := driver.ReadELF(f)
		f.Close()
		if err != nil || class != elf.ELFCLASS64 || m != machine || soname == "" || done[soname] {
			continue
		}
		done[soname] = true
		p := path.Join(dir, n)
		if have[soname] {
			p = path.Join(dir, soname)
		}
		out = append(out, ldcache.Entry{Name: soname, Path: p, Flags: flags})
	}
	return out, nil
}

func nativeFlags() (int32, elf.Machine) {
	if runtime.GOARCH == "arm64" {
		return ldcache.FlagsAArch64, elf.EM_AARCH64
	}
	return ldcache.FlagsX8664, elf.EM_X86_64
}
