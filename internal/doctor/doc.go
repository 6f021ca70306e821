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
//   - a container (Options.Container: Docker's when the docker CLI knows
//     it, else a containerd task read from its runtime v2 bundle, the OCI
//     spec as the runtime ran it), or each container of a pod found through
//     the CRI runtime service (Options.Pod): what it asked for, what was
//     injected, and whether its device cgroup still lets it open
//     /dev/nvidiactl. That last question is asked without running anything
//     from the image: a copy of this binary, started on the host and placed
//     in the container's cgroup, opens a 195:255 node and reports the errno
//     (devprobe.go);
//   - on a Kubernetes node: the device plugin sockets answer (a socket left
//     by a crashed plugin is a stale registration); each resource's devices
//     and their health from Gantry's plugin, asked as the kubelet asks it
//     (GetDevicePluginOptions, then the first ListAndWatch answer; the
//     plugin names its resource in a response header, which is how doctor
//     knows a second stream is safe: NVIDIA's plugin is only asked for its
//     options); the kubelet's allocatable devices (pod-resources) and its
//     device checkpoint against that list; and, in a pod with a service
//     account, the Node's capacity and allocatable from the API server over
//     plain HTTPS (no client-go: this package is linked into the binary
//     LXC runs per container as nvidia-container-cli).
//
// A check whose prerequisite failed is reported as skipped, naming the
// prerequisite, so the first failure is the one to fix; checks that do not
// depend on it still run.
package doctor
