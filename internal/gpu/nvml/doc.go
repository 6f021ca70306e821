// Package nvml discovers the host's real GPUs, through NVIDIA's management
// library (NVML, libnvidia-ml.so.1) or, on the fast path, the kernel
// driver's procfs files.
//
// NVML is loaded with dlopen at run time (github.com/NVIDIA/go-nvml), never
// linked, so every Gantry binary starts on a machine without a driver.
// Discover tries the dynamic loader's search first, then the usual library
// directories under Options.DriverRoot (for drivers mounted elsewhere, such
// as /run/nvidia/driver or GKE's /usr/local/nvidia). When NVML cannot be
// loaded it returns an error wrapping ErrNoNVML, one line that says what to
// do; when the library loads but the kernel module is absent, one wrapping
// ErrDriverNotLoaded. It always shuts NVML down before returning.
//
// Every gpu.Device field is filled where the driver supports it: brand names
// use the NVIDIA_REQUIRE_* spelling ("nvidia", "tesla", "nvidiartx", ...),
// the architecture comes from NVML's enum, falling back to the compute
// capability; the NUMA node from NVML or sysfs; MIG devices with their
// capability device minors from /proc/driver/nvidia-caps/mig-minors (or the
// driver's fixed numbering, gpu.MIGCapMinors, when that file is absent);
// NVLinks grouped per peer GPU or the NVSwitch fabric. Options.Light skips
// the NVLinks, the only per-link work, for the container-create and CDI paths.
//
// Functions newer than the oldest supported driver are looked up in the
// loaded library before they are called, since go-nvml binds symbols lazily
// and calling a missing one would crash the process.
//
// DiscoverProcfs is the cheaper path that needs no NVML at all: it reads
// /proc/driver/nvidia/version and /proc/driver/nvidia/gpus/*/information and
// orders GPUs by PCI bus id as NVML does, but it cannot see compute
// capability, memory, brand or MIG devices (it refuses, with ErrMIGNeedsNVML,
// when MIG instances exist). Its System.Backend is "procfs".
//
// The NVML backend needs cgo and a dynamically linked binary (go-nvml's
// dlopen loads a library built against the host's C library). A binary
// built without cgo, or with the nonvml build tag (gantry-runtime, a static
// binary, see package discover), still compiles: Linked is false and
// Discover returns ErrNoNVML saying so.
package nvml
