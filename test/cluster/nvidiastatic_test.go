package cluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// nvidiaStatic are the device plugin DaemonSets of NVIDIA's k8s-device-plugin
// v0.20.0 deployments/static directory, as testdata/nvidia-static has them:
// written from their documented shape, only the image swapped to Gantry's.
var nvidiaStatic = []struct {
	file, ns   string
	privileged bool
}{
	{"nvidia-device-plugin.yml", "kube-system", false},
	{"nvidia-device-plugin-compat-with-cpumanager.yml", "kube-system", true},
	{"nvidia-device-plugin-privileged-with-service-account.yml", "nvidia-device-plugin", true},
}

// needDefaultRuntime skips unless the node's containerd runs pods without
// runtimeClassName through nvidia (up.sh --set-as-default).
func needDefaultRuntime(t *testing.T) {
	t.Helper()
	cfg, err := os.ReadFile("/etc/gantry-k8s/containerd.toml")
	if err != nil {
		t.Skipf("the node's containerd configuration: %v", err)
	}
	if !regexp.MustCompile(`(?m)^\s*default_runtime_name\s*=\s*["']nvidia["']`).Match(cfg) {
		t.Skip("nvidia is not the node's default runtime: bring the cluster up with test/cluster/up.sh --set-as-default")
	}
}

// withoutGantryPlugin deletes Gantry's own device plugin DaemonSet, as an
// admin trying NVIDIA's manifests would, and puts back the one up.sh
// applied when the test ends.
func withoutGantryPlugin(k *kube) {
	k.t.Helper()
	const applied = "/etc/gantry-k8s/gantry-device-plugin.yaml"
	if _, err := os.Stat(applied); err != nil {
		k.t.Skipf("Gantry's device plugin manifest as up.sh applied it: %v", err)
	}
	n := len(k.hostGPUs())
	k.must("delete", "daemonset", "-n", "kube-system", "gantry", "--wait=true")
	k.eventually(120*time.Second, "Gantry's plugin pods gone", func() string {
		out, _ := k.run("get", "pods", "-n", "kube-system", "-l", "app.kubernetes.io/name=gantry", "-o", "name")
		return strings.TrimSpace(out)
	})
	k.t.Cleanup(func() {
		k.must("apply", "-f", applied)
		k.must("rollout", "status", "daemonset/gantry", "-n", "kube-system", "--timeout=180s")
		k.waitAllocatable(n)
	})
}

// nodeAdaptation is what a manifest gets on this cluster's node besides
// the image, as env entries: on real GPUs only the three NVLink-multicast
// variables every test container carries (NVML through the nvidia runtime). On simulated GPUs, which NVML cannot report, the plugin is told
// the simulated GPUs (GANTRY_GPUS) and where their device nodes are
// (NVIDIA_DEV_ROOT, NVIDIA's own variable for a driver installed under a
// root other than /, which PASS_DEVICE_SPECS answers need): the node's
// fake driver root.
func nodeAdaptation(t *testing.T) []map[string]string {
	t.Helper()
	data, err := os.ReadFile(gantryConfig)
	if err != nil {
		t.Fatal(err)
	}
	// NVLink multicast off, as in every container these tests start (the
	// plugin never uses it; the rule of the shared multi-GPU hosts is for
	// every container alike).
	var env []map[string]string
	for _, e := range noMulticast {
		env = append(env, map[string]string{"name": e[0], "value": e[1]})
	}
	m := regexp.MustCompile(`(?m)^gpus = "(sim:[^"]+)"`).FindSubmatch(data)
	if m == nil {
		return env
	}
	return append(env, map[string]string{"name": "GANTRY_GPUS", "value": string(m[1])}, map[string]string{"name": "NVIDIA_DEV_ROOT", "value": driverRoot(t)})
}

// adapt adds env to the DaemonSet's container in a multi-document manifest
// and returns it as JSON documents, one per line (kubectl reads them).
func adapt(t *testing.T, manifest []byte, env []map[string]string) string {
	t.Helper()
	var out []string
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(manifest), -1) {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj == nil {
			continue
		}
		if obj["kind"] == "DaemonSet" && len(env) > 0 {
			spec := obj["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
			c := spec["containers"].([]any)[0].(map[string]any)
			list, _ := c["env"].([]any)
			for _, e := range env {
				list = append(list, e)
			}
			c["env"] = list
		}
		b, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
	}
	return strings.Join(out, "\n")
}

// runtimeRecords are the lines gantry-runtime logged for the container id.
func runtimeRecords(t *testing.T, id string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(runtimeLogFile)
	if err != nil {
		t.Fatal(err)
	}
	var recs []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if !bytes.Contains(sc.Bytes(), []byte(id)) {
			continue
		}
		var r map[string]any
		if json.Unmarshal(sc.Bytes(), &r) == nil && r["container"] == id {
			recs = append(recs, r)
		}
	}
	return recs
}

