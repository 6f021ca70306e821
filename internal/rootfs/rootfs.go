package rootfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNoOpenat2 is returned by Open on kernels without openat2(2).
var ErrNoOpenat2 = errors.New("the kernel lacks openat2(2): Linux 5.6 or newer is needed to resolve paths safely inside a container root")

// ErrNotRegular is returned when a file to be read is not a regular file
// (a directory, FIFO, socket or device node).
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is returned by ReadFile for files over MaxReadFile bytes.
var ErrTooLarge = errors.New("file too large")

// MaxReadFile bounds ReadFile: an image can hold a sparse file of any size,
// and a hook must not be made to allocate it.
const MaxReadFile = 256 << 20

// maxRetries bounds the retries of openat2 when the kernel reports EAGAIN
// (a concurrent rename or mount while resolving in the root): a hostile
// writer must not keep the hook looping forever.
const maxRetries = 64

// Root is an open container root filesystem. Its methods take container
// paths: absolute or not, they are resolved from the root, and ".." and
// symlinks never lead out of it. A Root is safe for concurrent use.
type Root struct {
	fd     int
	path   string
	noSync bool
}

// SkipSync makes WriteFileAtomic skip its two fsyncs. The runtime shim uses
// it on the container-create path: the files it writes live in a container
// layer that a host crash discards or that the engine recreates, the rename
// alone already keeps readers from seeing a torn file, and each fsync costs
// the create a millisecond or more on a busy disk.
func (r *Root) SkipSync() { r.noSync = true }

// Open opens the root filesystem at dir, a trusted host path (from the
// bundle's config.json). It fails with ErrNoOpenat2 where the kernel cannot
// resolve paths safely.
func Open(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening container root %s: %w", dir, err)
	}
	r := &Root{fd: fd, path: dir}
	// Probe openat2 now, so that an old kernel is one clear error up front.
	probe, err := r.openat(".", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		unix.Close(fd)
		if errors.Is(err, ErrNoOpenat2) {
			return nil, fmt.Errorf("opening container root %s: %w", dir, ErrNoOpenat2)
		}
		return nil, err
	}
	unix.Close(probe)
	return r, nil
}

// Close releases the root's file descriptor.
func (r *Root) Close() error { return unix.Close(r.fd) }

// Path is the host path the root was opened at (for messages only: never
// join container paths to it).
func (r *Root) Path() string { return r.path }

// clean makes p relative to the root ("." for the root itself). ".." cannot
// climb above "/" in path.Clean, and the kernel clamps symlinks besides.
func clean(p string) string {
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	if p == "" {
		return "."
	}
	return p
}

// describe names p for error messages: the container path and the root.
func (r *Root) describe(p string) string {
	return "/" + strings.TrimPrefix(clean(p), ".") + " in " + r.path
}

func (r *Root) pathErr(op, p string, err error) error {
	return &os.PathError{Op: op, Path: r.describe(p), Err: err}
}

// openat2 retries EINTR and, a bounded number of times, EAGAIN.
func openat2(dirfd int, p string, how *unix.OpenHow) (int, error) {
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, p, how)
		if (err == unix.EINTR || err == unix.EAGAIN) && i < maxRetries {
			continue
		}
		if err == unix.ENOSYS {
			return -1, ErrNoOpenat2
		}
		return fd, err
	}
}

// openat resolves p inside the root, following symlinks (clamped).
func (r *Root) openat(p string, flags uint64, mode uint64) (int, error) {
	how := unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Mode:    mode,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	fd, err := openat2(r.fd, clean(p), &how)
	if err == ErrNoOpenat2 {
		return -1, err
	}
	if err != nil {
		return -1, r.pathErr("open", p, err)
	}
	return fd, nil
}

// openChild opens the single name base in the directory dirfd, refusing
// symlinks and anything that would leave dirfd.
func openChild(dirfd int, base string, flags uint64) (int, error) {
	how := unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	return openat2(dirfd, base, &how)
}

// OpenFile opens the regular file at p for reading; the *os.File is an
// io.ReaderAt too. Symlinks on the way are followed, clamped to the root.
// Anything else than a regular file fails with ErrNotRegular, and is never
// opened for reading (see the package documentation).
func (r *Root) OpenFile(p string) (*os.File, error) {
	fd, _, err := r.openRegular(p)
	if err != nil {
		return nil, err
	}
	// Regular files ignore O_NONBLOCK; clear it anyway so that os.File
	// treats the descriptor as an ordinary blocking one.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, r.pathErr("open", p, err)
	}
	return os.NewFile(uintptr(fd), r.describe(p)), nil
}

