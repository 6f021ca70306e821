package drivervol

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/procfs"
)

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
