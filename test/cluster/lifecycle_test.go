package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Scenario 4: a pod asking for more GPUs than are free stays Pending with
// Insufficient nvidia.com/gpu, and a Job's pod runs once the GPUs are freed.
func TestPendingUntilGPUsFree(t *testing.T) {
	k := newKube(t)
	total := len(k.hostGPUs())
	need := min(2, total)
	hold := total - need + 1 // leaves need-1 free
	k.apply(podSpec{name: "holder", image: probeImage, gpus: hold, runtimeClass: true,
		script: "echo holding; sleep 20"}.yaml())
	k.logsUntil("holder", "holding", 60*time.Second)
	job := `apiVersion: batch/v1
kind: Job
metadata:
  name: waits
spec:
  backoffLimit: 0
  template:
    metadata:
      labels: {job: waits}
    spec:
      restartPolicy: Never
      runtimeClassName: nvidia
      terminationGracePeriodSeconds: 0
`
	job += strings.ReplaceAll(podSpec{image: probeImage, gpus: need, script: `ls /dev | grep -c '^nvidia[0-9]'`}.container(), "\n  ", "\n      ")
	job = strings.Replace(job, "  containers:", "      containers:", 1)
	k.apply(job)
	k.eventually(60*time.Second, "the Job's pod is Pending for lack of GPUs", func() string {
		out, _ := k.run("get", "pods", "-n", k.ns, "-l", "job=waits", "-o",
			`jsonpath={.items[0].status.phase} {.items[0].status.conditions[?(@.type=="PodScheduled")].message}`)
		if !strings.HasPrefix(out, "Pending") || !strings.Contains(out, "Insufficient nvidia.com/gpu") {
			return "pod: " + out
		}
		return ""
	})
	k.eventually(120*time.Second, "the Job completes once the holder is done", func() string {
		out, _ := k.run("get", "job", "-n", k.ns, "waits", "-o", "jsonpath={.status.succeeded}/{.status.failed}")
		if out != "1/" {
			return "succeeded/failed: " + out + "; " + k.podState("holder")
		}
		return ""
	})
	logs := k.must("logs", "-n", k.ns, "-l", "job=waits")
	if strings.TrimSpace(logs) != strconv.Itoa(need) {
		t.Errorf("the Job's pod saw %q GPU nodes, want %d", strings.TrimSpace(logs), need)
	}
}

// pluginPID is the host pid of the device plugin's process.
func pluginPID(t *testing.T) int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err == nil && strings.HasPrefix(string(b), "gantry-device-plugin\x00") {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	t.Fatal("no gantry-device-plugin process on this host")
	return 0
}

// inject sends one fault line to the simulated GPUs' health socket of the
// running plugin (inside its container's root).
func inject(t *testing.T, line string) {
	t.Helper()
	sock := fmt.Sprintf("/proc/%d/root/run/gantry/sim-health.sock", pluginPID(t))
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		t.Fatalf("the plugin's fault socket: %v", err)
	}
	defer c.Close()
	fmt.Fprintln(c, line)
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || strings.TrimSpace(reply) != "ok" {
		t.Fatalf("%q: answered %q, %v", line, reply, err)
	}
}

// Scenario 5: a critical XID on one simulated GPU takes it out of the
// Node's allocatable within seconds, with an Event naming the GPU and the
// XID; after the quiet period (20 s on the test cluster) it returns.
func TestXIDTakesGPUOut(t *testing.T) {
	k := newKube(t)
	if os.Getenv("GANTRY_CLUSTER_REAL_GPU") != "" {
		t.Skip("faults are injected into simulated GPUs only")
	}
	gpus := k.hostGPUs()
	total := strconv.Itoa(len(gpus))
	k.eventually(30*time.Second, "all GPUs allocatable", func() string {
		if a := k.allocatable(); a != total {
			return "allocatable " + a
		}
		return ""
	})
	victim := gpus[len(gpus)-1]
	start := time.Now()
	inject(t, "xid "+victim+" 79")
	k.eventually(30*time.Second, "allocatable drops by one", func() string {
		if a := k.allocatable(); a != strconv.Itoa(len(gpus)-1) {
			return "allocatable " + a
		}
		return ""
	})
	t.Logf("allocatable dropped %v after the XID", time.Since(start).Round(100*time.Millisecond))
	k.eventually(30*time.Second, "an Event on the Node names the GPU and the XID", func() string {
		var evs struct {
			Items []struct {
				Reason, Message, Type string
				InvolvedObject        struct{ Kind, Name string } `json:"involvedObject"`
			} `json:"items"`
		}
		out, err := k.run("get", "events", "-n", "default", "-o", "json")
		if err != nil {
			return err.Error()
		}
		if err := json.Unmarshal([]byte(out), &evs); err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == nodeName && e.Reason == "GPUUnhealthy" &&
				strings.Contains(e.Message, victim) && strings.Contains(e.Message, "79") {
				return ""
			}
		}
		return fmt.Sprintf("no GPUUnhealthy Event for %s with XID 79 among %d", victim, len(evs.Items))
	})
	k.eventually(90*time.Second, "the GPU returns after the quiet period", func() string {
		if a := k.allocatable(); a != total {
			return "allocatable " + a
		}
		return ""
	})
	t.Logf("back after %v", time.Since(start).Round(100*time.Millisecond))
}

