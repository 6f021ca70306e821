package doctor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// inspect is the part of `docker inspect` the container checks read.
type inspect struct {
	ID    string `json:"Id"`
	State struct {
		Running bool
		Pid     int
	}
	Config struct {
		Env []string
	}
	HostConfig struct {
		Runtime        string
		DeviceRequests []struct {
			Driver       string
			Count        int
			DeviceIDs    []string
			Capabilities [][]string
		}
		Devices []struct {
			PathOnHost      string
			PathInContainer string
		}
	}
}

// checkContainer examines opts.Container: a Docker container when the
// docker CLI knows it (unless --namespace names a containerd namespace),
// else a containerd task found in containerd's runtime v2 state, else a
// container runc runs without an engine (its state under --runc-root).
func checkContainer(opts Options) []Check {
	id := opts.Container
	var dockerErr error
	if opts.Namespace == "" {
		c, err := dockerInspect(opts, id)
		if err == nil {
			return checkDockerContainer(opts, c)
		}
		dockerErr = err
	}
	task, err := findTask(opts.ContainerdState, opts.Namespace, id)
	if err == nil {
		return checkTask(opts, task)
	}
	ev := err.Error()
	if opts.Namespace == "" {
		c, rerr := findRuncState(opts.RuncRoot, id)
		if rerr == nil {
			return checkRuncState(opts, c)
		}
		ev += "; " + rerr.Error()
	}
	if dockerErr != nil {
		ev = dockerErr.Error() + "; " + ev
	}
	c := fail(CheckContainer, fix(fixNoContainer), "%s", ev)
	return []Check{c, *after(CheckContainerDevice, c)}
}

// dockerInspect asks the docker CLI about a container.
func dockerInspect(opts Options, id string) (inspect, error) {
	cmd := exec.Command(opts.Docker, "inspect", "--type", "container", id)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return inspect{}, fmt.Errorf("docker inspect %s: %v: %s", id, err, strings.TrimSpace(stderr.String()))
	}
	var list []inspect
	if err := json.Unmarshal(out, &list); err != nil || len(list) != 1 {
		return inspect{}, fmt.Errorf("docker inspect %s: unexpected output (%v)", id, err)
	}
	return list[0], nil
}

func checkDockerContainer(opts Options, c inspect) []Check {
	id := opts.Container
	visible := ""
	for _, e := range c.Config.Env {
		if v, ok := strings.CutPrefix(e, "NVIDIA_VISIBLE_DEVICES="); ok {
			visible = v
		}
	}
	var what []string
	runtime := c.HostConfig.Runtime
	if runtime == "" {
		runtime = "runc"
	}
	what = append(what, "runtime "+runtime)
	if visible != "" {
		what = append(what, "NVIDIA_VISIBLE_DEVICES="+visible)
	}
	asked := false
	for _, r := range c.HostConfig.DeviceRequests {
		caps := []string{}
		for _, cs := range r.Capabilities {
			caps = append(caps, strings.Join(cs, "+"))
		}
		what = append(what, fmt.Sprintf("device request driver=%q count=%d ids=%v caps=%v", r.Driver, r.Count, r.DeviceIDs, caps))
		asked = true
	}
	for _, d := range c.HostConfig.Devices {
		if strings.Contains(d.PathOnHost, "nvidia") || strings.Contains(d.PathOnHost, "=") {
			what = append(what, "device "+d.PathOnHost)
			asked = true
		}
	}
	gpuRuntime := runtime != "runc" && runtime != "crun"
	if visibleAsks(visible) && gpuRuntime {
		asked = true
	}
	var checks []Check
	switch {
	case asked:
		checks = append(checks, pass(CheckContainer, "%s: %s", id, strings.Join(what, ", ")))
	case visibleAsks(visible):
		checks = append(checks, fail(CheckContainer, fix(fixPlainRunc, "ORCDI", dockerCDIAdvice(opts, fix(fixOrCDI))),
			"%s: %s, but runtime %s ignores NVIDIA_VISIBLE_DEVICES: nothing was injected", id, strings.Join(what, ", "), runtime))
	default:
		// A container that asked for no GPU is not broken: nothing to
		// inject, no device rule to lose, nothing to restart.
		return []Check{
			info(CheckContainer, "%s: %s and no GPU requested%s (to give it GPUs: --gpus all, or --runtime nvidia -e NVIDIA_VISIBLE_DEVICES=all%s)", id, strings.Join(what, ", "), nothingAsked(visible), dockerCDIAdvice(opts, ", or --device nvidia.com/gpu=all")),
			info(CheckContainerDevice, "%s: not probed: no GPU requested", id),
		}
	}
	if !c.State.Running || c.State.Pid <= 0 {
		return append(checks, skip(CheckContainerDevice, "%s is not running", id))
	}
	return append(checks, checkDeviceAccess(opts, id, c.State.Pid, containerFixes{
		restart: fix(fixRestartDocker, "ID", id),
		recur:   fix(fixRecurDocker, "ORCDI", dockerCDIAdvice(opts, fix(fixOrCDI))),
	}, ""))
}