// openRegular opens the regular file at p for reading (OpenFile's rules)
// and returns the descriptor (O_NONBLOCK, which regular files ignore) and
// the file's size.
func (r *Root) openRegular(p string) (int, int64, error) {
	pfd, err := r.openat(p, unix.O_PATH, 0)
	if err != nil {
		return -1, 0, err
	}
	defer unix.Close(pfd)
	var want unix.Stat_t
	if err := unix.Fstat(pfd, &want); err != nil {
		return -1, 0, r.pathErr("stat", p, err)
	}
	if want.Mode&unix.S_IFMT != unix.S_IFREG {
		return -1, 0, r.pathErr("open", p, ErrNotRegular)
	}
	flags := unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), flags, 0)
	if err != nil {
		// No /proc: open by path in the root and check that it is the
		// same file (a swap in between is refused below).
		if fd, err = r.openat(p, uint64(flags), 0); err != nil {
			return -1, 0, err
		}
	}
	var got unix.Stat_t
	if err := unix.Fstat(fd, &got); err != nil {
		unix.Close(fd)
		return -1, 0, r.pathErr("stat", p, err)
	}
	if got.Dev != want.Dev || got.Ino != want.Ino || got.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, 0, r.pathErr("open", p, fmt.Errorf("%w (replaced while opening)", ErrNotRegular))
	}
	return fd, got.Size, nil
}

// ReadFile reads the whole regular file at p (at most MaxReadFile bytes).
func (r *Root) ReadFile(p string) ([]byte, error) {
	return r.ReadFileMax(p, MaxReadFile)
}

// ReadFileMax reads the whole regular file at p, failing with ErrTooLarge
// (before reading, when its size says so) if it is over max bytes.
func (r *Root) ReadFileMax(p string, max int64) ([]byte, error) {
	fd, size, err := r.openRegular(p)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if size > max {
		return nil, r.pathErr("read", p, fmt.Errorf("%w (%d bytes, over %d)", ErrTooLarge, size, max))
	}
	// Read into a buffer of the size fstat gave, plus room to see a file
	// that grew (up to max, then ErrTooLarge).
	b := make([]byte, 0, size+512)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return nil, r.pathErr("read", p, err)
		}
		if n == 0 {
			return b, nil
		}
		b = b[:len(b)+n]
		if int64(len(b)) > max {
			return nil, r.pathErr("read", p, fmt.Errorf("%w (over %d bytes)", ErrTooLarge, max))
		}
	}
}

// ReadDir lists the names in the directory at p, in directory order (not
// sorted). Symlinks on the way are followed, clamped to the root.
func (r *Root) ReadDir(p string) ([]string, error) {
	return r.ReadDirMax(p, MaxDirEntries)
}

// MaxDirEntries bounds ReadDir: an image directory can hold any number of
// names, and none that Gantry lists holds more than a few hundred.
const MaxDirEntries = 1 << 16

// ReadDirMax is ReadDir failing with ErrTooLarge once the directory has
// more than max names, without reading the rest.
func (r *Root) ReadDirMax(p string, max int) ([]string, error) {
	fd, err := r.openat(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), r.describe(p))
	defer f.Close()
	var names []string
	for {
		batch, err := f.Readdirnames(1024)
		names = append(names, batch...)
		if len(names) > max {
			return nil, r.pathErr("readdir", p, fmt.Errorf("%w (over %d names)", ErrTooLarge, max))
		}
		if errors.Is(err, io.EOF) || (err == nil && len(batch) == 0) {
			return names, nil
		}
		if err != nil {
			return nil, r.pathErr("readdir", p, err)
		}
	}
}

// Stat describes the file at p, following symlinks (clamped to the root).
func (r *Root) Stat(p string) (fs.FileInfo, error) {
	fd, err := r.openat(p, unix.O_PATH, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, r.pathErr("stat", p, err)
	}
	return newInfo(path.Base("/"+clean(p)), &st), nil
}

// Lstat describes the file at p without following a symlink in its last
// component (its directories are resolved in the root).
func (r *Root) Lstat(p string) (fs.FileInfo, error) {
	if clean(p) == "." {
		return r.Stat(p)
	}
	pfd, base, err := r.parent(p, unix.O_PATH)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, r.pathErr("lstat", p, err)
	}
	return newInfo(base, &st), nil
}

