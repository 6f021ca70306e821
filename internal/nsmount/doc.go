// Package nsmount makes device nodes and bind mounts appear inside a container
// that the OCI runtime has created but not yet started, from outside it: the
// work of an OCI prestart (or createRuntime) hook such as Docker's
// nvidia-container-runtime-hook.
//
// # Why this is not a plain mount(2)
//
// At prestart time runc has made the container's mount namespace and mounted
// its root filesystem (and /dev, /proc, ...) there, but has not pivoted into
// it. The hook runs on the host, in the host's mount namespace, where those
// mounts are invisible. Mounting must happen inside the container's namespace,
// and setns(CLONE_NEWNS) refuses a thread whose filesystem context (fs_struct:
// root, cwd, umask) is shared with other threads, which every thread of a Go
// program is: the runtime starts threads with CLONE_FS.
//
// # How
//
//  1. In the host namespace, each mount source is cloned with
//     open_tree(OPEN_TREE_CLONE [| AT_RECURSIVE for rbind]): a detached mount
//     held by a file descriptor, which needs no path in the target namespace.
//     mount_setattr then makes it read-only, nosuid, nodev, noexec as the
//     mount's options say, and private, before it is visible anywhere.
//  2. A goroutine locks itself to its OS thread, unshares CLONE_FS (the thread
//     gets its own root and cwd) and enters the container's mount namespace
//     with setns on /proc/PID/ns/mnt. It never unlocks the thread, so the Go
//     runtime ends the thread with the goroutine instead of reusing it.
//  3. On that thread the container root is opened with package rootfs, each
//     mount target is created or found inside it (openat2 RESOLVE_IN_ROOT: a
//     symlink in the image never leads out) and pinned by an O_PATH
//     descriptor, and the detached tree is attached there with
//     move_mount(MOVE_MOUNT_F_EMPTY_PATH|MOVE_MOUNT_T_EMPTY_PATH): no path
//     string is resolved between the check and the mount. Device nodes are
//     made with mknod under /dev of the root (or, for a container in its own
//     user namespace, where nodes on its /dev would be unusable, bind-mounted
//     from the host like runc does).
//
// If a mount fails, the mounts already made are detached again in reverse
// order, so the hook's failure leaves no half-configured namespace (runc then
// destroys the container).
//
// # Device cgroup
//
// Unless Options.NoCgroups, the container's device cgroup is opened up for the
// new nodes, before anything is mounted (a container that then fails is
// destroyed with its cgroup). runc sets the cgroup up before it runs the
// prestart hooks precisely so that a hook can do this.
//
//   - cgroup v1: "c MAJOR:MINOR rwm" is written to devices.allow of the
//     container's devices cgroup.
//   - cgroup v2 has no devices.allow: runc attaches a BPF_PROG_TYPE_CGROUP_DEVICE
//     program (with BPF_F_ALLOW_MULTI) to the container's cgroup, and every
//     attached program must allow an access. So each attached program is
//     replaced by a new one that allows our nodes and otherwise runs the old
//     program's instructions unchanged. The old instructions are read back
//     with BPF_OBJ_GET_INFO_BY_FD (the verifier's translated form: for this
//     program type the kernel rewrites no context access, and programs without
//     helper calls or map references, such as runc's, load again as they
//     are; anything else is refused with an error). The new program starts
//     with a check per node (type, major, minor, access within the granted
//     set: return 1) and then falls through into the old program, whose
//     register 1 (the context) it leaves alone. It is attached with
//     BPF_F_REPLACE, atomically swapping the old one out (or attached and the
//     old one detached, on kernels before 5.6).
//
// Which version applies is decided as runc decides it: /sys/fs/cgroup being a
// cgroup2 mount means v2.
package nsmount
