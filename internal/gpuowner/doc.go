// Package gpuowner keeps one owner per GPU among a node's Kubernetes front
// ends: gantry-device-plugin and gantry-dra-plugin may run side by side on a
// node, each offering its own GPUs, but must never both offer one GPU (the
// kubelet would then hand it to a device-plugin pod and to a DRA claim at
// once, and NVIDIA's plugins do nothing against it).
//
// # Design
//
// Each plugin, before it offers anything, registers what it will offer in
// the owners directory (DefaultDir, /var/lib/kubelet/gantry-gpu-owners: a
// host directory both DaemonSets mount at the same path; by default each
// plugin finds it in the kubelet root directory its other paths are in):
//
//  1. it takes <dir>/.lock (flock, exclusive), so two plugins starting at
//     once are checked one after the other;
//  2. it reads every other <dir>/<owner>.json and keeps those whose writer
//     still runs: a live owner holds an flock on its file for as long as it
//     runs, which the kernel drops when the process ends however it ends
//     (a file left by a killed plugin is stale and ignored);
//  3. it compares GPUs by UUID (a MIG device counts as its parent GPU): any
//     GPU a live owner has is refused with a ConflictError that names the
//     GPUs, the other plugin and the settings that select disjoint GPUs;
//  4. otherwise it writes its own <owner>.json (temp file, flock, rename:
//     readers never see half a file, and the lock is on the file in place)
//     and drops .lock, keeping its file's flock until Release.
//
// So the plugin that starts second refuses, and the first keeps running.
// Other sources may add owners to the check (Register's extra owners): the
// DRA plugin adds the device plugins' devices the kubelet registered (its
// device checkpoint), which also catches NVIDIA's device plugin.
//
// A refusal is also posted as a Kubernetes Event on the Node (PostRefusal),
// where `kubectl describe node` shows it next to the plugin pod's
// CrashLoopBackOff.
package gpuowner
