// Package driver finds what an installed NVIDIA driver provides under a
// driver root, and describes it as an Inventory: the files a GPU container
// may get, each with the capability (NVIDIA_DRIVER_CAPABILITIES value) that
// brings it in.
//
// # What a driver install contains
//
// The facts below come from NVIDIA's container library (the per-capability
// lists in its driver-info code) and container toolkit (its CDI generator
// and discoverers); this package reimplements the behaviour, not the code.
//
//   - utility: the management library libnvidia-ml, libnvidia-cfg and the
//     NVSwitch topology library libnvidia-nscq; the programs nvidia-smi,
//     nvidia-debugdump, nvidia-persistenced and nv-fabricmanager.
//   - compute: libcuda, the debugger, OpenCL, PTX JIT, NVVM, GPU compiler,
//     allocator and PKCS#11 libraries (and the retired fatbinary loader and
//     OpenCL compiler); the MPS programs nvidia-cuda-mps-control and
//     nvidia-cuda-mps-server.
//   - video: the VDPAU driver, the encoder (NVENC), the decoder (NVCUVID)
//     and the optical flow library.
//   - graphics: the GLVND vendor libraries (libGLX_nvidia, libEGL_nvidia,
//     libGLESv2_nvidia, libGLESv1_CM_nvidia) and their helpers (GL and EGL
//     cores, TLS, GLSI, frame-buffer capture, RT core, OptiX, the Vulkan
//     SPIR-V library), plus the EGL platform libraries (egl-gbm,
//     egl-wayland, ...) that carry a version of their own.
//   - ngx: libnvidia-ngx.
//   - display: no libraries in NVIDIA's library; the display engine's node
//     /dev/nvidia-modeset, and (from the toolkit) the X server modules
//     nvidia_drv.so and libglxserver_nvidia.so.<version>.
//   - compat32: the 32-bit builds of the libraries above.
//
// A driver library is selected only when its real file name ends in the
// kernel module's version (libcuda.so.550.54.15): that keeps stale copies of
// another driver out. The file is found through ld.so.cache, whose entries
// are keyed by SONAME and point at SONAME links, so each entry is resolved
// to its real file. NVIDIA's library looks only in the cache; its toolkit
// also searches the usual library directories. We do both: the cache first
// (its order is the loader's), then a fixed list of directories, read once
// each (the distributions' multiarch and lib64 directories, /usr/lib,
// Debian's nvidia/current and the vdpau subdirectories, the 32-bit
// directories, /usr/local/nvidia/lib64 and lib, and any extra directories
// given). Each library is taken once per word size, from the first place it
// is found; the ELF header decides 64 versus 32 bits, and DT_SONAME gives
// the name the container's loader will ask for.
//
// The driver version comes from the kernel module, /proc/driver/nvidia/version
// ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  <date>", or
// "... Open Kernel Module for x86_64  580.159.04  Release Build ..." for the
// open module), first under the driver root and then on the host, or
// /sys/module/nvidia/version, which holds just the number. Without a loaded
// module it is read off the name of libcuda.so.X.Y.Z or
// libnvidia-ml.so.X.Y.Z, as the toolkit does.
//
// Other files:
//   - GSP firmware: gsp*.bin in /lib/firmware/nvidia/<version>; GKE-style
//     installs keep it in /usr/local/nvidia/firmware/nvidia/<version>.
//     Containers get it at /lib/firmware/nvidia/<version>, whatever the
//     capabilities.
//   - IPC endpoints: nvidia-persistenced's socket
//     /run/nvidia-persistenced/socket and the fabric manager's
//     /run/nvidia-fabricmanager/socket (utility), and the MPS pipe directory
//     /tmp/nvidia-mps (compute). Only the ones that exist are listed.
//   - Configuration files, in /etc, /usr/local/share or /usr/share (and
//     /usr/local/nvidia/share): the Vulkan ICD vulkan/icd.d/nvidia_icd.json
//     and layer vulkan/implicit_layer.d/nvidia_layers.json, the GLVND EGL
//     vendor file glvnd/egl_vendor.d/10_nvidia.json, the EGL external
//     platform files egl/egl_external_platform.d/15_nvidia_gbm.json and
//     10_nvidia_wayland.json (and friends), the OptiX cache nvidia/nvoptix.bin,
//     the application profiles nvidia/nvidia-application-profiles-<version>-rc
//     and nvidia-application-profiles-rc(.d), the OpenCL ICD
//     OpenCL/vendors/nvidia.icd, and X server snippets in X11/xorg.conf.d.
//     The GBM backend gbm/nvidia-drm_gbm.so, a link to libnvidia-allocator
//     beside it, is listed here too.
//   - Control device nodes under the device root: /dev/nvidiactl (every GPU
//     container), /dev/nvidia-uvm and /dev/nvidia-uvm-tools (compute),
//     /dev/nvidia-modeset (display), with major and minor numbers from stat.
//     Per-GPU nodes (/dev/nvidiaN) and MIG capability nodes
//     (/dev/nvidia-caps/nvidia-capN) belong to devices, not to the driver:
//     StatDevice reads them on demand.
//
// # Paths
//
// HostPath is the real file on the host, driver root included, after every
// symlink is resolved. Symlinks are resolved inside the root as if it were
// "/" (absolute targets restart at the root, ".." stops there), so a link
// such as libcuda.so.1 -> /etc/passwd under /run/nvidia/driver names
// /run/nvidia/driver/etc/passwd, never the host's file. ContainerPath is
// where the file goes in the container: for libraries the real path with
// the root stripped, so the SONAME links made beside it resolve; for
// binaries /usr/bin/<name>, as NVIDIA's library does, so they are on every
// image's PATH (and a host's /usr/bin wrapper script is passed over for the
// real executable); for firmware /lib/firmware/nvidia/<version>; for config
// files the directory the loaders search, not where a link led.
//
// # Speed
//
// Discover runs on the CDI generation path, which must finish in tens of
// milliseconds on a GPU host. It parses ld.so.cache once, reads about twenty
// known directories once each, stats known names, reads a few hundred bytes
// of each selected library's ELF headers, and runs no program.
//
// # Known differences from NVIDIA
//
// 32-bit libraries are all marked Compat32; NVIDIA's library also requires
// the library's own capability (compat32 plus compute gives the 32-bit
// compute libraries only). The non-GLVND libGL/libEGL builds of very old
// drivers are not looked for.
package driver
