package nvcli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/nsmount"
)

// applyHelper is the hidden command the standalone path re-executes this
// binary with; it is not listed in --help.
const applyHelper = "__apply-in-namespace"

// applyJob is what the helper reads on stdin.
type applyJob struct {
	PID    int             `json:"pid"`
	Rootfs string          `json:"rootfs"`
	Edits  *edits.Edits    `json:"edits"`
	Opts   nsmount.Options `json:"opts"`
}

// inUserNamespace reports whether this process runs in a user namespace
// other than the initial one, whose uid map covers all 2^32-1 ids from 0.
func inUserNamespace() (bool, error) {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return false, fmt.Errorf("reading /proc/self/uid_map: %w", err)
	}
	return strings.Join(strings.Fields(string(b)), " ") != "0 0 4294967295", nil
}

// selfPID is this process's id as the mounted /proc numbers it. LXC runs its
// hooks in the container's new pid namespace with the host's /proc still
// mounted, where getpid() and getppid() name other processes.
func selfPID() (int, error) {
	s, err := os.Readlink("/proc/self")
	if err != nil {
		return 0, fmt.Errorf("reading /proc/self: %w", err)
	}
	return strconv.Atoi(s)
}

// applyStandalone applies e to the mount namespace this process itself runs
// in: LXC's mount hook runs inside the container's (not yet pivoted)
// namespaces. nsmount.Apply refuses its caller's own namespace, rightly for
// a hook running on the host, so the work is handed to a copy of this binary
// started in a new mount namespace, from where the container's namespace
// (ours) is another one. This is only done in a user namespace other than
// the initial one: there, no mount can reach the host's mount namespace,
// which that user namespace does not own.
//
// Device nodes made with mknod on a filesystem mounted in a user namespace
// cannot be opened, so the host's nodes are bind-mounted instead (as LXC
// does for /dev/null), and the device cgroup is left to LXC (its hook passes
// --no-cgroups; a user namespace cannot write the cgroup anyway).
func applyStandalone(pid int, rootfs string, e *edits.Edits) error {
	own := &edits.Edits{Mounts: append([]edits.Mount(nil), e.Mounts...)}
	for _, n := range e.DeviceNodes {
		src := n.HostPath
		if src == "" {
			src = n.Path
		}
		own.Mounts = append(own.Mounts, edits.Mount{HostPath: src, ContainerPath: n.Path, Options: []string{"bind", "nosuid", "noexec"}})
	}
	job, err := json.Marshal(applyJob{PID: pid, Rootfs: rootfs, Edits: own, Opts: nsmount.Options{NoCgroups: true}})
	if err != nil {
		return err
	}
	cmd := exec.Command("/proc/self/exe", applyHelper)
	cmd.Args[0] = Name
	cmd.Stdin = bytes.NewReader(job)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return fmt.Errorf("%s", msg)
		}
		return fmt.Errorf("mount helper: %w", err)
	}
	return nil
}

// runApplyHelper is the helper's side: one nsmount.Apply.
func runApplyHelper(stdin io.Reader, stderr io.Writer) int {
	var job applyJob
	if err := json.NewDecoder(stdin).Decode(&job); err != nil {
		fmt.Fprintf(stderr, "reading the mount job: %v\n", err)
		return 1
	}
	if err := nsmount.Apply(job.PID, job.Rootfs, job.Edits, job.Opts); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}
