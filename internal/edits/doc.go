// Package edits is the one model of what Gantry does to a container that asks
// for GPUs.
//
// Every front end (the runtime shim, the prestart hook, `gantry cdi generate`,
// the nvidia-container-cli compatibility path) starts from the same value: an
// Edits, built once from what the host has (gpu.System, driver.Inventory) and
// what the container asks for (request.Request). An Edits holds
//
//   - Env: variables set in the container, replacing any earlier value;
//   - DeviceNodes: character devices created in the container, each with the
//     cgroup access it needs;
//   - Mounts: read-only bind mounts of driver libraries, binaries, firmware and
//     config files, and read-write bind mounts of the driver's IPC sockets;
//   - Symlinks: links the dynamic linker and applications expect next to the
//     injected libraries (SONAME links, libcuda.so);
//   - LibraryDirs: container directories whose libraries must be added to the
//     container's ld.so.cache.
//
// The same Edits is then serialised for each consumer: CDI container edits
// (Edits.CDI, where symlinks and the ld.so.cache update become createContainer
// hooks that call `gantry-cdi-hook create-symlinks|update-ldcache`, each with
// the fixed environment HookEnv), or a
// direct patch of an OCI runtime spec (Edits.ApplyToSpec, which a runtime shim
// uses without forking any hook; symlinks and ld.so.cache entries then land in
// the root filesystem through package containerhook, which package inject
// runs, not through the spec).
//
// # What NVIDIA's stack injects, and what we copy of it (facts, in our words)
//
// Device selection (libnvidia-container's CLI device selection, the toolkit's
// CDI naming): a device list names GPUs by index (the NVML enumeration order),
// by full GPU UUID compared without regard to case (no prefixes), or by PCI
// bus id in domain:bus:device.function form; MIG devices by "GPU:MIG" index
// pair (the MIG index counts the parent's MIG devices) or by full MIG UUID.
// "all" selects every GPU and every MIG device. Selecting a MIG device also
// brings its parent GPU's node, because the driver opens the parent to reach
// the instance. An ID that matches nothing is an error, not a silent skip.
//
// Per-GPU device nodes: /dev/nvidia<minor> for a full GPU. A MIG device adds
// two capability nodes under /dev/nvidia-caps: nvidia-cap<N> for the GPU
// instance's access capability and another for the compute instance's (the
// minors come from /proc/driver/nvidia-caps/mig-minors; package gpu carries
// them as GICapMinor and CICapMinor). The nvidia-caps major is allocated at
// module load, so nodes are stat'ed under the device root (driver.StatDevice)
// rather than assumed. NVIDIA_MIG_CONFIG_DEVICES and NVIDIA_MIG_MONITOR_DEVICES
// grant the global "config" (nvidia-cap1) and "monitor" (nvidia-cap2)
// capabilities; the request parser only keeps them for privileged containers.
//
// Control device nodes and their capability (libnvidia-container's driver
// mount step): /dev/nvidiactl goes to every GPU container; the UVM nodes
// (/dev/nvidia-uvm, /dev/nvidia-uvm-tools), which have their own major, only
// with the compute capability; /dev/nvidia-modeset only with display.
// IPC sockets: the persistenced and fabric-manager sockets only with utility,
// every other driver IPC endpoint (the MPS pipe directory) only with compute.
// GSP firmware is mounted whatever the capabilities. When the inventory marks a
// file with a capability, that capability decides; these name rules apply only
// to files the inventory leaves unmarked.
//
// Cgroup access: the toolkit's CDI specs grant "rwm" on every node (the CDI
// library's default as well); we do the same, so the CDI and OCI paths agree.
//
// Mount options: driver files are bind-mounted with ro, nosuid, nodev, rbind,
// rprivate; IPC sockets with nosuid, nodev, rbind, rprivate, noexec and
// without ro, since clients must write to them.
//
// Symlinks: a library whose file name differs from its SONAME gets a SONAME
// link beside it (libcuda.so.1 -> libcuda.so.550.54.15). NVIDIA also always
// adds libcuda.so -> libcuda.so.1 (build systems link against the bare name),
// libnvidia-opticalflow.so -> libnvidia-opticalflow.so.1, and
// libGLX_indirect.so.0 -> libGLX_nvidia.so.<version>; we add the same three.
// The toolkit's hook takes links as "TARGET::LINK" pairs, the ld.so.cache
// update as --folder arguments; both run as createContainer hooks. The old
// chmod hook (a crun workaround, disabled by default upstream) is not emitted.
//
// NVIDIA_VISIBLE_DEVICES=void: once devices are injected, the toolkit sets
// this in the container so that a second injector further down the chain
// (a legacy prestart hook, a nested runtime) sees "nothing requested" and
// leaves the container alone. Build and the CDI spec's common edits do the
// same: injecting is then idempotent across front ends, and CUDA itself does
// not read the variable (it reads CUDA_VISIBLE_DEVICES).
//
// Determinism: every list in an Edits is deduplicated (by container path, by
// link, by variable name) and sorted, so the same inputs give byte-identical
// CDI specs and config.json patches.
package edits