// Present reports which of names exist (as anything, a symlink not
// followed) directly in the directory dir, which is resolved in the root
// once for all of them (a link on the way resolves inside the root, as
// every path here does). A dir that cannot be opened (none, a file) holds
// none of them.
func (r *Root) Present(dir string, names []string) (map[string]bool, error) {
	out := make(map[string]bool, len(names))
	fd, err := r.openat(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		// No such directory (or none inside the root): none of them.
		return out, nil
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	for _, n := range names {
		if n == "" || n == "." || n == ".." || strings.ContainsRune(n, '/') {
			return nil, r.pathErr("lstat", path.Join(dir, n), errors.New("not a name in the directory"))
		}
		if unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			out[n] = true
		}
	}
	return out, nil
}

// Readlink returns the content of the symlink at p (its directories are
// resolved in the root; the link itself is read, not followed).
func (r *Root) Readlink(p string) (string, error) {
	pfd, base, err := r.parent(p, unix.O_PATH)
	if err != nil {
		return "", err
	}
	defer unix.Close(pfd)
	s, err := readlinkat(pfd, base)
	if err != nil {
		return "", r.pathErr("readlink", p, err)
	}
	return s, nil
}

func readlinkat(dirfd int, base string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, base, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// parent opens the directory holding p (resolved in the root) and returns
// it with p's last component, which the caller creates, replaces or stats
// without following it.
func (r *Root) parent(p string, flags uint64) (int, string, error) {
	c := clean(p)
	if c == "." {
		return -1, "", r.pathErr("open", p, errors.New("the root itself has no parent directory"))
	}
	fd, err := r.openat(path.Dir(c), flags|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", err
	}
	return fd, path.Base(c), nil
}

// MkdirAll creates the directory p and any missing parents with mode
// (before umask). Existing components may be symlinks; they resolve inside
// the root. A symlink to a directory that does not exist in the root is an
// error (as with os.MkdirAll), not something to create.
func (r *Root) MkdirAll(p string, mode os.FileMode) error {
	fd, err := r.mkdirAll(p, mode)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// mkdirAll returns an O_PATH descriptor of the directory p, creating it.
func (r *Root) mkdirAll(p string, mode os.FileMode) (int, error) {
	c := clean(p)
	// A directory that exists (the usual case: /usr/lib/x86_64-linux-gnu,
	// /etc) is one openat2, resolved in the root as the walk below would
	// resolve it; anything else takes the walk, which creates what is
	// missing and names what is in the way.
	if c != "." {
		if fd, err := openat2(r.fd, c, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}); err == nil {
			return fd, nil
		}
	}
	cur, err := r.openat(".", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, err
	}
	if c == "." {
		return cur, nil
	}
	prefix := ""
	for _, name := range strings.Split(c, "/") {
		prefix = path.Join(prefix, name)
		next, err := openChild(cur, name, unix.O_PATH|unix.O_DIRECTORY)
		if err == unix.ENOENT {
			// Create it in the descriptor we hold, never by path string,
			// then open what we created with symlinks refused: if the
			// image swapped in a symlink meanwhile, ELOOP sends us to
			// the in-root resolution below.
			if err := unix.Mkdirat(cur, name, uint32(mode.Perm())); err != nil && err != unix.EEXIST {
				unix.Close(cur)
				return -1, r.pathErr("mkdir", prefix, err)
			}
			next, err = openChild(cur, name, unix.O_PATH|unix.O_DIRECTORY)
		}
		if err == unix.ELOOP {
			// An existing symlink: resolve it as the kernel would inside
			// the root. A dangling one fails here with ENOENT.
			next, err = r.openat(prefix, unix.O_PATH|unix.O_DIRECTORY, 0)
			if err != nil {
				unix.Close(cur)
				return -1, fmt.Errorf("%w (a symlink to a directory missing in the root)", err)
			}
		}
		if err != nil {
			unix.Close(cur)
			if _, ok := err.(*os.PathError); ok || err == ErrNoOpenat2 {
				return -1, err
			}
			return -1, r.pathErr("mkdir", prefix, err)
		}
		unix.Close(cur)
		cur = next
	}
	return cur, nil
}

var tmpSeq atomic.Uint64

// tmpName is a name for a temporary file beside base. It starts with a dot
// so that loaders and listings skip it if a crash leaves it behind.
func tmpName(base string) string {
	n := ".gantry-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(tmpSeq.Add(1), 10) + "-"
	if len(n)+len(base) > 255 {
		base = base[:255-len(n)]
	}
	return n + base
}

// Symlink creates link (a path in the root) as a symlink to target; the
// directory holding link must exist. If link already is a symlink to target
// nothing is done; anything else at link fails with an error matching
// fs.ErrExist. target is stored as given and is not checked: the kernel
// resolves it later, in the container.
func (r *Root) Symlink(target, link string) error {
	return r.symlink(target, link, false)
}

// ReplaceSymlink is Symlink that replaces a file or symlink already at link
// (like ln -sf), atomically: the name never disappears. A directory at link
// is not replaced.
func (r *Root) ReplaceSymlink(target, link string) error {
	return r.symlink(target, link, true)
}

// ReplaceSymlinksIn makes dir (creating it like MkdirAll) and, in it, each
// name in names a symlink to the target at the same index, replacing what
// is there as ReplaceSymlink does. The directory is resolved once: the
// runtime shim links a dozen libraries into one directory per container.
func (r *Root) ReplaceSymlinksIn(dir string, targets, names []string) error {
	if len(targets) != len(names) {
		return fmt.Errorf("ReplaceSymlinksIn: %d targets for %d names", len(targets), len(names))
	}
	dfd, err := r.mkdirAll(dir, 0o755)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	for i, name := range names {
		link := path.Join("/", clean(dir), name)
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
			return r.pathErr("symlink", link, fmt.Errorf("invalid link name %q", name))
		}
		if err := r.symlinkAt(dfd, targets[i], name, link, true); err != nil {
			return err
		}
	}
	return nil
}

