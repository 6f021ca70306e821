// Package doctor answers "why can't my container see the GPU?": it walks
// the chain a GPU container depends on, from the kernel module to the
// engine's configuration and, optionally, one running container, and
// reports each link as a Check with its evidence and, when broken, the fix.
//
// The chain, in order:
//
//   - kernel driver: the module's version file (/proc/driver/nvidia/version
//     under the driver root, then the host's);
//   - device nodes: /dev/nvidiactl is 195:255, /dev/nvidia-uvm has the major
//     the kernel gave nvidia-uvm in /proc/devices, per-GPU /dev/nvidiaN exist;
//   - NVML initialises (skipped for simulated GPUs);
//   - driver and CUDA versions, and that NVML's driver version is the kernel
//     module's (the "Driver/library version mismatch" after an upgrade
//     without a reboot);
//   - driver files: what Gantry would inject exists and each library's
//     SONAME link resolves to it;
//   - cached state: the runtime's inventory cache and the CDI specs in the
//     configured spec directories were made for the running driver version
//     (a spec generated before a driver upgrade mounts files that are gone);
//   - engine configuration: Docker's daemon.json, containerd's config.toml
//     and CRI-O's configuration register a runtime that runs gantry-runtime
//     or nvidia-container-runtime, and that program exists;
//     nvidia-container-runtime-hook is on PATH (docker --gpus runs it);
//   - a Docker container (Options.Container): what it asked for, and
//     whether its device cgroup still lets it open /dev/nvidiactl.
//
// A check whose prerequisite failed is reported as skipped, naming the
// prerequisite, so the first failure is the one to fix; checks that do not
// depend on it still run. Not covered yet: persistence mode, pods through
// the CRI socket, containerd containers, and the Kubernetes device plugin.
package doctor
