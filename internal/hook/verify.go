package hook

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/procfs"
)

// The prestart hook acts on the process the OCI state on its stdin names:
// it enters that process's mount namespace, mounts the driver there and
// grants its device cgroup the GPUs. The state comes from the low-level
// runtime, but nothing in the state proves the pid is the container's, and
// a wrong one (a crafted state, a pid reused after the container's init
// died) would put the GPUs and the driver into some other process's
// namespace and cgroup. verifyContainer checks, before anything changes,
// that pid is the init process of the container being created:
//
//   - it is in another mount namespace than the hook (never the host's);
//   - its parent is the hook's parent (or grandparent, for a hook behind a
//     wrapper): runc and crun run prestart hooks from the same process that
//     created the container's init, and no other process's parent is that
//     runtime process. The hook is this process, or the create server's
//     caller when the server does the work (hookPID), which is blocked
//     waiting for the answer meanwhile;
//   - the container's root filesystem, as the state's bundle names it, is the
//     very directory (device and inode) that the process sees at that path.
//
// It holds the process by a pidfd, so that a later check (alive) can tell
// whether the pid still names the same process after the work is done.
type verified struct {
	pid   int
	pidfd int
}

func verifyContainer(pid int, id, rootPath string, hookPID int) (*verified, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("container %s: process %d from the state on stdin: %w", id, pid, err)
	}
	v := &verified{pid: pid, pidfd: fd}
	if err := v.check(id, rootPath, hookPID); err != nil {
		v.close()
		return nil, fmt.Errorf("container %s: refusing to act on process %d, which the state on stdin names: %w", id, pid, err)
	}
	return v, nil
}

func (v *verified) check(id, rootPath string, hookPID int) error {
	proc := "/proc/" + strconv.Itoa(v.pid)
	hook := "/proc/" + strconv.Itoa(hookPID)
	same, err := sameInode(proc+"/ns/mnt", hook+"/ns/mnt")
	if err != nil {
		return err
	}
	if same {
		return errors.New("it shares the hook's (the host's) mount namespace; a container being created has its own")
	}
	ppid, err := procfs.Parent("/proc", v.pid)
	if err != nil {
		return err
	}
	self := os.Getppid()
	if hookPID != os.Getpid() {
		if self, err = procfs.Parent("/proc", hookPID); err != nil {
			return fmt.Errorf("the hook's process %d: %w", hookPID, err)
		}
	}
	grand, _ := procfs.Parent("/proc", self)
	if ppid != self && (grand <= 1 || ppid != grand) {
		return fmt.Errorf("its parent is process %d, not the runtime that runs this hook (process %d): it is not the init of the container being created", ppid, self)
	}
	same, err = sameInode(proc+"/root"+rootPath, rootPath)
	if err != nil {
		return fmt.Errorf("it does not see the container's root filesystem %s: %w", rootPath, err)
	}
	if !same {
		return fmt.Errorf("the root filesystem it sees at %s is not the bundle's", rootPath)
	}
	return v.alive()
}

// alive reports an error if the process has exited since it was verified
// (its pid may then name another process).
func (v *verified) alive() error {
	if err := unix.PidfdSendSignal(v.pidfd, 0, nil, 0); err != nil {
		return fmt.Errorf("process %d exited while the hook ran: %w", v.pid, err)
	}
	return nil
}

func (v *verified) close() { unix.Close(v.pidfd) }

func sameInode(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, fmt.Errorf("stat %s: %w", a, err)
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, fmt.Errorf("stat %s: %w", b, err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}
