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
//     GpuConfig, MigDeviceConfig) is read: time-slicing at the default
//     interval passes, what Gantry cannot apply yet fails the claim.
//   - With a health.Source (the device plugin's XID tracker over NVML
//     events, or the simulator's fault socket), WatchHealthStatus feeds the
//     kubelet's DRA health service.
package draplugin
