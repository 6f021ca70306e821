package nsmount

import (
	"errors"
	"fmt"
	"path"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// Options tune Apply.
type Options struct {
	// NoCgroups leaves the device cgroup alone (nvidia-container-cli
	// --no-cgroups): the caller or the runtime grants access to the nodes.
	NoCgroups bool
	// CgroupPath is the container's cgroup as /proc/PID/cgroup names it
	// (e.g. "/docker/3f1c..."); "" reads /proc/PID/cgroup.
	CgroupPath string
}

// ErrInvalid is wrapped by Apply errors for edits that cannot be applied from
// a hook (a relative path, a node outside /dev, an unknown mount option).
var ErrInvalid = errors.New("invalid container edits")

// Apply makes e's DeviceNodes and Mounts appear inside a container that runc
// has created but not started: pid is its init process, rootfs the container
// root path as seen in that process's mount namespace (not yet pivoted; for a
// runc prestart/createRuntime hook this is the state's bundle-relative
// root.path made absolute).
//
// Env, Symlinks and LibraryDirs are not applied here: a hook cannot change the
// process environment, and the rest is done in the root filesystem by package
// inject (Plan.FinishRootfs). See the package documentation for the mechanism.
func Apply(pid int, rootfs string, e *edits.Edits, opts Options) error {
	if e == nil || (len(e.DeviceNodes) == 0 && len(e.Mounts) == 0) {
		return nil
	}
	if pid <= 0 {
		return fmt.Errorf("container pid %d: not a process id", pid)
	}
	if !path.IsAbs(rootfs) {
		return fmt.Errorf("container root %q: not an absolute path", rootfs)
	}
	nodes, err := checkNodes(e.DeviceNodes)
	if err != nil {
		return err
	}
	nsfd, err := containerNamespace(pid)
	if err != nil {
		return err
	}
	defer unix.Close(nsfd)
	userns, err := ownUserNamespace(pid)
	if err != nil {
		return err
	}

	// Everything that can fail without changing anything comes first: the
	// sources are cloned and made read-only while still detached.
	p := &plan{}
	defer p.close()
	for _, m := range e.Mounts {
		if err := p.addMount(m); err != nil {
			return err
		}
	}
	if userns {
		for _, n := range nodes {
			if err := p.addNodeBind(n); err != nil {
				return err
			}
		}
	} else {
		p.nodes = nodes
	}

	if !opts.NoCgroups && len(nodes) > 0 {
		if err := allowDevices(pid, opts.CgroupPath, nodes); err != nil {
			return err
		}
	}
	return inNamespace(nsfd, func() error { return p.apply(rootfs) })
}

// checkNodes validates the nodes and fills in runc's defaults.
func checkNodes(in []edits.DeviceNode) ([]edits.DeviceNode, error) {
	out := make([]edits.DeviceNode, 0, len(in))
	for _, n := range in {
		clean := path.Clean(n.Path)
		if !path.IsAbs(n.Path) || !strings.HasPrefix(clean, "/dev/") {
			return nil, fmt.Errorf("%w: device node %q is not under /dev", ErrInvalid, n.Path)
		}
		n.Path = clean
		switch n.Type {
		case "", "c", "u":
			n.Type = "c"
		case "b":
		default:
			return nil, fmt.Errorf("%w: device node %s has type %q (want c or b)", ErrInvalid, n.Path, n.Type)
		}
		if n.Major < 0 || n.Minor < 0 || n.Major > 0xfff || n.Minor > 0xfffff {
			return nil, fmt.Errorf("%w: device node %s has number %d:%d", ErrInvalid, n.Path, n.Major, n.Minor)
		}
		if n.FileMode == 0 {
			n.FileMode = 0o666 // runc's default for spec devices
		}
		if n.Permissions == "" {
			n.Permissions = edits.CgroupAccess
		}
		if strings.Trim(n.Permissions, "rwm") != "" {
			return nil, fmt.Errorf("%w: device node %s has cgroup access %q (want letters of rwm)", ErrInvalid, n.Path, n.Permissions)
		}
		out = append(out, n)
	}
	return out, nil
}

// containerNamespace opens pid's mount namespace, refusing the caller's own:
// mounting "into" it would change the host.
func containerNamespace(pid int) (int, error) {
	p := "/proc/" + strconv.Itoa(pid) + "/ns/mnt"
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening the container's mount namespace %s: %w", p, err)
	}
	same, err := sameFile(fd, "/proc/self/ns/mnt")
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	if same {
		unix.Close(fd)
		return -1, fmt.Errorf("container process %d shares the host's mount namespace: refusing to mount into it (give the container a mount namespace)", pid)
	}
	return fd, nil
}

