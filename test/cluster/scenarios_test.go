package cluster

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Scenario 1: the Node advertises the GPUs Gantry sees (capacity =
// allocatable = their count) and carries GPU Feature Discovery's labels.
func TestNodeAdvertisesGPUs(t *testing.T) {
	k := newKube(t)
	want := strconv.Itoa(len(k.pluginGPUs()))
	k.eventually(60*time.Second, "nvidia.com/gpu capacity and allocatable", func() string {
		n := k.node()
		if c, a := n.Status.Capacity["nvidia.com/gpu"], n.Status.Allocatable["nvidia.com/gpu"]; c != want || a != want {
			return fmt.Sprintf("capacity %q, allocatable %q, want %s", c, a, want)
		}
		return ""
	})
	labels := k.node().Metadata.Labels
	for key, wantV := range map[string]string{
		"nvidia.com/gpu.present": "true",
		"nvidia.com/gpu.count":   want,
	} {
		if labels[key] != wantV {
			t.Errorf("label %s = %q, want %q", key, labels[key], wantV)
		}
	}
	for _, key := range []string{"nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/cuda.driver-version.full",
		"nvidia.com/gpu.compute.major", "nvidia.com/gpu.family", "nvidia.com/mig.capable"} {
		if labels[key] == "" {
			t.Errorf("label %s missing (labels: %v)", key, labels)
		}
	}
}

// Scenario 2: a pod with nvidia.com/gpu: 2 (1 on a one-GPU host) and
// runtimeClassName nvidia sees exactly those GPU nodes plus the control
// nodes, loads the injected driver (and, with GANTRY_CLUSTER_REAL_GPU set,
// runs a CUDA kernel on each GPU), and the plugin's /metrics attributes
// those GPUs to it.
func TestPodGetsTwoGPUs(t *testing.T) {
	k := newKube(t)
	n := min(2, len(k.pluginGPUs()))
	cuda := "cuda-check --load-only"
	if os.Getenv("GANTRY_CLUSTER_REAL_GPU") != "" {
		cuda = "cuda-check"
	}
	script := strings.Replace(gpuScript, "echo '== end'", "echo '== cuda'; "+cuda+"\necho '== end'", 1)
	k.apply(podSpec{name: "two", image: probeImage, gpus: n, runtimeClass: true, script: script}.yaml())
	sec := sections(k.logsUntil("two", "== end", 90*time.Second))
	t.Logf("pod log: %v", sec)

	if g := gpuNodes(sec["dev"]); len(g) != n {
		t.Errorf("GPU nodes %v, want exactly %d (/dev: %v)", g, n, sec["dev"])
	}
	if c := sec["cuda"]; len(c) == 0 || !strings.HasPrefix(c[len(c)-1], "cuda-check: OK") {
		t.Errorf("%s in the pod: %q, want it to end with cuda-check: OK", cuda, c)
	}
	for _, ctl := range []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"} {
		if !contains(sec["dev"], ctl) {
			t.Errorf("/dev/%s missing (/dev: %v)", ctl, sec["dev"])
		}
	}
	if len(sec["probe"]) < 2 || !strings.HasPrefix(sec["probe"][0], "cuda ") || !strings.HasPrefix(sec["probe"][1], "nvml ") {
		t.Errorf("probe should load libcuda.so.1 and libnvidia-ml.so.1 from the injected driver, got %q", sec["probe"])
	}
	visible := envValue(sec["env"], "NVIDIA_VISIBLE_DEVICES")
	uuids := strings.Split(visible, ",")
	sort.Strings(uuids)
	var smi []string
	for _, l := range sec["smi"] {
		if m := regexp.MustCompile(`\(UUID: (GPU-[0-9a-f-]+)\)`).FindStringSubmatch(l); m != nil {
			smi = append(smi, m[1])
		}
	}
	sort.Strings(smi)
	if len(uuids) != n || strings.Join(smi, ",") != strings.Join(uuids, ",") {
		t.Errorf("nvidia-smi -L lists %v, NVIDIA_VISIBLE_DEVICES=%q: want the same %d GPUs", smi, visible, n)
	}

	// The plugin's /metrics names the pod on exactly those GPUs.
	_, ip := k.pluginPod()
	k.eventually(30*time.Second, "/metrics attributes the GPUs to the pod", func() string {
		resp, err := http.Get("http://" + ip + ":9401/metrics")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		got := map[string]bool{}
		re := regexp.MustCompile(`namespace="` + k.ns + `",pod="two".*uuid="(GPU-[0-9a-f-]+)"`)
		for _, line := range strings.Split(string(body), "\n") {
			if m := re.FindStringSubmatch(line); m != nil {
				got[m[1]] = true
			}
		}
		var gotList []string
		for u := range got {
			gotList = append(gotList, u)
		}
		sort.Strings(gotList)
		if strings.Join(gotList, ",") != strings.Join(uuids, ",") {
			return fmt.Sprintf("metrics attribute %v to the pod, want %v", gotList, uuids)
		}
		return ""
	})

	// gantry doctor on the node, asked about this pod.
	out, err := exec.Command(filepath.Join(k.bin, "gantry"), "--config", gantryConfig, "doctor",
		"--pod", k.ns+"/two", "--cri-socket", criSocket, "--node", nodeName).CombinedOutput()
	t.Logf("gantry doctor --pod %s/two (exit %v):\n%s", k.ns, err, out)
	for _, check := range []string{"pod devices", "pod containers", "container request", "container device access", "containerd config",
		"device plugin registration", "kubelet gpu resources", "kubelet device checkpoint"} {
		if !regexp.MustCompile(`(?m)^PASS ` + check + `:`).Match(out) {
			t.Errorf("doctor --pod: %q is not PASS", check)
		}
	}
	// A healthy GPU node: nothing fails (exit 0), whatever else is
	// installed on the machine but not used for GPUs (Docker, Debian's
	// containerd).
	if err != nil || regexp.MustCompile(`(?m)^FAIL `).Match(out) {
		t.Errorf("doctor --pod on a healthy node: exit %v, with FAIL lines", err)
	}
}

