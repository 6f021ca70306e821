package rootfs

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"

	"golang.org/x/sys/unix"
)

// ErrBadMountTarget is wrapped by MountTarget errors for a target that must
// not be mounted on: the root itself, a file of the wrong kind, or a file of
// procfs or sysfs.
var ErrBadMountTarget = errors.New("refused mount target")

// MountTarget returns an O_PATH descriptor of the file or directory at p, to
// mount on (move_mount with MOVE_MOUNT_T_EMPTY_PATH), creating it when it is
// missing: a directory (mode 0755) when dir is true, else an empty regular file
// (mode 0644); missing parents are created as by MkdirAll.
//
// Every component, the last one included, is resolved inside the root: a
// symlink at p leads to a place in the root, never out of it, and the
// descriptor names exactly the inode found, so nothing swapped in later
// changes where the mount lands. The target is refused (ErrBadMountTarget)
// when it is the root itself, is a directory where a file was asked for or the
// other way round, or lies on procfs or sysfs: mounting over a kernel file
// there would change what the runtime writes to as it finishes the container.
func (r *Root) MountTarget(p string, dir bool) (*os.File, error) {
	c := clean(p)
	// A dangling symlink at the last component is followed (inside the root)
	// and its target created, as the kernel would resolve the mount point.
	for hops := 0; ; hops++ {
		if c == "." {
			return nil, r.pathErr("mount", p, fmt.Errorf("%w: the container root itself", ErrBadMountTarget))
		}
		fd, err := r.createTarget(c, dir)
		if err == nil {
			if err := r.checkTarget(fd, p, dir); err != nil {
				unix.Close(fd)
				return nil, err
			}
			return os.NewFile(uintptr(fd), r.describe(p)), nil
		}
		next, ok := r.danglingLink(c)
		if !ok || hops >= 40 {
			return nil, err
		}
		c = next
	}
}

// createTarget makes the file or directory c (a cleaned root-relative path)
// if nothing is there and returns an O_PATH descriptor of what is there now
// (ours, or the image's file or symlink target), resolved in the root.
func (r *Root) createTarget(c string, dir bool) (int, error) {
	pfd, err := r.mkdirAll(path.Dir(c), 0o755)
	if err != nil {
		return -1, err
	}
	base := path.Base(c)
	if dir {
		err = unix.Mkdirat(pfd, base, 0o755)
	} else {
		var fd int
		fd, err = unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
		}
	}
	unix.Close(pfd)
	if err != nil && err != unix.EEXIST {
		return -1, r.pathErr("create", c, err)
	}
	return r.openat(c, unix.O_PATH, 0)
}

// danglingLink returns, for a symlink at c whose target is missing, the
// root-relative path it points to.
func (r *Root) danglingLink(c string) (string, bool) {
	pfd, base, err := r.parent(c, unix.O_PATH)
	if err != nil {
		return "", false
	}
	defer unix.Close(pfd)
	t, err := readlinkat(pfd, base)
	if err != nil || t == "" {
		return "", false
	}
	if !path.IsAbs(t) {
		t = path.Join("/", path.Dir(c), t)
	}
	return clean(t), true
}

func (r *Root) checkTarget(fd int, p string, dir bool) error {
	var st, rst unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return r.pathErr("stat", p, err)
	}
	if err := unix.Fstat(r.fd, &rst); err != nil {
		return r.pathErr("stat", "/", err)
	}
	if st.Dev == rst.Dev && st.Ino == rst.Ino {
		return r.pathErr("mount", p, fmt.Errorf("%w: it resolves to the container root itself", ErrBadMountTarget))
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if isDir != dir {
		want := "a file"
		if dir {
			want = "a directory"
		}
		return r.pathErr("mount", p, fmt.Errorf("%w: the image has %s there, the mount needs %s", ErrBadMountTarget, describeMode(st.Mode), want))
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return r.pathErr("statfs", p, err)
	}
	switch fs.Type {
	case unix.PROC_SUPER_MAGIC:
		return r.pathErr("mount", p, fmt.Errorf("%w: it resolves into /proc", ErrBadMountTarget))
	case unix.SYSFS_MAGIC:
		return r.pathErr("mount", p, fmt.Errorf("%w: it resolves into /sys", ErrBadMountTarget))
	}
	return nil
}

func describeMode(m uint32) string {
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	}
	return "a file of unknown type"
}

// Mknod creates the device node p with the type (unix.S_IFCHR or
// unix.S_IFBLK) and permission bits of mode, and device number dev
// (unix.Mkdev), making missing parent directories. A file, node or symlink
// already at p is replaced atomically: the node is made under a temporary name
// in the same directory, given its exact mode (no umask), and renamed over p,
// so a symlink at p is replaced, never followed. A directory at p is an error.
func (r *Root) Mknod(p string, mode uint32, dev uint64) error {
	switch mode & unix.S_IFMT {
	case unix.S_IFCHR, unix.S_IFBLK:
	default:
		return r.pathErr("mknod", p, fmt.Errorf("mode %#o is not a character or block device", mode))
	}
	c := clean(p)
	if c == "." {
		return r.pathErr("mknod", p, errors.New("the container root itself"))
	}
	pfd, err := r.mkdirAll(path.Dir(c), 0o755)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	base := path.Base(c)
	tmp := tmpName(base)
	if err := unix.Mknodat(pfd, tmp, mode, int(dev)); err != nil {
		return r.pathErr("mknod", p, err)
	}
	if err := fixMode(pfd, tmp, mode&0o7777); err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return r.pathErr("chmod", p, err)
	}
	if err := unix.Renameat(pfd, tmp, pfd, base); err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return r.pathErr("mknod", p, err)
	}
	return nil
}

// fixMode gives the node just made at name in dirfd exactly perm, undoing the
// umask. The node is opened with O_PATH and symlinks refused, and changed
// through /proc/self/fd, which names that inode: fchmodat cannot be told not
// to follow a symlink swapped in meanwhile.
func fixMode(dirfd int, name string, perm uint32) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&0o7777 == perm {
		return nil
	}
	fd, err := openChild(dirfd, name, unix.O_PATH)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), perm)
}
