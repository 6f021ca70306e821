package mps

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// An MPS daemon and its clients share /dev/shm: each daemon gets a tmpfs
// of its own (MountShm), which its clients mount as their /dev/shm and
// the daemon sees there (Launch). A directory of the host instead would be
// unbounded (a client fills the node's disk or memory) and shared with
// every client of every daemon (one tenant reads and writes another's
// segments).

// DefaultShmSize is the size of a daemon's shm when none is configured:
// what MPS itself keeps there is small (a few MiB per client), but it is
// the clients' whole /dev/shm (PyTorch's data loaders use it).
const DefaultShmSize int64 = 1 << 30

// minShmSize is the smallest size ParseShmSize takes.
const minShmSize int64 = 1 << 20

// ShmMountFlags are the flags of a daemon's shm: no set-user-ID programs,
// device nodes or programs run from it.
const ShmMountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC

// ParseShmSize reads a shm size: a number of bytes, or of Ki, Mi, Gi or
// Ti ("1Gi", "512Mi"); "" is DefaultShmSize. key names the setting in
// errors.
func ParseShmSize(key, s string) (int64, error) {
	if s == "" {
		return DefaultShmSize, nil
	}
	num, unit := s, int64(1)
	for i, suf := range []string{"Ki", "Mi", "Gi", "Ti"} {
		if n, ok := strings.CutSuffix(s, suf); ok {
			num, unit = n, int64(1)<<(10*(i+1))
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/unit {
		return 0, fmt.Errorf("%s %q: not a size; give bytes or a number of Ki, Mi, Gi or Ti, such as 1Gi or 512Mi", key, s)
	}
	if n*unit < minShmSize {
		return 0, fmt.Errorf("%s %q: want at least 1Mi (e.g. 1Gi)", key, s)
	}
	return n * unit, nil
}

// MountShm mounts a tmpfs of size bytes (rounded up to pages) at dir,
// made if missing: mode 1777 as /dev/shm, nosuid, nodev, noexec. A tmpfs
// mounted there already (a daemon adopted after a restart: its clients
// use that one) is kept, with its size and flags set again.
func MountShm(dir string, size int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating the MPS shm directory %s: %w", dir, err)
	}
	data := "mode=1777,size=" + strconv.FormatInt(size, 10)
	mounted, err := IsShmMounted(dir)
	if err != nil {
		return err
	}
	if mounted {
		if err := unix.Mount("", dir, "", unix.MS_REMOUNT|ShmMountFlags, data); err != nil {
			return fmt.Errorf("remounting the MPS shm %s (%s): %w", dir, data, err)
		}
		return nil
	}
	if err := unix.Mount("gantry-mps-shm", dir, "tmpfs", ShmMountFlags, data); err != nil {
		return fmt.Errorf("mounting a tmpfs for the MPS shm at %s (%s): %w (the daemon's manager needs CAP_SYS_ADMIN)", dir, data, err)
	}
	return nil
}

// IsShmMounted reports whether a tmpfs is mounted at dir itself (not only
// somewhere above it).
func IsShmMounted(dir string) (bool, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	if sfs.Type != unix.TMPFS_MAGIC {
		return false, nil
	}
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", dir, err)
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, fmt.Errorf("stat %s: %w", filepath.Dir(dir), err)
	}
	return st.Dev != parent.Dev, nil
}

// UnmountShm unmounts the tmpfs at dir, detached: a client that still has
// it keeps it until it exits, no new one gets it. Nothing mounted there
// is no error.
func UnmountShm(dir string) error {
	mounted, err := IsShmMounted(dir)
	if err != nil || !mounted {
		return err
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting the MPS shm %s: %w", dir, err)
	}
	return nil
}
