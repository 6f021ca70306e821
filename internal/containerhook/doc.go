// Package containerhook implements the OCI hooks that Gantry's CDI specs run
// at createContainer time (Commands, Main; cmd/gantry-cdi-hook is the binary):
//
//	gantry-cdi-hook create-symlinks --link TARGET::LINK ...
//	gantry-cdi-hook update-ldcache --folder DIR ...
//
// (`gantry hook create-symlinks|update-ldcache` in specs written before that
// binary; the gantry CLI runs the same Commands.) The runtime (runc or crun
// under Podman, containerd or CRI-O) runs them as root inside the container's
// mount namespace before pivot_root, with the container's state on stdin;
// ReadState finds the container's root filesystem from it (the bundle's
// config.json, root.path). Nothing else is read: no configuration, no
// environment variable, for a hook's environment is the image's when its
// spec entry has none. The package and everything it imports build without
// cgo, so the hook binary is static and no dynamic loader runs for it.
//
// CreateSymlinks makes the links a CDI mount cannot (the SONAME link
// libcuda.so.1 -> libcuda.so.580.159.04 beside a mounted library), replacing
// what the image had at that name, like `ln -sf`.
//
// UpdateLDCache makes the injected libraries findable by the container's
// dynamic loader. The usual way, running ldconfig, would run a program from
// the image (or the host's ldconfig on image content) with host privileges;
// instead the cache is read, extended and rewritten here: the image's
// /etc/ld.so.cache is parsed by package ldcache, every lib*.so* in the folders
// whose ELF headers say it is a shared object of the host's architecture with
// a DT_SONAME becomes an entry SONAME -> FOLDER/SONAME (on x86-64 hosts i386
// libraries too, the compat32 capability's, under the flags the 32-bit
// loader looks for: a SONAME can then have two entries, one per loader), and
// the cache is
// written back with those entries ahead of the image's entries of the same
// name (glibc's loader takes the first of equal names; ldcache's sort is
// stable). /etc/ld.so.conf.d/000-gantry.conf lists the folders, so that an
// ldconfig run later inside the container keeps them.
//
// NVIDIA's other hooks, for the specs nvidia-ctk writes (the binary installed
// as nvidia-cdi-hook runs them; nvidia.go): chmod (modes inside the root),
// enable-cuda-compat (an /etc/ld.so.conf.d/00-compat-*.conf naming the image's
// CUDA forward-compatibility directory when NVIDIA's rule says to use it,
// which update-ldcache then reads, as the ldconfig of NVIDIA's hook would),
// disable-device-node-modification (a read-only copy of the host's
// /proc/driver/nvidia/params with ModifyDeviceFiles: 0 mounted over the
// container's, from a tmpfs of its own) and update-application-profile
// (EGLVisibleDGPUDevices limited to the container's GPU minors). A hook name
// Main does not know is a warning and exit 0, as with NVIDIA's binary: specs
// from a newer nvidia-ctk must not stop containers.
//
// Security: the hooks run as root on hostile image content. Every file is
// reached through package rootfs, so symlinks in the image (/etc -> /host/etc,
// /etc/ld.so.cache -> /etc/shadow on the host, a --folder that links to a host
// directory) resolve inside the container's root, and files are replaced by
// rename, never written through a link. Nothing from the image is executed.
package containerhook
