// Package draplugin is Gantry's Kubernetes Dynamic Resource Allocation
// (resource.k8s.io/v1) kubelet plugin: a second Kubernetes front end beside
// the device plugin, served by the gantry-dra-plugin binary.
//
// It speaks to the kubelet through k8s.io/dynamic-resource-allocation's
// kubeletplugin helper (registration, the DRA gRPC service, the
// ResourceSlice controller) and brings the parts that are Gantry's:
//
//   - Devices turns a discovered gpu.System into ResourceSlice devices: one
//     per whole GPU ("gpu-<minor>") and, for a GPU in MIG mode, one per MIG
//     device instead ("gpu-<minor>-mig-<profile>-<gi>-<ci>"), with the
//     attribute and capacity names of NVIDIA's DRA driver (driver
//     gpu.nvidia.com; type, uuid, index, productName, brand, architecture,
//     cudaComputeCapability, driverVersion, cudaDriverVersion, pcieBusID,
//     parentUUID and profile for MIG; capacity memory in bytes) plus the
//     standard resource.kubernetes.io/pciBusID and numaNode, so claims and
//     DeviceClasses written for NVIDIA's driver select the same devices.
//   - Driver prepares a claim by writing one CDI spec for it (kind
//     k8s.gpu.nvidia.com/claim, one device "<claim UID>-<device>" per
//     allocated GPU) from the same edits `gantry cdi generate` and the
//     runtime use (cdispec.CommonEdits, cdispec.DeviceEdits), and answers
//     the CDI device IDs; unprepare removes the spec. Both are idempotent
//     and recorded in a checkpoint file written atomically, so a plugin or
//     kubelet restart neither prepares a claim twice nor forgets one, and a
//     device held by one claim is refused to another (unless both ask for
//     admin access).
//   - NVIDIA's opaque per-claim configuration (resource.nvidia.com/v1beta1
//     GpuConfig, MigDeviceConfig) is applied at prepare and undone at
//     unprepare (sharing.go): TimeSlicing sets each GPU's time-slice with
//     the driver's nvidia-smi; MPS runs one supervised MPS control daemon
//     (internal/mps) per configuration, with the claim's own pipe and log
//     directories and shm (a bounded tmpfs of its own, --mps-shm-size),
//     started through the plugin's binary in a mount namespace of its own
//     where that shm is /dev/shm (launch.go), adopted after a restart. What
//     Gantry cannot apply fails the claim with the setting named.
//   - With a health.Source (the device plugin's XID tracker over NVML
//     events, or the simulator's fault socket), WatchHealthStatus feeds the
//     kubelet's DRA health service.
package draplugin
