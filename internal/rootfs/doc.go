// Package rootfs does file operations inside a container's root filesystem
// without ever leaving it.
//
// # Why
//
// OCI hooks such as `gantry-cdi-hook update-ldcache` run with host privileges on
// a root filesystem made of image content, and image content is hostile. Any
// directory in it may be a symlink to a host path ("/etc -> /host/etc", or
// "usr/lib -> ../../../../root"), the final name of a file we write may be a
// symlink to a host file ("/etc/ld.so.cache -> /etc/shadow"), and a path that
// was checked a moment ago may be swapped for such a symlink before it is used.
// Joining the root's host path with a container path and handing the string to
// os.Open follows all of those links on the host. That is the class of bugs of
// CVE-2024-0132 and CVE-2025-23267 in NVIDIA's toolkit (symlink-following and
// time-of-check/time-of-use escapes from a container image onto the host).
//
// # How
//
// A Root holds an O_PATH file descriptor of the root directory, and every
// lookup is a single openat2(2) call relative to it with RESOLVE_IN_ROOT: the
// kernel resolves the path as if that directory were "/", so absolute symlinks
// and ".." are clamped to the root, atomically, in one system call; nothing a
// concurrent rename does can make the walk leave the root. RESOLVE_NO_MAGICLINKS
// refuses /proc/self/fd-style links, which would jump anywhere.
//
// Changes are made relative to a descriptor of the already-resolved parent
// directory, and the final name is never followed:
//
//   - MkdirAll creates each missing component with mkdirat(2) in the
//     descriptor of the component before it, then opens the new directory
//     with symlinks refused, so a directory swapped for a symlink in between
//     is not walked through;
//   - Symlink and ReplaceSymlink use symlinkat(2) (and renameat(2) over the
//     old name) in the parent's descriptor;
//   - WriteFileAtomic creates a temporary name with O_CREAT|O_EXCL|O_NOFOLLOW
//     in the parent's descriptor, writes and syncs it, and renames it over
//     the final name in the same directory: a symlink there is replaced,
//     never written through;
//   - MountTarget creates a mount point (file or directory) the same way and
//     returns an O_PATH descriptor of what the whole path resolves to in the
//     root, for move_mount(2) to mount on without another path lookup
//     (package nsmount); Mknod makes a device node under a temporary name
//     and renames it over the final one.
//
// Reads refuse anything but regular files. The file is first opened with
// O_PATH (which opens nothing: no FIFO blocks, no device driver runs),
// checked with fstat, and only then reopened for reading through
// /proc/self/fd, which names exactly that inode. Where /proc is not mounted
// the file is opened directly with O_NONBLOCK|O_NOCTTY and checked after.
//
// Kernels without openat2 (before Linux 5.6) get ErrNoOpenat2 from Open. There
// is deliberately no fallback to resolving path strings in user space: a
// half-safe resolver is the bug this package exists to avoid.
package rootfs
