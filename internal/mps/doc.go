// Package mps runs NVIDIA MPS control daemons (nvidia-cuda-mps-control -d)
// for Gantry's two Kubernetes front ends: the device plugin's
// mps-control-daemon mode (one daemon per shared resource) and the DRA
// plugin (one daemon per claim with sharing strategy MPS).
//
// A Daemon is one control daemon: its pipe and log directories, the GPUs it
// serves (CUDA_VISIBLE_DEVICES) and how its control program is run. Start
// starts it, or adopts one that already answers on the pipe directory (a
// manager restarted while its daemon kept running), and waits until it
// answers; Command sends it control commands (set_default_...); Quit stops
// it. Supervise keeps a daemon running: it checks every interval that it
// answers and starts it again when it does not.
//
// Clients reach a daemon through its pipe directory
// (CUDA_MPS_PIPE_DIRECTORY) and must share its /dev/shm; the callers mount
// both into their containers. Each daemon's /dev/shm is a bounded tmpfs of
// its own (MountShm, shm.go), which the daemon sees as /dev/shm because it
// starts through the launcher (Launch, launch.go: the caller's binary again,
// in a mount namespace of its own).
package mps
