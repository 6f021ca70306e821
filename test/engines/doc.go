//go:build linux

// Package engines holds Gantry's integration tests against real container
// engines: a private Docker daemon (Debian's docker.io) with Gantry's runtime
// registered by `gantry runtime configure`, Docker's --gpus flag through the
// OCI hook, Compose GPU reservations, and a private containerd driven by ctr
// with gantry-runtime as its runc binary.
//
// Nothing here touches the host's engines: every daemon gets its own data,
// state and socket directories under a temporary directory, images are built
// from local files (busybox and a small dlopen probe with the host's glibc)
// and imported, never pulled, and every daemon, shim and mount is removed
// when the tests end. GPUs are simulated (sim:h100x8) over a fake driver root
// built by internal/fakedriver with real device nodes.
//
// The tests need root and the engines; without them they skip and say why.
// scripts/deps.sh --test installs the engines on Debian.
package engines
