// Package drivervol gathers a driver's programs and libraries into one
// directory per driver version, the layout nvidia-docker 1.0's volume
// nvidia_driver_<version> had:
//
//	<Store.Dir>/<version>/bin     the driver's programs (nvidia-smi, the MPS pair, ...)
//	<Store.Dir>/<version>/lib64   its 64-bit libraries, each with its SONAME link
//	<Store.Dir>/<version>/lib     its 32-bit (compat32) libraries, likewise
//
// The files are the driver inventory's programs and libraries (package
// driver): the selection every Gantry front end makes, so what the tree
// holds is what a container of all capabilities would get. Beside each
// library whose name differs from its SONAME is a link SONAME -> file, and,
// as in the original, libcuda.so -> the libcuda file (programs that dlopen
// the unversioned name) and libGLX_indirect.so.0 -> the libGLX_nvidia file
// (GLVND's indirect rendering). Every link is relative and names a file in
// its own directory: nothing in a tree points outside it.
//
// A tree is built once per driver version, into a temporary directory that
// is renamed into place when complete, so a reader sees either no tree or a
// whole one; two builders racing both succeed and one tree is kept. A new
// driver version gets a new tree beside the old ones, which stay until
// removed (Docker's `docker volume rm`, or Store.Remove).
//
// Each file is opened inside the driver root (openat2 RESOLVE_IN_ROOT,
// package rootfs): a symlink in the driver root that points at a host file
// resolves inside the root, so no file from outside the driver root can
// enter a tree, even when the root changes after discovery. The file is then
// hard-linked into the tree when both are on one filesystem (what the
// original did: no copy, no space), else copied. Only regular files whose
// ELF header matches (libraries: a shared object of the expected word size)
// are taken.
//
// A tree can also hold a set of the driver's files only (EnsureSet): the
// programs and libraries one container is given (those of its
// NVIDIA_DRIVER_CAPABILITIES), so that a container asking for compute
// finds no graphics library in its tree. Each set has its store below
// <Store.Dir>/.sets/<key>, key a short hash of the set's host paths and
// each file's identity (SetKey: device, inode, size, modification time),
// with one tree per driver version as above: containers given the same
// files share one tree, and a file replaced under the same path and
// version makes a new one. .sets is no version, so the sets never
// show as volumes. A set's file that cannot be hard-linked from the driver
// is hard-linked from the version's full tree when that has it with the
// same bytes, and copied otherwise.
//
// A set's tree also holds the set's firmware and configuration files (GSP
// firmware, the Vulkan, EGL, OpenCL and GLVND files, application
// profiles, X server modules: whatever the inventory lists and a container
// of those capabilities would get), each a regular file at its container
// path below files/ (FilePath):
//
//	<set tree>/files/lib/firmware/nvidia/<version>/gsp_ga10x.bin
//	<set tree>/files/etc/OpenCL/vendors/nvidia.icd
//	<set tree>/files/usr/share/vulkan/icd.d/nvidia_icd.json
//
// so that a runtime gives a container a link at the usual path into the
// tree's mount instead of a mount per file. Keeping the container path
// whole makes the place collision-free (a container path names one file)
// and says where the file is seen. What is no regular file (a directory of
// application profiles) is left out, and so is a file the tree holds as a
// program or library already (GBM's backend is the allocator library).
// IPC sockets and device nodes never enter a tree. SetKey carries a format
// number (setFormat), changed whenever the same host paths make a tree of
// another meaning, so an older tree is never read as a newer one. The full
// per-version tree (Ensure, the Docker volume) stays nvidia-docker 1.0's:
// programs and libraries only.
//
// Protect makes a tree a read-only, nosuid, nodev mount (as root): a bind
// of it stays read-only even when made without ro, so no container given the
// tree can write through its hard links to the host's driver files. The
// files then live in <Store.Dir>/.served-<version>, and <Store.Dir>/<version>
// is only the mount point of a read-only bind of them, attached already
// read-only (open_tree, mount_setattr, move_mount; kernels before 5.12 bind
// the files at the private mount point <Store.Dir>/.ro-<version>, remount
// that read-only, bind it at the served path, read-only from the start, and
// detach the private one): whoever looks at the served path sees no tree, an empty
// directory or the read-only tree, never the writable one. Serve builds a
// tree straight into that layout. Remove takes the mount off first, leaving
// the empty mount point, and removes both directories.
//
// Two consumers share a tree: the Docker volume plugin (package dockervol)
// hands its path to Docker as the volume's mountpoint, and a runtime can bind
// the same directory read-only at /usr/local/nvidia as one mount, instead of
// one mount per driver file (Tree lists the libraries and their SONAMEs
// for the container's ld.so.cache).
package drivervol