// Scenario 3: deny by default. A pod without a GPU request whose image sets
// NVIDIA_VISIBLE_DEVICES=all (as the CUDA images do) sees no GPU, with
// Gantry's runtime class and without.
func TestNoRequestNoGPU(t *testing.T) {
	k := newCluster(t)
	k.apply(podSpec{name: "nvrc", image: probeAll, runtimeClass: true, script: gpuScript}.yaml())
	k.apply(podSpec{name: "plain", image: probeAll, script: gpuScript}.yaml())
	for _, pod := range []string{"nvrc", "plain"} {
		sec := sections(k.logsUntil(pod, "== end", 90*time.Second))
		for _, n := range sec["dev"] {
			if strings.HasPrefix(n, "nvidia") {
				t.Errorf("%s: /dev/%s in a pod that asked for no GPU (/dev: %v)", pod, n, sec["dev"])
			}
		}
		if len(sec["probe"]) == 0 || !strings.Contains(sec["probe"][0], "libcuda.so.1") || strings.HasPrefix(sec["probe"][0], "cuda ") {
			t.Errorf("%s: probe should fail to load libcuda.so.1, got %q", pod, sec["probe"])
		}
		if len(sec["smi"]) == 0 || !strings.Contains(strings.Join(sec["smi"], " "), "not found") {
			t.Errorf("%s: nvidia-smi should not exist, got %q", pod, sec["smi"])
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func envValue(env []string, key string) string {
	for _, l := range env {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return v
		}
	}
	return ""
}

// TestPodWithoutRuntimeClass: on a node whose containerd has nvidia as its
// default runtime (up.sh --set-as-default: gantry runtime configure
// --set-as-default), a pod that asks for nvidia.com/gpu and names no
// runtimeClassName (as NVIDIA's static manifests and many charts are
// written) gets exactly its GPU and the driver, through the default.
func TestPodWithoutRuntimeClass(t *testing.T) {
	needDefaultRuntime(t)
	k := newKube(t)
	k.apply(podSpec{name: "default-runtime", image: probeImage, gpus: 1, script: gpuScript}.yaml())
	sec := sections(k.logsUntil("default-runtime", "== end", 90*time.Second))
	if g := gpuNodes(sec["dev"]); len(g) != 1 {
		t.Errorf("GPU nodes %v, want exactly 1 (/dev: %v)", g, sec["dev"])
	}
	if len(sec["probe"]) < 2 || !strings.HasPrefix(sec["probe"][0], "cuda ") || !strings.HasPrefix(sec["probe"][1], "nvml ") {
		t.Errorf("probe should load libcuda.so.1 and libnvidia-ml.so.1 from the injected driver, got %q", sec["probe"])
	}
	// A pod asking for no GPU gets none through the same default runtime.
	k.apply(podSpec{name: "no-gpu", image: probeAll, script: gpuScript}.yaml())
	if g := gpuNodes(sections(k.logsUntil("no-gpu", "== end", 90*time.Second))["dev"]); len(g) != 0 {
		t.Errorf("a pod without a GPU request got %v through the default runtime", g)
	}
}