// ownUserNamespace reports whether pid is in another user namespace than we
// are: its /dev is then a filesystem where device nodes do not open.
func ownUserNamespace(pid int) (bool, error) {
	p := "/proc/" + strconv.Itoa(pid) + "/ns/user"
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("opening %s: %w", p, err)
	}
	defer unix.Close(fd)
	same, err := sameFile(fd, "/proc/self/ns/user")
	return !same, err
}

func sameFile(fd int, p string) (bool, error) {
	var a, b unix.Stat_t
	if err := unix.Fstat(fd, &a); err != nil {
		return false, err
	}
	if err := unix.Stat(p, &b); err != nil {
		return false, fmt.Errorf("stat %s: %w", p, err)
	}
	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}

// plan is the prepared work: detached mount trees and nodes to make.
type plan struct {
	mounts []mountOp
	nodes  []edits.DeviceNode
}

type mountOp struct {
	target string // container path
	source string // host path, for messages
	tree   int    // open_tree descriptor
	dir    bool
}

func (p *plan) close() {
	for _, m := range p.mounts {
		unix.Close(m.tree)
	}
}

// mountFlags turns OCI bind-mount options into open_tree and mount_setattr
// arguments. Only the options a bind mount of driver files uses are known;
// anything else is refused rather than silently dropped.
func mountFlags(opts []string) (recursive bool, attr uint64, err error) {
	for _, o := range opts {
		switch o {
		case "bind":
		case "rbind":
			recursive = true
		case "ro":
			attr |= unix.MOUNT_ATTR_RDONLY
		case "rw":
			attr &^= unix.MOUNT_ATTR_RDONLY
		case "nosuid":
			attr |= unix.MOUNT_ATTR_NOSUID
		case "nodev":
			attr |= unix.MOUNT_ATTR_NODEV
		case "noexec":
			attr |= unix.MOUNT_ATTR_NOEXEC
		case "private", "rprivate":
			// Always: the clone must not propagate to or from the host.
		default:
			return false, 0, fmt.Errorf("%w: mount option %q is not supported by the hook (known: bind rbind ro rw nosuid nodev noexec private rprivate)", ErrInvalid, o)
		}
	}
	return recursive, attr, nil
}

func (p *plan) addMount(m edits.Mount) error {
	if !path.IsAbs(m.HostPath) || !path.IsAbs(m.ContainerPath) {
		return fmt.Errorf("%w: mount %s -> %s: paths must be absolute", ErrInvalid, m.HostPath, m.ContainerPath)
	}
	recursive, attr, err := mountFlags(m.Options)
	if err != nil {
		return fmt.Errorf("mount %s: %w", m.ContainerPath, err)
	}
	op := mountOp{target: path.Clean(m.ContainerPath), source: m.HostPath}
	tree, err := cloneTree(m.HostPath, recursive, attr)
	if err != nil {
		return err
	}
	op.tree = tree
	p.mounts = append(p.mounts, op) // closed by p.close from here on
	var st unix.Stat_t
	if err := unix.Fstat(tree, &st); err != nil {
		return fmt.Errorf("stat %s: %w", m.HostPath, err)
	}
	p.mounts[len(p.mounts)-1].dir = st.Mode&unix.S_IFMT == unix.S_IFDIR
	return nil
}