// restartKubelet stops the kubelet up.sh started and starts it again with
// the same command line and environment, as a node's service manager does.
func restartKubelet(t *testing.T) {
	t.Helper()
	const pidFile = "/run/gantry-k8s/kubelet.pid"
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the kubelet's pid file: %v", err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	argv, err1 := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	env, err2 := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err1 != nil || err2 != nil {
		t.Fatalf("the kubelet (pid %d) is not running: %v %v", pid, err1, err2)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	args := strings.Split(strings.TrimRight(string(argv), "\x00"), "\x00")
	log, err := os.OpenFile("/var/lib/gantry-k8s/log/kubelet.log", os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = strings.Split(strings.TrimRight(string(env), "\x00"), "\x00")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait() // reap it if it ends while the tests run
}

// Scenario 6: after a kubelet restart and after the plugin's pod is
// deleted, the plugin registers again, a running pod keeps its GPU, and new
// pods still get theirs.
func TestKubeletRestartAndPluginDeletion(t *testing.T) {
	k := newKube(t)
	total := strconv.Itoa(len(k.hostGPUs()))
	k.apply(podSpec{name: "keeper", image: probeImage, gpus: 1, runtimeClass: true, script: gpuScript}.yaml())
	held := sections(k.logsUntil("keeper", "== end", 90*time.Second))
	keeperID := k.must("get", "pod", "-n", k.ns, "keeper", "-o", "jsonpath={.status.containerStatuses[0].containerID}")

	gpus := len(k.hostGPUs())
	// newPod runs a pod asking for one GPU, which it must get.
	newPod := func(step, name string) {
		t.Helper()
		k.apply(podSpec{name: name, image: probeImage, gpus: 1, runtimeClass: true, script: gpuScript}.yaml())
		sec := sections(k.logsUntil(name, "== end", 90*time.Second))
		if g := gpuNodes(sec["dev"]); len(g) != 1 {
			t.Errorf("%s: a new pod sees GPU nodes %v, want 1", step, g)
		}
		k.must("delete", "pod", "-n", k.ns, name, "--grace-period=0", "--force")
	}
	// registrations counts the plugin pod's "registered with the kubelet" lines.
	registrations := func(pod string) int {
		out, _ := k.run("logs", "-n", "kube-system", pod)
		return strings.Count(out, "registered with the kubelet")
	}
	check := func(step string, n int, plugin string, after int) {
		t.Helper()
		k.eventually(90*time.Second, step+": the plugin registers again", func() string {
			if r := registrations(plugin); r <= after {
				return fmt.Sprintf("plugin pod %s: %d registrations, want more than %d", plugin, r, after)
			}
			if a := k.allocatable(); a != total {
				return "allocatable " + a
			}
			return ""
		})
		id := k.must("get", "pod", "-n", k.ns, "keeper", "-o", "jsonpath={.status.containerStatuses[0].containerID} {.status.phase}")
		if id != keeperID+" Running" {
			t.Errorf("%s: the running pod was disturbed: %q, was %q Running", step, id, keeperID)
		}
		if gpus > 1 { // else the keeper holds the only GPU: see the end
			newPod(step, fmt.Sprintf("after-%d", n))
		}
	}
	plugin, _ := k.pluginPod()
	before := registrations(plugin)
	restartKubelet(t)
	check("kubelet restart", 1, plugin, before)
	k.must("delete", "pod", "-n", "kube-system", plugin, "--wait=true")
	var fresh string
	k.eventually(90*time.Second, "a new plugin pod", func() string {
		out, _ := k.run("get", "pods", "-n", "kube-system", "-l", "app.kubernetes.io/name=gantry", "-o",
			`jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.name}{"\n"}{end}`)
		for _, name := range strings.Fields(out) {
			if name != plugin {
				fresh = name
				return ""
			}
		}
		return "running plugin pods: " + out
	})
	check("plugin pod deleted", 2, fresh, 0)
	out, err := k.run("exec", "-n", k.ns, "keeper", "--", "sh", "-c", "ls /dev | grep '^nvidia[0-9]'")
	if err != nil || strings.Fields(out)[0] != gpuNodes(held["dev"])[0] {
		t.Errorf("the running pod's GPU after both: %q %v, had %v", out, err, gpuNodes(held["dev"]))
	}
	if gpus == 1 {
		k.must("delete", "pod", "-n", k.ns, "keeper", "--grace-period=0", "--force", "--wait=true")
		newPod("after both, the keeper gone", "after-3")
	}
}

// Scenario 7: time-slicing set through the plugin's ConfigMap (what the
// chart's config values render): the Node shows replicas, and two pods
// share a GPU. The ConfigMap is restored afterwards.
func TestTimeSlicing(t *testing.T) {
	k := newKube(t)
	n := len(k.hostGPUs())
	var cm struct {
		Data map[string]string `json:"data"`
	}
	k.getJSON(&cm, "configmap", "-n", "kube-system", "gantry-config")
	orig := cm.Data["config.yaml"]
	if orig == "" {
		t.Fatalf("configmap gantry-config has no config.yaml: %v", cm.Data)
	}
	setConfig := func(conf string) {
		t.Helper()
		patch, _ := json.Marshal(map[string]any{"data": map[string]string{"config.yaml": conf}})
		k.must("patch", "configmap", "-n", "kube-system", "gantry-config", "--type", "merge", "-p", string(patch))
		plugin, _ := k.pluginPod()
		k.must("delete", "pod", "-n", "kube-system", plugin, "--wait=true")
	}
	sliced := orig + "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
	setConfig(sliced)
	t.Cleanup(func() {
		setConfig(orig)
		k.eventually(90*time.Second, "the plugin without time-slicing", func() string {
			if a := k.allocatable(); a != strconv.Itoa(n) {
				return "allocatable " + a
			}
			return ""
		})
	})
	k.eventually(90*time.Second, "2 replicas per GPU on the Node", func() string {
		if a := k.allocatable(); a != strconv.Itoa(2*n) {
			return "allocatable " + a
		}
		return ""
	})
	if l := k.node().Metadata.Labels; l["nvidia.com/gpu.replicas"] != "2" || l["nvidia.com/gpu.sharing-strategy"] != "time-slicing" {
		t.Errorf("labels gpu.replicas %q, gpu.sharing-strategy %q, want 2 and time-slicing", l["nvidia.com/gpu.replicas"], l["nvidia.com/gpu.sharing-strategy"])
	}
	// All replicas but one to the first pod: the second pod's one replica
	// is on a GPU the first already holds.
	k.apply(podSpec{name: "first", image: probeImage, gpus: 2*n - 1, runtimeClass: true, script: gpuScript}.yaml())
	first := sections(k.logsUntil("first", "== end", 90*time.Second))
	k.apply(podSpec{name: "second", image: probeImage, gpus: 1, runtimeClass: true, script: gpuScript}.yaml())
	second := sections(k.logsUntil("second", "== end", 90*time.Second))
	a := strings.Split(envValue(first["env"], "NVIDIA_VISIBLE_DEVICES"), ",")
	b := envValue(second["env"], "NVIDIA_VISIBLE_DEVICES")
	if b == "" || strings.Contains(b, ",") || !contains(a, b) {
		t.Errorf("the second pod's GPU %q should be one of the first pod's %v", b, a)
	}
	if g := gpuNodes(second["dev"]); len(g) != 1 {
		t.Errorf("the second pod sees GPU nodes %v, want 1", g)
	}
}
