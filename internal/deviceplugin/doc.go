// Package deviceplugin is gantry-device-plugin: it offers a node's NVIDIA
// GPUs to the kubelet as extended resources through the device plugin API
// (k8s.io/kubelet deviceplugin/v1beta1), as a drop-in for NVIDIA's
// k8s-device-plugin: the same config file, variables, resource names, socket
// names and Allocate answers.
//
// # Resources
//
// BuildResources turns a gpu.System (full discovery: NUMA nodes, NVLinks,
// MIG devices) into resources by the MIG strategy:
//
//   - none: every GPU whole as nvidia.com/gpu, MIG mode or not (as NVIDIA);
//   - single: the MIG devices as nvidia.com/gpu; all GPUs must be in MIG mode
//     (or none), each with MIG devices, all of one profile;
//   - mixed: nvidia.com/mig-<profile> per MIG profile (nvidia.com/mig-1g.10gb;
//     a "+" in a profile becomes "."), and nvidia.com/gpu for GPUs not in MIG mode.
//
// Device IDs are UUIDs (GPU-..., MIG-...). Time-slicing
// (sharing.timeSlicing) offers each device N times as UUID::0 .. UUID::N-1,
// under the same name or under <name>.shared (renameByDefault, or rename).
// MPS sharing (sharing.mps, mps.go) offers replicas the same way, served by
// an MPS control daemon per resource that the mps-control-daemon mode runs
// (MPSManager, mpsdaemon.go); the replicas are Healthy only while that
// daemon's ready file is fresh. Each device carries its GPU's NUMA node as TopologyInfo.
//
// # Serving
//
// Plugin.Run serves one gRPC server per resource on a unix socket in the
// kubelet directory (nvidia-gpu.sock, nvidia-mig-1g.10gb.sock, ...) and
// registers each with the kubelet's Registration service on kubelet.sock,
// with GetPreferredAllocationAvailable. It watches the directory (fsnotify,
// plus a slow periodic check for missed events): every resource registers
// exactly once with each kubelet.sock (a file of its own: a new inode or
// birth time; a chmod of the same socket is not a new kubelet), however the
// plugin learns of it, so the kubelet never holds two connections; when one
// of our sockets is deleted, its server is recreated and registers again.
// A kubelet directory that does not exist yet (or goes away) is waited for
// on inotify, with one log line. Registration failures are retried, quietly
// for the first two seconds (a kubelet starting or stopping), then with a
// warning and backoff; nothing here exits for them. On termination the servers stop and the sockets we own are removed.
//
// ListAndWatch sends the device list, then the list again on every health
// change. Health comes from a health.Source (NVML events on real GPUs, the
// injection socket of the simulator): a device is Unhealthy while it or its
// physical GPU is; each change is logged with its reason, and Plugin.Health
// exposes the latest state per UUID for metrics.
//
// GetPreferredAllocation uses package topology's graph, built once at start,
// for whole GPUs (best NVLink/NVSwitch connectivity, then PCIe switch, then
// NUMA node, must-include devices first). For replicas it spreads k replicas
// over k distinct physical GPUs when it can, least used first, best
// connected among equals (flags.plugin.sharedDevicesAllocationPolicy
// distributed; packed fills the most used GPU first). MIG devices on GPUs
// the set already uses come first.
//
// Allocate answers each container by flags.plugin.deviceListStrategy (one
// or several):
//
//   - envvar: NVIDIA_VISIBLE_DEVICES=<id>,<id>;
//   - volume-mounts: a read-only bind of /dev/null at
//     /var/run/nvidia-container-devices/<id> per device and
//     NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices;
//   - cdi-annotations: one annotation cdi.k8s.io/nvidia-device-plugin_<hash>
//     (prefix configurable) whose value lists nvidia.com/gpu=<id> names;
//   - cdi-cri: the same names in the response's CDIDevices field.
//
// IDs are UUIDs or indices ("0", "1:3" for MIG) by flags.plugin.deviceIDStrategy;
// replicas map back to their device, each named once. Every list in the
// answer is in device order (GPU index, then MIG device), not the kubelet's,
// so the same devices always give the same answer. When only CDI
// strategies are on, no variable is set. Unknown IDs fail with
// codes.InvalidArgument naming them all; more than one replica per container
// fails the same way when failRequestsGreaterThanOne is set.
// PreStartContainer is not needed and answers empty.
//
// # Deny by default
//
// An image may set NVIDIA_VISIBLE_DEVICES=all; with the envvar strategy a
// pod that requested no GPU would then get every GPU of the node, because
// the runtime cannot tell the image's variable from the plugin's. The
// volume-mount strategy closes that: the device list travels as mounts that
// only the kubelet adds (from Allocate), and the runtime is told to trust only
// those for ordinary containers. In /etc/gantry/config.toml on the node:
//
//	[runtime]
//	accept-env-unprivileged = false   # ignore NVIDIA_VISIBLE_DEVICES unless privileged
//	accept-volume-mounts = true       # read /var/run/nvidia-container-devices/<id> mounts
//
// and deviceListStrategy: volume-mounts here. Then gantry-runtime and
// gantry-hook (package request) read the devices of an unprivileged
// container only from binds of /dev/null under
// /var/run/nvidia-container-devices/: a pod without a GPU request has none
// and gets no GPU whatever its image says; a pod with one gets exactly its
// devices, since a listed mount wins over the variable. Privileged containers
// are still trusted with the variable (as NVIDIA's runtime does), and a pod
// that may mount hostPath /dev/null could forge the list, so keep hostPath
// out of user namespaces (Pod Security "baseline" does). With the envvar
// strategy and accept-env-unprivileged=false, unprivileged pods get no GPU
// at all: use volume-mounts (or a cdi-* strategy) with that setting.
//
// # Configuration
//
// Config reads NVIDIA's config file (version v1: flags, resources, sharing;
// YAML or JSON) plus a "gantry" section; environment variables override the
// file and flags override both, with NVIDIA's names (MIG_STRATEGY,
// FAIL_ON_INIT_ERROR, NVIDIA_DRIVER_ROOT, NVIDIA_DEV_ROOT, PASS_DEVICE_SPECS,
// DEVICE_LIST_STRATEGY, DEVICE_ID_STRATEGY, CDI_ANNOTATION_PREFIX,
// SHARED_DEVICES_ALLOCATION_POLICY, CONFIG_FILE, KUBELET_SOCKET,
// DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS, ...). Gantry's own:
// gantry.gpus (nvml, sim:PROFILE, sim:FILE), gantry.kubeletDir (default
// /var/lib/kubelet/device-plugins), gantry.cdiKind, gantry.mpsShmSize (each
// MPS daemon's shm, a tmpfs of its own; default 1Gi), gantry.health
// (recoveryQuietPeriod, disable, enable, simSocket). Bad values fail at
// start with one line naming the key, where the value came from, and the
// allowed values.
//
// # Where Gantry differs from NVIDIA's plugin
//
//   - Unknown keys in the config file are an error (NVIDIA ignores them);
//     every key of NVIDIA's v1 format is accepted.
//   - resources.gpus / resources.mig patterns and the rename and devices
//     fields of time-slicing and MPS are honoured (NVIDIA warns and ignores them).
//   - A device that recovers (reset, or the quiet period) becomes Healthy again.
//   - GetPreferredAllocation for whole GPUs ranks by interconnect from a graph
//     read once; replicas spread over distinct GPUs, then by topology.
//   - The CDI annotation key ends in a hash of the resource and devices, not
//     a random UUID, so answers are reproducible; volume mounts are read-only.
//   - CDI names use the kind of `gantry cdi generate`'s spec (nvidia.com/gpu),
//     which must be on the node; NVIDIA's plugin writes its own spec with the
//     vendor k8s.device-plugin.nvidia.com.
//   - Not supported, refused at start with a clear error: IMEX channels,
//     Tegra discovery.
package deviceplugin
