// Package rootfs does file operations inside a container's root filesystem
// without ever leaving it.
//
// A container image is hostile input: any directory in it may be a symlink
// to a host path ("/etc -> /host/etc"), and a path checked a moment ago may
// be swapped for a symlink before it is used (the CVE-2024-0132 class of
// escapes). So no path inside the root is ever resolved as a string on the
// host. Every lookup goes through openat2(2) with RESOLVE_IN_ROOT, which makes
// the kernel resolve it as if the root were "/" — absolute symlinks and ".."
// are clamped to the root — and RESOLVE_NO_MAGICLINKS, which refuses
// /proc/self/fd-style jumps. Creation (mkdir, symlink, file write) happens
// relative to a file descriptor of the already-resolved parent directory, and
// the final name is never followed: a symlink there is replaced, not written
// through. Kernels without openat2 (before 5.6) get an error, never a
// fallback to unsafe resolution.
package rootfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ErrNoOpenat2 is returned on kernels without openat2(2).
var ErrNoOpenat2 = errors.New("the kernel lacks openat2 (Linux 5.6 or newer is needed to resolve paths safely inside a container root)")

// Root is an open container root filesystem.
type Root struct {
	fd   int
	path string
}

// Open opens the root filesystem at dir (a host path, trusted).
func Open(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening container root %s: %w", dir, err)
	}
	return &Root{fd: fd, path: dir}, nil
}

// Close releases the root's file descriptor.
func (r *Root) Close() error { return unix.Close(r.fd) }

// Path is the host path the root was opened at.
func (r *Root) Path() string { return r.path }

// clean makes p relative to the root ("." for the root itself).
func clean(p string) string {
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	if p == "" {
		return "."
	}
	return p
}

// openat resolves p inside the root.
func (r *Root) openat(p string, flags uint64, mode uint64) (int, error) {
	how := unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Mode:    mode,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(r.fd, clean(p), &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err == unix.ENOSYS {
			return -1, ErrNoOpenat2
		}
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: r.describe(p), Err: err}
		}
		return fd, nil
	}
}

func (r *Root) describe(p string) string {
	return "/" + strings.TrimPrefix(clean(p), ".") + " in " + r.path
}

// Open opens the file at p for reading. Symlinks on the way are followed,
// clamped to the root.
func (r *Root) Open(p string) (*os.File, error) {
	fd, err := r.openat(p, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), r.describe(p)), nil
}

// ReadFile reads the whole file at p.
func (r *Root) ReadFile(p string) ([]byte, error) {
	f, err := r.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, &os.PathError{Op: "read", Path: r.describe(p), Err: errors.New("not a regular file")}
	}
	return io.ReadAll(f)
}

// ReadDir lists the names in the directory at p.
func (r *Root) ReadDir(p string) ([]string, error) {
	fd, err := r.openat(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), r.describe(p))
	defer f.Close()
	return f.Readdirnames(-1)
}

// parent opens the directory holding p (resolved in the root) and returns it
// with p's last component, which the caller creates or replaces without
// following it.
func (r *Root) parent(p string) (int, string, error) {
	c := clean(p)
	if c == "." {
		return -1, "", fmt.Errorf("%s: the root itself has no parent", r.path)
	}
	fd, err := r.openat(path.Dir(c), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", err
	}
	return fd, path.Base(c), nil
}

// MkdirAll creates the directory p and its missing parents. Each directory is
// created relative to its parent's descriptor; existing components may be
// symlinks, which resolve inside the root.
func (r *Root) MkdirAll(p string, mode os.FileMode) error {
	c := clean(p)
	if c == "." {
		return nil
	}
	parts := strings.Split(c, "/")
	for i := range parts {
		sub := strings.Join(parts[:i+1], "/")
		pfd, base, err := r.parent(sub)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(pfd, base, uint32(mode.Perm()))
		unix.Close(pfd)
		if err != nil && err != unix.EEXIST {
			return &os.PathError{Op: "mkdir", Path: r.describe(sub), Err: err}
		}
	}
	// The last component must now be a directory (inside the root).
	fd, err := r.openat(c, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

var tmpSeq atomic.Uint64

func tmpName(base string) string {
	return ".gantry-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(tmpSeq.Add(1), 10) + "-" + base
}

// Symlink makes link (a path in the root) a symlink to target, replacing
// whatever non-directory was at link. An identical existing link is left alone.
func (r *Root) Symlink(target, link string) error {
	pfd, base, err := r.parent(link)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	buf := make([]byte, unix.PathMax)
	if n, err := unix.Readlinkat(pfd, base, buf); err == nil && string(buf[:n]) == target {
		return nil
	}
	tmp := tmpName(base)
	if err := unix.Symlinkat(target, pfd, tmp); err != nil {
		return &os.PathError{Op: "symlink", Path: r.describe(link), Err: err}
	}
	if err := unix.Renameat(pfd, tmp, pfd, base); err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return &os.PathError{Op: "symlink", Path: r.describe(link), Err: err}
	}
	return nil
}

// WriteFileAtomic replaces the file at p with data: a temporary file in the
// same directory, synced, then renamed over p. A symlink at p is replaced,
// never written through.
func (r *Root) WriteFileAtomic(p string, data []byte, mode os.FileMode) error {
	pfd, base, err := r.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	tmp := tmpName(base)
	fd, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return &os.PathError{Op: "create", Path: r.describe(p), Err: err}
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Chmod(mode.Perm())
	}
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(pfd, tmp, pfd, base)
	}
	if werr != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return &os.PathError{Op: "write", Path: r.describe(p), Err: werr}
	}
	return nil
}
