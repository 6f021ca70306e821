// Package health watches GPUs for the faults that make them unfit for new
// work and reports each change of a device's state as one Event.
//
// Two Sources implement the same contract (Run sends an Event on every state
// change and nothing else):
//
//   - NewNVML watches the driver through an NVML event set: critical XID
//     errors and double-bit (uncorrectable) ECC errors. Single-bit ECC events
//     are registered, as NVIDIA's device plugin does, and ignored: the
//     hardware corrected them.
//   - NewSim serves a unix stream socket on which a test or a user injects
//     faults into simulated GPUs (see NewSim and InjectSim), so the whole path
//     from a fault to the kubelet runs on machines without a GPU.
//
// # Policy
//
// A critical XID or a double-bit ECC error marks the device unhealthy at once.
// XIDs in Policy.IgnoredXIDs are application errors (a kernel faulted, a
// context was torn down): the GPU itself is fine and they change nothing.
// DefaultPolicy ignores the same XIDs as NVIDIA's k8s-device-plugin
// (13, 31, 43, 45, 68, 109). ParseDisable and ParseEnable read that plugin's
// DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS variables, and
// PolicyFromEnv combines them the same way:
//
//   - DP_DISABLE_HEALTHCHECKS=all (or any list containing "xids") turns
//     health checking off altogether;
//   - DP_DISABLE_HEALTHCHECKS=48,79 ignores those XIDs as well as the
//     defaults;
//   - DP_ENABLE_HEALTHCHECKS=13,43 takes XIDs back out of the ignored set
//     (including the defaults); "all" there empties it.
//
// Values are case-insensitive and may have spaces around the commas. Unlike
// NVIDIA's plugin, which skips a malformed entry silently, a malformed entry
// is an error that names it, so a typo never disables a check unnoticed.
//
// # Recovery
//
// NVIDIA's plugin never returns a device to healthy: the node must restart the
// plugin. Here a device becomes healthy again after Policy.RecoveryQuiet has
// passed with no further critical event on it (0 keeps it unhealthy, as
// NVIDIA does). Every new critical event restarts the quiet period. NVML has no
// event for a completed GPU reset (its GPU-recovery-action event says what the
// driver wants done, not that it was done), so for the NVML source a reset
// simply ends in the quiet period; before declaring a device recovered it
// checks that NVML still answers for it, so a GPU that has fallen off the bus
// stays unhealthy. The simulated source accepts an explicit "reset" command,
// which recovers the device at once.
//
// # Registration failures
//
// When NVML cannot register events for one device (ERROR_NOT_SUPPORTED on old
// or virtual GPUs, or any other error), that device's health is unknown: it is
// logged with the reason and assumed healthy, and the other devices are
// watched as usual. NVIDIA's plugin instead marks such a device unhealthy
// (except for ERROR_NOT_SUPPORTED), and marks every device unhealthy when
// waiting on the event set fails; that takes a whole node out of service for a
// monitoring problem, so we log and keep waiting instead. A device NVML
// reports as lost (ERROR_GPU_IS_LOST) is unhealthy, not unknown.
//
// NVIDIA's plugin also registers double-bit ECC events but then skips every
// event that is not an XID; here a double-bit ECC error marks the device
// unhealthy (the driver usually reports XID 48 as well).
//
// MIG devices are watched through their parent GPU: an event that names a GPU
// instance and compute instance affects the MIG device with that placement, an
// event for the whole GPU affects the GPU and all its MIG devices.
package health