// containerFixes are the engine's words for the device access fixes.
type containerFixes struct {
	// restart rebuilds the container's cgroup from its configuration.
	restart string
	// recur keeps the device rule in the container's own configuration.
	recur string
}

// checkDeviceAccess probes whether the device cgroup of the container
// whose init process is pid still allows 195:255, and whether the
// container has the node. specNote is extra evidence from its spec.
//
// EPERM there is the state NVML inside reports as "Failed to initialize
// NVML: Unknown Error": after `systemctl daemon-reload`, systemd reapplies
// the unit of a container whose GPU rules were added to the cgroup by a
// hook rather than listed in its configuration, and drops them.
func checkDeviceAccess(opts Options, who string, pid int, fx containerFixes, specNote string) Check {
	res, err := probeDevice(opts.Proc, pid, opts.Config.EffectiveDevRoot())
	if err != nil {
		return fail(CheckContainerDevice, fix(fixProbe),
			"%s: probing its device cgroup: %v", who, err)
	}
	nodes, nodesErr := containerGPUNodesWithin(opts.Proc, pid, listTimeout)
	inside := ""
	switch {
	case nodesErr != nil:
		inside = fmt.Sprintf("; its /dev could not be read (%v)", nodesErr)
	case len(nodes) > 0:
		inside = fmt.Sprintf("; in its /dev: %s", strings.Join(nodes, " "))
	}
	probe := fmt.Sprintf("a probe process in its %s opening %s (195:255) got: %s", res.Place, res.Node, res.Errstr())
	switch res.Access() {
	case accessRefused:
		return fail(CheckContainerDevice, fix(fixDeviceRefused, "RESTART", fx.restart, "RECUR", fx.recur),
			"%s cannot open /dev/nvidiactl (%s)%s%s: its device cgroup no longer allows the GPU, the state NVML reports as \"Failed to initialize NVML: Unknown Error\"; usually systemctl daemon-reload rewrote the cgroup%s",
			who, probe, res.rulesEvidence(), specNote, inside)
	case accessUnknown:
		return fail(CheckContainerDevice, fix(fixProbe),
			"%s: %s%s", who, probe, res.rulesEvidence())
	}
	if nodesErr == nil && !contains(nodes, "/dev/nvidiactl") {
		return fail(CheckContainerDevice, fix(fixNoCtl),
			"%s has no /dev/nvidiactl (its device cgroup would allow it: %s)", who, probe)
	}
	if res.Access() == accessNoDriver {
		return pass(CheckContainerDevice,
			"%s: its device cgroup allows /dev/nvidiactl; no driver answers behind it, as on a host without a GPU (see %s) (%s)%s%s",
			who, CheckKernel, probe, res.rulesEvidence(), inside)
	}
	return pass(CheckContainerDevice, "%s opens /dev/nvidiactl (%s)%s%s", who, probe, res.rulesEvidence(), inside)
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// listTimeout bounds the listing of a container's /dev: the container may
// have mounted a filesystem there (FUSE) that never answers.
const listTimeout = 3 * time.Second

// containerGPUNodesWithin is containerGPUNodes, given up after d (the
// listing goroutine is left behind; doctor exits soon after).
func containerGPUNodesWithin(proc string, pid int, d time.Duration) ([]string, error) {
	type result struct {
		nodes []string
		err   error
	}
	ch := make(chan result, 1)
	go func() {
		n, err := containerGPUNodes(proc, pid)
		ch <- result{n, err}
	}()
	select {
	case r := <-ch:
		return r.nodes, r.err
	case <-time.After(d):
		return nil, fmt.Errorf("listing its /dev did not finish within %v", d)
	}
}

// containerGPUNodes lists the /dev/nvidia* entries in the root of process
// pid (/proc/PID/root): the image's tree, read through package rootfs so
// that no symlink in it leads the lookup out.
func containerGPUNodes(proc string, pid int) ([]string, error) {
	r, err := rootfs.Open(filepath.Join(proc, fmt.Sprint(pid), "root"))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	names, err := r.ReadDir("/dev")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, "nvidia") {
			out = append(out, "/dev/"+n)
		}
	}
	sort.Strings(out)
	return out, nil
}
