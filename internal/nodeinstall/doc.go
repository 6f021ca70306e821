// Package nodeinstall sets a Kubernetes node up for GPU containers from a
// privileged pod, as `make install` and `gantry runtime configure` do by
// hand, and undoes it byte for byte: the work of the installer DaemonSet
// (`gantry node install` and `gantry node uninstall`), the role NVIDIA's
// GPU Operator gives its container-toolkit DaemonSet.
//
// The pod sees the host's / at Options.HostRoot (a hostPath volume); every
// other path in Options is the host's own. Install:
//
//  1. keeps a record (StateDir/install.json on the host) of every file it
//     may change, the original bytes, mode and owner, before the first
//     change; a later install (an upgrade) keeps the first record, so
//     uninstall always goes back to the node as it was before Gantry;
//  2. copies gantry, gantry-runtime and gantry-cdi-hook into BinDir, each
//     through a temporary file renamed over the old one (a create that
//     runs at that moment executes the old binary or the new one, never
//     half of one), with NVIDIA's names as symlinks to them;
//  3. runs the gantry it copied, chrooted into the host, as `gantry runtime
//     configure` (containerd: --drop-in; CRI-O: its crio.conf.d drop-in),
//     so that the engine's own program on the host checks the result, and
//     `gantry cdi generate` into CDISpec;
//  4. restarts the engine with RestartCommand, run in the host's root
//     (PID 1's when the pod has the host's PID namespace, so systemctl
//     does not see a chroot), and waits until it answers CRI again: a
//     Version call and, for containerd, its CRI Status showing the runtime
//     registered at BinDir's gantry-runtime (what the engine loaded, not
//     what the file says);
//  5. labels the Node ReadyLabel=true, which the device plugin and DRA
//     DaemonSets select on.
//
// It fails closed: if the engine does not come back healthy with the new
// configuration, the old files go back, the engine is restarted again, and
// the error (also posted as a Warning Event on the Node) says why.
//
// Uninstall takes the label off, writes each recorded file back (or
// removes one that did not exist), restarts the engine and waits until it
// answers without the runtime, then removes the binaries, the spec and the
// record. Running containers are the engine's shims' and are not touched.
package nodeinstall
