// Package cdispec writes the host's GPUs as a Container Device Interface
// (CDI) spec: the file Podman, CRI-O, containerd and Docker (with CDI on) read
// from /etc/cdi or /var/run/cdi to inject devices by name
// (`--device nvidia.com/gpu=0`).
//
// A spec is one serialisation of package edits, so a container gets the same
// nodes, mounts and links whether it goes through CDI or through Gantry's
// runtime shim. What Generate writes, mirroring the specs NVIDIA's toolkit
// generates (facts, in our words):
//
//   - kind "nvidia.com/gpu" unless overridden;
//   - one device per full GPU, named both by index ("0") and by UUID
//     ("GPU-..."), whose edits are that GPU's /dev/nvidia<minor>. A GPU in
//     MIG mode is not offered whole (as upstream): its MIG devices are;
//   - one device per MIG device, named "GPU:MIG" ("0:1") and by MIG UUID,
//     whose edits are the parent's node and the two /dev/nvidia-caps nodes
//     of its GPU instance and compute instance;
//   - "all", the union of the device edits above;
//   - spec-wide containerEdits: the driver files for the capabilities (all of
//     them by default), the control device nodes, createContainer hooks that
//     make the library symlinks and update ld.so.cache (gantry-cdi-hook, a
//     static binary, each hook with the fixed environment edits.HookEnv: a
//     hook without one would run as root with the image's environment), and
//     NVIDIA_VISIBLE_DEVICES=void so that no legacy injector runs again;
//   - cdiVersion: the lowest version able to express the content, as the CDI
//     specs-go package computes it, so older runtimes can read the file.
//
// Generate validates the result with the CNCF CDI library's own checks
// (version, kind, device names, container edits) before returning it: a spec
// that the runtimes would reject is an error here, not at container start.
// Write stores it atomically (temporary file in the same directory, fsync,
// rename, mode 0644), so a runtime scanning the directory never reads half a
// spec.
package cdispec
