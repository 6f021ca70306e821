// Package labels computes the Kubernetes node labels that describe a host's
// NVIDIA GPUs, with the names and value formats of NVIDIA's GPU Feature
// Discovery (GFD), so that node selectors, affinities and dashboards written
// for GFD keep working on a Gantry node.
//
// Generate turns one discovery result (a *gpu.System, which also carries the
// driver and CUDA versions) and the device plugin's settings (Config: MIG
// strategy, sharing strategy and replicas, machine type) into a Set, the map
// from label key to value. The rules follow GFD's:
//
//   - nvidia.com/gpu.product is the model name with every character other than
//     letters, digits, '-', '_', '.' and space removed and runs of spaces turned
//     into single '-' ("NVIDIA H100 80GB HBM3" becomes "NVIDIA-H100-80GB-HBM3");
//     a MIG resource appends "-MIG-<profile>", a shared resource that is not
//     renamed appends "-SHARED".
//   - nvidia.com/gpu.memory is in MiB; nvidia.com/gpu.family comes from the
//     compute capability (9.x hopper, 8.0-8.8 ampere, 8.9 ada-lovelace, ...).
//   - nvidia.com/cuda.driver.* and cuda.runtime.* (the deprecated names) and
//     cuda.driver-version.* and cuda.runtime-version.* (their successors) are
//     both written.
//   - Under MIG strategy single the nvidia.com/gpu.* labels describe the MIG
//     devices (or say MIG-INVALID when the GPUs are not split identically);
//     under mixed each MIG profile gets its own nvidia.com/mig-<profile>.*
//     labels.
//
// Facts that a gpu.System does not carry (whether a GPU can do MIG, a MIG
// profile's multiprocessor and engine counts, the PCI class that tells compute
// from graphics mode) come from a Hardware: Catalog answers from tables of
// known GPUs and sysfs, which is what simulated GPUs use.
//
// Two writers publish a Set: WriteFeatureFile writes a node-feature-discovery
// local feature file (key=value lines, replaced atomically), and NodeWriter
// patches the Node object through the Kubernetes API, removing the labels of
// ours that a new Set no longer has and leaving everybody else's alone.
package labels
