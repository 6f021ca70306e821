// Package gpu describes the NVIDIA GPUs of a host as plain data.
//
// The types here are what every other part of Gantry reasons about: the request
// resolver picks devices from a System, the edits builder turns them into device
// nodes, the device plugin advertises them. Two backends fill a System: package
// nvml (the real driver, loaded at run time) and package sim (simulated GPUs
// from a YAML file or a built-in profile). Consumers declare the small interface
// they need (usually just Discover) where they use it.
package gpu

import "strconv"

// System is one discovery result: the host driver and its devices, ordered by index.
type System struct {
	// Backend names where the data came from: "nvml" or "sim:<profile or file>".
	Backend string `json:"backend"`
	// DriverVersion is the kernel driver version, e.g. "550.54.15".
	DriverVersion string `json:"driverVersion"`
	// CUDADriverVersion is the CUDA driver API version the driver supports, as
	// "major.minor" (e.g. "12.4").
	CUDADriverVersion string   `json:"cudaDriverVersion"`
	Devices           []Device `json:"devices"`
}

// Device is one physical GPU.
type Device struct {
	Index int `json:"index"`
	// Minor is the device node minor number: /dev/nvidia<Minor>.
	Minor int    `json:"minor"`
	UUID  string `json:"uuid"`
	// PCIBusID in the domain:bus:device.function form NVML reports,
	// e.g. "00000000:18:00.0".
	PCIBusID string `json:"pciBusID"`
	// Name is the product name, e.g. "NVIDIA H100 80GB HBM3".
	Name string `json:"name"`
	// Brand in lower case as NVIDIA_REQUIRE_* uses it: "tesla", "nvidia",
	// "geforce", "quadro", "titan", "nvidiartx", "quadrortx", ...
	Brand string `json:"brand"`
	// Architecture as GFD names it: "Hopper", "Ampere", ...
	Architecture string `json:"architecture"`
	// ComputeCapability as "major.minor", e.g. "9.0".
	ComputeCapability string `json:"computeCapability"`
	MemoryMiB         uint64 `json:"memoryMiB"`
	// NUMANode is the host NUMA node closest to the GPU, -1 when unknown.
	NUMANode int `json:"numaNode"`
	// CPUAffinity and NUMAAffinity are NVML's CPU and memory (NUMA node)
	// affinity sets as lists ("0-63", "0"), what nvidia-smi topo -m prints
	// in its CPU and NUMA Affinity columns; empty when NVML does not say.
	CPUAffinity  string `json:"cpuAffinity,omitempty"`
	NUMAAffinity string `json:"numaAffinity,omitempty"`
	// MIGEnabled is the current MIG mode.
	MIGEnabled bool        `json:"migEnabled"`
	MIGDevices []MIGDevice `json:"migDevices,omitempty"`
	// NVLinks lists the active NVLink connections of this GPU.
	NVLinks []NVLink `json:"nvlinks,omitempty"`
}

// DevicePath is the device node of the GPU: /dev/nvidia<Minor>.
func (d Device) DevicePath() string { return "/dev/nvidia" + strconv.Itoa(d.Minor) }

// MIGDevice is one MIG device (a GPU instance with one compute instance).
type MIGDevice struct {
	// Index is the MIG device's position among its parent's MIG devices; with
	// the parent index it forms the "GPU:INSTANCE" name (e.g. "0:1").
	Index  int    `json:"index"`
	Parent int    `json:"parent"`
	UUID   string `json:"uuid"`
	// Profile is the MIG profile name without the "MIG " prefix, e.g. "1g.10gb".
	Profile         string `json:"profile"`
	GPUInstance     int    `json:"gpuInstance"`
	ComputeInstance int    `json:"computeInstance"`
	MemoryMiB       uint64 `json:"memoryMiB"`
	// GICapMinor and CICapMinor are the minors of /dev/nvidia-caps/nvidia-cap<N>
	// that grant access to the GPU instance and the compute instance.
	GICapMinor int `json:"giCapMinor"`
	CICapMinor int `json:"ciCapMinor"`
}

// Name is the "GPU:INSTANCE" form used by NVIDIA_VISIBLE_DEVICES and CDI.
func (m MIGDevice) Name() string { return strconv.Itoa(m.Parent) + ":" + strconv.Itoa(m.Index) }

// NVLink is a set of active links from one GPU to a peer.
type NVLink struct {
	// PeerUUID is the GPU at the other end; empty when the peer is an NVSwitch.
	PeerUUID string `json:"peerUUID,omitempty"`
	// Switch is true when the links go to an NVSwitch (all GPUs on the switch
	// fabric are then peers of each other).
	Switch bool `json:"switch,omitempty"`
	Links  int  `json:"links"`
}

// SimulateAdvice is what an error about a missing driver or NVML says to
// do without a GPU, in words every front end accepts: each reads the
// Gantry configuration file (gantry-runtime, the hook, nvidia-ctk and
// nvidia-container-cli take no --gpus flag), and gantry and its plugins
// also take the flag.
const SimulateAdvice = `to simulate GPUs, set gpus = "sim:h100x8" in the Gantry configuration (/etc/gantry/config.toml, or the file $GANTRY_CONFIG names), or give gantry and its plugins --gpus sim:h100x8`
