package rootfs

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Chmod sets the mode bits of the file at p to perm (0 to 07777: permission,
// setuid, setgid and sticky bits, as chmod(2) takes them). Symlinks on the way, the last component included, are followed
// inside the root only; the file found is pinned by an O_PATH descriptor and
// changed through /proc/self/fd, so a symlink swapped in after the lookup
// changes nothing outside the root. A device node is never opened for
// this: opening one can have side effects in its driver.
func (r *Root) Chmod(p string, perm uint32) error {
	if perm > 0o7777 {
		return r.pathErr("chmod", p, fmt.Errorf("mode %#o has bits beyond 07777", perm))
	}
	fd, err := r.openat(p, unix.O_PATH, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return r.pathErr("stat", p, err)
	}
	if st.Mode&0o7777 == perm {
		return nil
	}
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), perm); err != nil {
		return r.pathErr("chmod", p, err)
	}
	return nil
}

// OpenPath returns an O_PATH descriptor of the existing file at p, resolved
// inside the root (symlinks followed, clamped to it): something to mount on
// or stat, never to read. Unlike MountTarget it creates nothing and accepts
// any file system, procfs included.
func (r *Root) OpenPath(p string) (*os.File, error) {
	fd, err := r.openat(p, unix.O_PATH, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), r.describe(p)), nil
}
