// Package fakedriver builds a fake NVIDIA driver root at run time: a
// directory that looks, to everything that inspects a driver install, like
// the real thing. Tests use it to exercise driver discovery and container
// setup against real files, and the gantry demo uses it on machines without
// a GPU ("gantry sim driver-root DIR").
//
// What a root holds:
//
//   - Real ELF shared objects, built with gcc from a few lines of C, one per
//     driver library with NVIDIA's file name (libcuda.so.550.54.15), SONAME
//     (libcuda.so.1), SONAME link and development link, covering every
//     capability. libcuda exports cuInit and cuDriverGetVersion (reporting
//     the CUDA version the driver branch shipped with, 12040 for 550), and
//     libnvidia-ml exports nvmlInit_v2 and nvmlSystemGetDriverVersion, so a
//     program in a container can dlopen them and call in. libcuda also has
//     the CUDA process checkpoint API (cuCheckpointProcessLock and the
//     rest), which keeps each process's state in that process's own copy
//     of the library (so it survives CRIU) and, with Options.CheckpointDir,
//     records every call and fails the ones named there. With Compat32, the
//     main libraries also come as 32-bit objects in /usr/lib/i386-linux-gnu.
//   - The driver programs: one small C program, statically linked where the
//     C library allows, installed as nvidia-smi and the other names. As
//     nvidia-smi it says it is fake and counts the /dev/nvidiaN nodes it can
//     see (-L lists them), so container tests can check device isolation.
//   - GSP firmware stand-ins, the Vulkan, GLVND/EGL and OpenCL config files,
//     the X server modules, the GBM backend link,
//     proc/driver/nvidia/version in the kernel module's format, and an
//     nvidia-persistenced socket inode.
//   - etc/ld.so.conf(.d) and a real etc/ld.so.cache written by `ldconfig -r`.
//   - Device nodes: /dev/nvidia0..N-1, nvidiactl, nvidia-modeset,
//     nvidia-uvm(-tools) and the MIG config/monitor capability nodes, as
//     character devices when the caller may mknod (root), else regular
//     files, which Result.RealDeviceNodes reports.
//
// Two layouts. "standard" is a distribution package: libraries in
// /usr/lib/x86_64-linux-gnu (VDPAU in its vdpau/ subdirectory), programs in
// /usr/bin, firmware in /lib/firmware/nvidia/<version>. "gke" mirrors our
// GPU hosts, which we inspected: the driver is a self-contained tree
// /usr/local/nvidia with bin, lib64 (lib is a link to it), firmware/nvidia/
// <version> and share/{vulkan,glvnd}; /etc/ld.so.conf.d/nvidia.conf lists
// /usr/local/nvidia/lib64 and /usr/local/nvidia/lib, so the cache has every
// library there; /usr/lib (which /lib links to, merged /usr) holds absolute
// links such as libcuda.so.1 -> /usr/local/nvidia/lib64/libcuda.so.1, so the
// cache lists each SONAME twice; and /usr/bin/nvidia-smi is a shell wrapper
// that runs /usr/local/nvidia/bin/nvidia-smi. GKE's own nodes mount the same
// tree at /usr/local/nvidia but leave it out of ld.so.conf and set
// LD_LIBRARY_PATH instead; we follow our hosts, where the cache and the
// tree agree.
//
// Both layouts are merged-/usr trees (/lib, /lib64, /bin, /sbin link into
// /usr), as current Debian, Ubuntu and Fedora are, which puts symlinked
// directories in every lookup path.
//
// Speed: each distinct object is compiled once per machine into a cache
// directory keyed by its source and flags, and later builds only copy
// files, so a build takes tens of milliseconds once the cache is warm.
package fakedriver
