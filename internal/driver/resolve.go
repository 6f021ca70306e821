package driver

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"syscall"
)

// maxLinks bounds how many symlinks one lookup may follow, as the kernel's
// own limit does, so a link cycle ends in an error instead of a hang.
const maxLinks = 40

// errTooManyLinks is returned for a symlink cycle (or a chain that long).
var errTooManyLinks = errors.New("too many levels of symbolic links")

// resolver resolves paths inside a root directory the way the kernel would
// after chroot(root): an absolute symlink target starts again at root and
// ".." never climbs above it. A symlink that points out of the root (to
// /etc/passwd, or ../../../..) therefore lands on a path inside it, and a
// driver root can never make us hand out a host file that lies outside it.
//
// Results for directories are cached, because every library lookup walks the
// same handful of directories and Discover must stay in the low milliseconds.
type resolver struct {
	root  string // absolute, cleaned host path of the root
	dirs  map[string]resolved
	files map[string]lstatted // one lstat (and readlink) per in-root path
}

// lstatted is what one lstat, and for a symlink one readlink, found.
type lstatted struct {
	fi     os.FileInfo
	target string
	err    error
}

type resolved struct {
	path string
	err  error
}

func newResolver(root string) *resolver {
	return &resolver{root: filepath.Clean(root), dirs: map[string]resolved{}, files: map[string]lstatted{}}
}

// host returns the host path of an in-root path.
func (r *resolver) host(p string) string {
	if r.root == "/" {
		return p
	}
	return r.root + p
}

// Resolve returns the in-root path of the file that p (an in-root path)
// names, with every symlink along the way resolved inside the root. The last
// component must exist.
func (r *resolver) Resolve(p string) (string, error) {
	links := 0
	return r.resolve(p, &links)
}

func (r *resolver) resolve(p string, links *int) (string, error) {
	p = path.Clean("/" + p)
	if p == "/" {
		return "/", nil
	}
	dir, base := path.Split(p)
	rd, err := r.resolveDir(path.Clean(dir), links)
	if err != nil {
		return "", err
	}
	full := path.Join(rd, base)
	f := r.lstat(full)
	if f.err != nil {
		return "", f.err
	}
	if f.fi.Mode()&os.ModeSymlink == 0 {
		return full, nil
	}
	*links++
	if *links > maxLinks {
		return "", &os.PathError{Op: "resolve", Path: r.host(p), Err: errTooManyLinks}
	}
	target := f.target
	if !path.IsAbs(target) {
		// rd has no symlinks left, so a lexical ".." from it is the real
		// parent; path.Join clamps ".." at "/", which is the root.
		target = path.Join(rd, target)
	}
	return r.resolve(target, links)
}

// lstat is os.Lstat of the in-root path full, and os.Readlink for a
// symlink, each done once per resolver: a discovery reaches the same
// library through several names (its SONAME link, its .so link, the
// ld.so.cache), and the tree does not change while it looks.
func (r *resolver) lstat(full string) lstatted {
	if f, ok := r.files[full]; ok {
		return f
	}
	var f lstatted
	f.fi, f.err = os.Lstat(r.host(full))
	if f.err == nil && f.fi.Mode()&os.ModeSymlink != 0 {
		f.target, f.err = os.Readlink(r.host(full))
	}
	r.files[full] = f
	return f
}

// stat is os.Stat of p, an in-root path Resolve returned: the lstat that
// Resolve made of it (the last step of a resolution is no symlink), without
// another system call.
func (r *resolver) stat(p string) (os.FileInfo, error) {
	if f, ok := r.files[p]; ok && f.err == nil && f.fi.Mode()&os.ModeSymlink == 0 {
		return f.fi, nil
	}
	return os.Stat(r.host(p))
}

// resolveDir resolves a directory path, caching the outcome (errors too:
// most of the standard library directories are missing on any one host).
func (r *resolver) resolveDir(dir string, links *int) (string, error) {
	if dir == "/" {
		return "/", nil
	}
	if c, ok := r.dirs[dir]; ok {
		return c.path, c.err
	}
	p, err := r.resolve(dir, links)
	if err == nil {
		var fi os.FileInfo
		if fi, err = r.stat(p); err == nil && !fi.IsDir() {
			err = &os.PathError{Op: "resolve", Path: r.host(p), Err: syscall.ENOTDIR}
		}
	}
	if err != nil {
		p = ""
	}
	// A cycle is reported relative to the lookup that hit it; do not cache
	// it against a directory that may be fine on its own.
	if !errors.Is(err, errTooManyLinks) {
		r.dirs[dir] = resolved{p, err}
	}
	return p, err
}

// ResolveInRoot returns the host path that p (a path inside root) names once
// every symlink is resolved as if root were "/": absolute link targets start
// again at root and ".." stops at root, so the result is always inside root.
// It is exported for the packages that must place files inside a driver or
// container root without being led out of it.
func ResolveInRoot(root, p string) (string, error) {
	r := newResolver(root)
	in, err := r.Resolve(p)
	if err != nil {
		return "", fmt.Errorf("resolving %s inside %s: %w", p, root, err)
	}
	return r.host(in), nil
}