// cloneTree clones the mount at host path src into a detached tree and sets
// its attributes, all before it is attached anywhere.
func cloneTree(src string, recursive bool, attr uint64) (int, error) {
	flags := uint(unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC)
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, flags)
	if err != nil {
		if err == unix.ENOSYS {
			return -1, fmt.Errorf("cloning %s: the kernel lacks open_tree(2) (Linux 5.2 or newer is needed to mount into a container from a hook)", src)
		}
		return -1, fmt.Errorf("cloning mount source %s: %w", src, err)
	}
	setFlags := uint(unix.AT_EMPTY_PATH)
	if recursive {
		setFlags |= unix.AT_RECURSIVE
	}
	ma := unix.MountAttr{Attr_set: attr, Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(tree, "", setFlags, &ma); err != nil {
		unix.Close(tree)
		if err == unix.ENOSYS {
			return -1, fmt.Errorf("setting mount options on %s: the kernel lacks mount_setattr(2) (Linux 5.12 or newer is needed)", src)
		}
		return -1, fmt.Errorf("setting mount options on %s: %w", src, err)
	}
	return tree, nil
}

// addNodeBind prepares a device node as a bind mount of the host's node.
func (p *plan) addNodeBind(n edits.DeviceNode) error {
	src := n.HostPath
	if src == "" {
		src = n.Path
	}
	var st unix.Stat_t
	if err := unix.Stat(src, &st); err != nil {
		return fmt.Errorf("device node %s: %w", src, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR && st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return fmt.Errorf("device node %s on the host is not a device (a container in a user namespace gets the host's node bind-mounted)", src)
	}
	if int64(unix.Major(st.Rdev)) != n.Major || int64(unix.Minor(st.Rdev)) != n.Minor {
		return fmt.Errorf("device node %s on the host is %d:%d, the edits say %d:%d", src, unix.Major(st.Rdev), unix.Minor(st.Rdev), n.Major, n.Minor)
	}
	tree, err := cloneTree(src, false, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return err
	}
	p.mounts = append(p.mounts, mountOp{target: n.Path, source: src, tree: tree})
	return nil
}

// inNamespace runs fn on a fresh OS thread that has entered the mount
// namespace nsfd. The thread is never given back to the Go scheduler: it is
// locked and left locked, so it exits with the goroutine.
func inNamespace(nsfd int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread, on purpose (see above).
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_FS): %w", err)
			return
		}
		if err := unix.Setns(nsfd, unix.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("entering the container's mount namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// apply runs inside the container's mount namespace.
func (p *plan) apply(rootPath string) (err error) {
	root, err := rootfs.Open(rootPath)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, n := range p.nodes {
		mode := uint32(n.FileMode.Perm())
		if n.Type == "b" {
			mode |= unix.S_IFBLK
		} else {
			mode |= unix.S_IFCHR
		}
		if err := root.Mknod(n.Path, mode, unix.Mkdev(uint32(n.Major), uint32(n.Minor))); err != nil {
			return fmt.Errorf("creating device node %s: %w", n.Path, err)
		}
	}
	var done []int
	defer func() {
		if err != nil {
			// Undo in reverse order, so a mount made on top of an
			// earlier one goes first.
			for i := len(done) - 1; i >= 0; i-- {
				unix.Unmount("/proc/thread-self/fd/"+strconv.Itoa(done[i]), unix.MNT_DETACH)
			}
		}
	}()
	for _, m := range p.mounts {
		t, terr := root.MountTarget(m.target, m.dir)
		if terr != nil {
			return fmt.Errorf("mount %s -> %s: %w", m.source, m.target, terr)
		}
		merr := unix.MoveMount(m.tree, "", int(t.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		t.Close()
		if merr != nil {
			return fmt.Errorf("mount %s -> %s: move_mount: %w", m.source, m.target, merr)
		}
		done = append(done, m.tree)
	}
	return nil
}