func (r *Root) symlink(target, link string, replace bool) error {
	if target == "" || strings.IndexByte(target, 0) >= 0 {
		return r.pathErr("symlink", link, fmt.Errorf("invalid target %q", target))
	}
	pfd, base, err := r.parent(link, unix.O_PATH)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return r.symlinkAt(pfd, target, base, link, replace)
}

// symlinkAt makes base in the directory pfd a symlink to target; link is
// the full path, for errors.
func (r *Root) symlinkAt(pfd int, target, base, link string, replace bool) error {
	if target == "" || strings.IndexByte(target, 0) >= 0 {
		return r.pathErr("symlink", link, fmt.Errorf("invalid target %q", target))
	}
	// Nothing there is the usual case in a fresh root filesystem: one
	// symlinkat. Only when something is there is it read, and replaced
	// (through a temporary name and a rename, so the name never
	// disappears) unless it already is this link.
	err := unix.Symlinkat(target, pfd, base)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return r.pathErr("symlink", link, err)
	}
	if cur, rerr := readlinkat(pfd, base); rerr == nil && cur == target {
		return nil
	}
	if !replace {
		return r.pathErr("symlink", link, err)
	}
	tmp := tmpName(base)
	if err := unix.Symlinkat(target, pfd, tmp); err != nil {
		return r.pathErr("symlink", link, err)
	}
	if err := unix.Renameat(pfd, tmp, pfd, base); err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return r.pathErr("symlink", link, err)
	}
	return nil
}

// WriteFileAtomic replaces the file at p with data and mode (before umask):
// a temporary file in the same directory is written, synced and renamed
// over p, then the directory is synced. Readers see the old file or the new
// one, never a mix. A symlink at p is replaced, never written through; a
// directory at p is an error. The directory holding p must exist.
func (r *Root) WriteFileAtomic(p string, data []byte, mode os.FileMode) error {
	// O_RDONLY rather than O_PATH: fsync needs a real descriptor.
	pfd, base, err := r.parent(p, unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	tmp := tmpName(base)
	fd, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return r.pathErr("create", p, err)
	}
	werr := writeAll(fd, data)
	if werr == nil {
		werr = unix.Fchmod(fd, uint32(mode.Perm())) // undo the umask: the mode asked for is the mode
	}
	if werr == nil && !r.noSync {
		werr = unix.Fsync(fd)
	}
	if cerr := unix.Close(fd); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(pfd, tmp, pfd, base)
	}
	if werr != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return r.pathErr("write", p, werr)
	}
	if r.noSync {
		return nil
	}
	if err := unix.Fsync(pfd); err != nil {
		return r.pathErr("sync", path.Dir("/"+clean(p)), err)
	}
	return nil
}

// writeAll writes data to fd, retrying short writes and EINTR.
func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		data = data[n:]
	}
	return nil
}

// info is an fs.FileInfo from a stat made through a descriptor (os.FileInfo
// from os.Lstat would need a host path string).
type info struct {
	name string
	st   unix.Stat_t
}

func newInfo(name string, st *unix.Stat_t) *info { return &info{name: name, st: *st} }

func (i *info) Name() string       { return i.name }
func (i *info) Size() int64        { return i.st.Size }
func (i *info) ModTime() time.Time { return time.Unix(i.st.Mtim.Unix()) }
func (i *info) IsDir() bool        { return i.Mode().IsDir() }
func (i *info) Sys() any           { return &i.st }

func (i *info) Mode() fs.FileMode {
	m := fs.FileMode(i.st.Mode & 0o777)
	switch i.st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	}
	if i.st.Mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if i.st.Mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if i.st.Mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}
