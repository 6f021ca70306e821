// Package doctor answers "why can't my container see the GPU?": it walks
// the chain a GPU container depends on, from the kernel module to the
// engine's configuration and, optionally, one running container or a pod,
// and reports each link as a Check with its evidence and, when broken, the
// fix.
//
// The checks are one ordered list, Checks (catalog.go): each has a name, a
// summary, what it needs (Need: the driver, Docker, containerd, CRI-O, a
// Kubernetes node, a container or pod named), its run function (checks.go)
// and its documentation, each way it fails with the fix. The fixes are
// written once, in fixes.go: the documentation shows them as written and
// fail prints them through fix, with the evidence's names filled in. Run
// walks Checks in order; a check whose need does not hold is SKIP with the
// reason (left out, for a container or pod not named). gantry doctor --help
// lists Checks (Help) and docs/troubleshooting.md is generated from them
// (Troubleshooting; go generate ./internal/doctor); tests fail when either
// differs from the list or a check lacks its documentation.
//
// The engines' configuration is read through engineconfig, the reader
// `gantry runtime configure` checks its own output with, at its default
// paths; where a daemon answers (dockerd's /info, containerd's CRI
// Status), what it runs is judged rather than the file.
//
// Two checks ask questions without the usual clients. Whether a
// container's device cgroup still lets it open /dev/nvidiactl is asked
// without running anything from the image: a copy of this binary, started
// on the host and placed in the container's cgroup, opens a 195:255 node
// and reports the errno (devprobe.go). The Node's capacity is read from
// the API server over plain HTTPS (no client-go: this package is linked
// into the binary LXC runs per container as nvidia-container-cli).
//
// A check whose prerequisite failed is reported as skipped, naming the
// prerequisite, so the first failure is the one to fix; checks that do not
// depend on it still run.
package doctor