// TestNVIDIAStaticDaemonSets: each of NVIDIA's static device plugin
// DaemonSets (v0.20.0), only the image swapped to Gantry's, on a node whose
// default runtime is nvidia and without Gantry's own plugin: the plugin's
// container gets every GPU from the runtime through the image's
// NVIDIA_VISIBLE_DEVICES=all (the unprivileged one as a kubelet plugin by
// construction, named in the runtime's log), the Node advertises the GPUs,
// a pod without runtimeClassName asking for one GPU sees exactly that GPU
// and the driver, and a pod asking for none (its image saying all) sees none.
func TestNVIDIAStaticDaemonSets(t *testing.T) {
	needDefaultRuntime(t)
	k := newKube(t)
	uuids := k.hostGPUs()
	n := len(uuids)
	env := nodeAdaptation(t)
	withoutGantryPlugin(k)
	for _, m := range nvidiaStatic {
		t.Run(m.file, func(t *testing.T) {
			sk := *k
			sk.t = t
			k := &sk
			raw, err := os.ReadFile(filepath.Join("testdata", "nvidia-static", m.file))
			if err != nil {
				t.Fatal(err)
			}
			manifest := adapt(t, raw, env)
			if out, err := k.kubectlStdin(manifest, "apply", "-f", "-"); err != nil {
				t.Fatalf("kubectl apply %s: %v\n%s", m.file, err, out)
			}
			t.Cleanup(func() {
				k.run("delete", "pods", "--all", "-n", k.ns, "--grace-period=0", "--force", "--wait=true")
				if out, err := k.kubectlStdin(manifest, "delete", "-f", "-", "--wait=true", "--timeout=180s"); err != nil {
					t.Errorf("kubectl delete %s: %v\n%s", m.file, err, out)
				}
				k.eventually(120*time.Second, m.file+"'s plugin pods gone", func() string {
					out, _ := k.run("get", "pods", "-n", m.ns, "-l", "name=nvidia-device-plugin-ds", "-o", "name")
					return strings.TrimSpace(out)
				})
			})
			if out, err := k.run("rollout", "status", "daemonset/nvidia-device-plugin-daemonset", "-n", m.ns, "--timeout=180s"); err != nil {
				pods, _ := k.run("describe", "pods", "-n", m.ns, "-l", "name=nvidia-device-plugin-ds")
				logs, _ := k.run("logs", "-n", m.ns, "-l", "name=nvidia-device-plugin-ds", "--tail=40")
				t.Fatalf("%s did not roll out: %v\n%s\n%s\nlogs:\n%s", m.file, err, out, pods, logs)
			}
			k.waitAllocatable(n)

			// The plugin's own container: every GPU, from the runtime.
			var pods struct {
				Items []struct {
					Status struct {
						ContainerStatuses []struct {
							ContainerID string `json:"containerID"`
						} `json:"containerStatuses"`
					} `json:"status"`
				} `json:"items"`
			}
			k.getJSON(&pods, "pods", "-n", m.ns, "-l", "name=nvidia-device-plugin-ds")
			if len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
				t.Fatalf("want one plugin pod with one container: %+v", pods.Items)
			}
			_, id, _ := strings.Cut(pods.Items[0].Status.ContainerStatuses[0].ContainerID, "://")
			recs := runtimeRecords(t, id)
			if len(recs) == 0 {
				t.Fatalf("gantry-runtime logged nothing for the plugin's container %s in %s", id, runtimeLogFile)
			}
			rec := recs[len(recs)-1]
			devs, _ := rec["devices"].([]any)
			notes, _ := json.Marshal(rec["notes"])
			if len(devs) != n {
				t.Errorf("the plugin's container got devices %v from the runtime, want all %d GPUs (record %v)", devs, n, rec)
			}
			rule := strings.Contains(string(notes), "honoured beyond the kubelet's allocation: the container binds /var/lib/kubelet/device-plugins writable")
			if !m.privileged && !rule {
				t.Errorf("the runtime's record for the unprivileged plugin does not name the kubelet-plugin rule: notes %s", notes)
			}
			if m.privileged && rule {
				t.Errorf("a privileged plugin needs no kubelet-plugin rule, yet the record says %s", notes)
			}

			// A pod without runtimeClassName asking for one GPU.
			k.apply(podSpec{name: "one", image: probeImage, gpus: 1, script: gpuScript}.yaml())
			sec := sections(k.logsUntil("one", "== end", 120*time.Second))
			if g := gpuNodes(sec["dev"]); len(g) != 1 {
				t.Errorf("GPU nodes %v, want exactly 1 (/dev: %v)", g, sec["dev"])
			}
			if len(sec["probe"]) < 2 || !strings.HasPrefix(sec["probe"][0], "cuda ") || !strings.HasPrefix(sec["probe"][1], "nvml ") {
				t.Errorf("probe should load libcuda.so.1 and libnvidia-ml.so.1 from the injected driver, got %q", sec["probe"])
			}
			if v := envValue(sec["env"], "NVIDIA_VISIBLE_DEVICES"); !contains(uuids, v) {
				t.Errorf("NVIDIA_VISIBLE_DEVICES=%q in the pod, want one of the node's GPU UUIDs", v)
			}
			// A pod asking for none, its image saying all.
			k.apply(podSpec{name: "none", image: probeAll, script: gpuScript}.yaml())
			if g := gpuNodes(sections(k.logsUntil("none", "== end", 120*time.Second))["dev"]); len(g) != 0 {
				t.Errorf("a pod without a GPU request got %v", g)
			}
			t.Logf("%s: %d nvidia.com/gpu, plugin container %s got %d GPUs (%s), a pod got %s", m.file, n, id[:12], len(devs),
				map[bool]string{true: "kubelet-plugin rule", false: "privileged"}[rule], strconv.Quote(envValue(sec["env"], "NVIDIA_VISIBLE_DEVICES")))
		})
	}
}
