package doctor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

func checkContainer(opts Options) []Check {
	id := opts.Container
	cmd := exec.Command(opts.Docker, "inspect", "--type", "container", id)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return []Check{
			fail(CheckContainer, "name a running container (docker ps), and run doctor where the docker CLI reaches the daemon",
				"docker inspect %s: %v: %s", id, err, strings.TrimSpace(stderr.String())),
			*after(CheckContainerDevice, Check{Name: CheckContainer, Status: Fail}),
		}
	}
	var list []inspect
	if err := json.Unmarshal(out, &list); err != nil || len(list) != 1 {
		return []Check{fail(CheckContainer, "report a bug", "docker inspect %s: unexpected output (%v)", id, err)}
	}
	c := list[0]
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
	if visible != "" && visible != "void" && visible != "none" && gpuRuntime {
		asked = true
	}
	var checks []Check
	switch {
	case asked:
		checks = append(checks, pass(CheckContainer, "%s: %s", id, strings.Join(what, ", ")))
	case visible != "":
		checks = append(checks, fail(CheckContainer,
			"run it with --runtime nvidia, or --gpus all, or --device nvidia.com/gpu=all (CDI)",
			"%s: %s, but runtime %s ignores NVIDIA_VISIBLE_DEVICES: nothing was injected", id, strings.Join(what, ", "), runtime))
	default:
		checks = append(checks, fail(CheckContainer,
			"run it with --gpus all, or --runtime nvidia -e NVIDIA_VISIBLE_DEVICES=all, or --device nvidia.com/gpu=all (CDI)",
			"%s: %s and no GPU request", id, strings.Join(what, ", ")))
	}
	if !c.State.Running {
		return append(checks, skip(CheckContainerDevice, "%s is not running", id))
	}
	return append(checks, checkContainerDevice(opts, c))
}

// checkContainerDevice opens /dev/nvidiactl inside the container. EPERM
// there, while the node exists, is the device cgroup refusing it: after
// `systemctl daemon-reload`, systemd rewrites the cgroup of a container
// whose GPU rules were added by a hook rather than listed in its config,
// and NVML inside reports "Failed to initialize NVML: Unknown Error".
func checkContainerDevice(opts Options, c inspect) Check {
	id := opts.Container
	cg := deviceCgroupV1(opts.Proc, c.State.Pid)
	cmd := exec.Command(opts.Docker, "exec", id, "sh", "-c", "exec 3</dev/nvidiactl")
	out, err := cmd.CombinedOutput()
	msg := strings.TrimSpace(string(out))
	switch {
	case err == nil:
		return pass(CheckContainerDevice, "%s opens /dev/nvidiactl%s", id, cg)
	case strings.Contains(msg, "ot permitted"): // EPERM: the device cgroup (v1 list or v2 BPF program)
		return fail(CheckContainerDevice,
			"restart the container (docker restart "+id+"); to stop it recurring give the GPUs through CDI (--device nvidia.com/gpu=all) or list the nodes with --device so the rule is in the container's own config",
			"%s cannot open /dev/nvidiactl (%s)%s: its device cgroup no longer allows the GPU, the state NVML reports as \"Failed to initialize NVML: Unknown Error\"; usually systemctl daemon-reload rewrote the cgroup",
			id, msg, cg)
	case strings.Contains(msg, "o such device or address"): // ENXIO: allowed, but no driver behind 195:255
		return fail(CheckContainerDevice,
			"load the nvidia kernel module on the host (see "+CheckKernel+")",
			"%s: the device cgroup allows /dev/nvidiactl but the kernel has no driver for it (%s)%s", id, msg, cg)
	case strings.Contains(msg, "o such file"):
		return fail(CheckContainerDevice,
			"the container got no GPU: see "+CheckContainer+" above",
			"%s has no /dev/nvidiactl (%s)", id, msg)
	case strings.Contains(msg, "executable file not found") || strings.Contains(msg, "exec: \"sh\""):
		return skip(CheckContainerDevice, "%s has no sh to test with%s", id, cg)
	default:
		return fail(CheckContainerDevice, "see the error; docker exec must work for this check",
			"docker exec %s: %v: %s", id, err, msg)
	}
}

// deviceCgroupV1 returns ", devices.list: ..." for the GPU rules of pid's
// cgroup v1 devices controller, or "" on cgroup v2 (rules are a BPF program
// there, which only the open above can test) or when it cannot be read.
func deviceCgroupV1(proc string, pid int) string {
	if pid <= 0 {
		return ""
	}
	f, err := os.Open(filepath.Join(proc, fmt.Sprint(pid), "cgroup"))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 || !strings.Contains(","+parts[1]+",", ",devices,") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/devices", parts[2], "devices.list"))
		if err != nil {
			return ""
		}
		var rules []string
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if strings.HasPrefix(line, "a ") || strings.HasPrefix(line, "c 195:") {
				rules = append(rules, line)
			}
		}
		return fmt.Sprintf(", devices.list GPU rules: %s", listOrNone(rules))
	}
	return ""
}
