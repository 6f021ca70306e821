// Package sim describes simulated NVIDIA GPUs, so that Gantry can be tried,
// tested and run in CI on machines without a GPU (`--gpus sim:h100x8`).
//
// A simulated host is a YAML (or JSON) file in the format of Host, or one of
// the built-in profiles, which are embedded YAML files in that same format
// (profiles/*.yaml; `gantry sim profiles` lists them):
//
//	driverVersion: "580.159.04"
//	cudaDriverVersion: "13.0"
//	devices:
//	- name: "NVIDIA H100 80GB HBM3"
//	  pciBusID: "00000000:1B:00.0"
//	  memoryMiB: 81559
//	  computeCapability: "9.0"
//	  brand: nvidia
//	  numaNode: 0
//	  nvlinks:
//	  - {switch: true, links: 18}
//	- name: "NVIDIA A100-SXM4-40GB"
//	  memoryMiB: 40960
//	  computeCapability: "8.0"
//	  migEnabled: true
//	  migDevices:
//	  - {profile: 3g.20gb, gpuInstance: 2}
//	  nvlinks:
//	  - {peer: 0, links: 12}
//
// Keys are checked strictly: an unknown key is an error that names it, so a
// typo never silently falls back to a default. Left-out fields get defaults:
// a device's index is its position and its minor the index; UUIDs are made
// from a hash of the seed (the "seed" key, else the profile or file name) and
// the position, in the real formats GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
// and MIG-xxxxxxxx-...; PCI bus ids count up from 00000000:01:00.0; the
// architecture follows from the compute capability; the brand is "unknown"
// and the NUMA node -1 (unknown). A MIG device's GPU instance defaults to its
// position + 1, its compute instance to 0 and its memory to the profile's
// (5 GiB for 1g.5gb). Its capability device minors (/dev/nvidia-caps) are
// computed with the driver's own numbering (gpu.MIGCapMinors), so the device
// nodes a container gets are the ones a real host of that shape would give.
//
// Versions must be quoted: YAML reads an unquoted 12.10 as the number 12.1.
// (A whole number such as an unquoted 13.0, read as 13, is taken as "13.0".)
//
// Validation rejects what a real driver could never report: duplicate UUIDs,
// minors, PCI bus ids or GPU/compute instance pairs, malformed compute
// capabilities, versions, UUIDs or MIG profiles, MIG devices on a GPU whose
// migEnabled is false, and NVLink peers that name no GPU. Each error names the
// device and the field (devices[2].computeCapability) and wraps ErrInvalid.
package sim
