package cluster

import (
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

// Scenarios for an admin switching from NVIDIA's device plugin: NVIDIA's
// config keys, its imex section, its cdi-* strategies with the plugin's
// own CDI spec, its per-node configs, and CUDA images' NVIDIA_VISIBLE_DEVICES=all.

// everyNVIDIAKey is a config with every key of NVIDIA's documented config
// examples (device plugin README and api/config/v1, v0.20.0), written here
// from the documented format: the flags, the plugin and GFD sections,
// time-slicing with failRequestsGreaterThanOne, and imex with
// required: false on a node without IMEX channels. (sharing.mps is the
// other sharing mode, exclusive with time-slicing: TestMPS covers it.)
const everyNVIDIAKey = `version: v1
flags:
  migStrategy: "none"
  failOnInitError: true
  nvidiaDriverRoot: "/"
  mpsRoot: "/run/nvidia/mps"
  gdrcopyEnabled: false
  gdsEnabled: false
  mofedEnabled: false
  useNodeFeatureAPI: false
  deviceDiscoveryStrategy: "auto"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: "envvar"
    deviceIDStrategy: "uuid"
    cdiAnnotationPrefix: "cdi.k8s.io/"
    nvidiaCTKPath: "/usr/bin/nvidia-ctk"
    containerDriverRoot: "/driver-root"
    sharedDevicesAllocationPolicy: "distributed"
  gfd:
    oneshot: false
    noTimestamp: false
    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd
    sleepInterval: 60s
    machineTypeFile: /sys/class/dmi/id/product_name
resources:
  gpus:
  - pattern: "*"
    name: gpu
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 2
imex:
  channelIDs: [0]
  required: false
`

// pluginConfig is the plugin ConfigMap's config.yaml, and a function that
// sets it (then restarts the plugin's pod), restored when the test ends.
func pluginConfig(k *kube) (orig string, set func(string)) {
	k.t.Helper()
	var cm struct {
		Data map[string]string `json:"data"`
	}
	k.getJSON(&cm, "configmap", "-n", "kube-system", "gantry-config")
	orig = cm.Data["config.yaml"]
	if orig == "" {
		k.t.Fatalf("configmap gantry-config has no config.yaml: %v", cm.Data)
	}
	set = func(conf string) {
		k.t.Helper()
		patch, _ := json.Marshal(map[string]any{"data": map[string]string{"config.yaml": conf}})
		k.must("patch", "configmap", "-n", "kube-system", "gantry-config", "--type", "merge", "-p", string(patch))
		plugin, _ := k.pluginPod()
		k.must("delete", "pod", "-n", "kube-system", plugin, "--wait=true")
	}
	k.t.Cleanup(func() {
		set(orig)
		k.waitAllocatable(len(k.hostGPUs()))
	})
	return orig, set
}

// gantrySection is the cluster's own gantry: section of a config (the
// simulated GPUs), to append to a config written here.
func gantrySection(t *testing.T, conf string) string {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(conf), &m); err != nil {
		t.Fatalf("the plugin's config: %v", err)
	}
	if m["gantry"] == nil {
		return ""
	}
	b, err := yaml.Marshal(map[string]any{"gantry": m["gantry"]})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (k *kube) waitAllocatable(n int) {
	k.t.Helper()
	k.eventually(120*time.Second, "allocatable nvidia.com/gpu "+strconv.Itoa(n), func() string {
		if a := k.allocatable(); a != strconv.Itoa(n) {
			return "allocatable " + a
		}
		return ""
	})
}

func (k *kube) pluginLogs() string {
	k.t.Helper()
	name, _ := k.pluginPod()
	out, _ := k.run("logs", "-n", "kube-system", name)
	return out
}

// TestNVIDIAConfigEveryKey: a config with every key of NVIDIA's documented
// examples runs with the image swapped only: the plugin starts (its imex
// section, required: false, on a node without channels, is a warning), the
// Node shows the time-sliced replicas, a pod gets its GPU, and
// failRequestsGreaterThanOne refuses a pod asking for two.
func TestNVIDIAConfigEveryKey(t *testing.T) {
	k := newKube(t)
	n := len(k.hostGPUs())
	orig, set := pluginConfig(k)
	set(everyNVIDIAKey + gantrySection(t, orig))
	k.waitAllocatable(2 * n)
	if logs := k.pluginLogs(); !strings.Contains(logs, "IMEX channel 0") {
		t.Errorf("the plugin's log does not say that IMEX channel 0 is not handed out:\n%s", logs)
	}
	k.apply(podSpec{name: "one", image: probeImage, gpus: 1, runtimeClass: true, script: gpuScript}.yaml())
	sec := sections(k.logsUntil("one", "== end", 90*time.Second))
	if g := gpuNodes(sec["dev"]); len(g) != 1 {
		t.Errorf("GPU nodes %v, want 1", g)
	}
	// Pod one's replica goes back first: with one GPU (2 replicas) the
	// pod asking for two would otherwise wait unscheduled, never reaching
	// the plugin that refuses it.
	k.must("delete", "pod", "-n", k.ns, "one", "--grace-period=1", "--wait=true", "--timeout=120s")
	k.apply(podSpec{name: "two", image: probeImage, gpus: 2, runtimeClass: true, script: gpuScript}.yaml())
	k.eventually(60*time.Second, "the pod asking for 2 replicas refused", func() string {
		if s := k.podState("two"); !strings.Contains(s, "Failed") {
			return "state " + s
		}
		return ""
	})
}

// TestImageAllReadsItsGPU: a pod asking for one GPU whose image sets
// NVIDIA_VISIBLE_DEVICES=all (as CUDA images do) sees that GPU only, and
// the variable reads that GPU's UUID, once, as under NVIDIA's stack.
func TestImageAllReadsItsGPU(t *testing.T) {
	k := newKube(t)
	k.apply(podSpec{name: "all", image: probeAll, gpus: 1, runtimeClass: true, script: gpuScript}.yaml())
	sec := sections(k.logsUntil("all", "== end", 90*time.Second))
	if g := gpuNodes(sec["dev"]); len(g) != 1 {
		t.Errorf("GPU nodes %v, want 1", g)
	}
	var vis []string
	for _, l := range sec["env"] {
		if v, ok := strings.CutPrefix(l, "NVIDIA_VISIBLE_DEVICES="); ok {
			vis = append(vis, v)
		}
	}
	if len(vis) != 1 || !contains(k.hostGPUs(), vis[0]) {
		t.Errorf("NVIDIA_VISIBLE_DEVICES in the pod: %q, want exactly one entry, the GPU's UUID (env %v)", vis, sec["env"])
	}
}

// driverRoot is the cluster node's driver root (its gantry.toml).
func driverRoot(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(gantryConfig)
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^driver-root = "([^"]*)"`).FindSubmatch(data); m != nil {
		return string(m[1])
	}
	return "/"
}

// patchPlugin applies a JSON patch to the plugin's DaemonSet and rolls it
// back when the test ends.
func patchPlugin(k *kube, ops []map[string]any) {
	k.t.Helper()
	b, _ := json.Marshal(ops)
	k.must("patch", "daemonset", "-n", "kube-system", "gantry", "--type", "json", "-p", string(b))
	k.t.Cleanup(func() {
		k.must("rollout", "undo", "daemonset/gantry", "-n", "kube-system")
		k.must("rollout", "status", "daemonset/gantry", "-n", "kube-system", "--timeout=120s")
	})
	if out, err := k.run("rollout", "status", "daemonset/gantry", "-n", "kube-system", "--timeout=240s"); err != nil {
		pods, _ := k.run("describe", "pods", "-n", "kube-system", "-l", "app.kubernetes.io/name=gantry")
		k.t.Fatalf("the patched plugin DaemonSet did not roll out: %v\n%s\n%s", err, out, pods)
	}
}

func addEnv(name, value string) map[string]any {
	return map[string]any{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": map[string]string{"name": name, "value": value}}
}

// TestPluginWritesCDISpec: with deviceListStrategy cdi-cri, as in NVIDIA's
// files, the plugin writes its own CDI spec into the host's /var/run/cdi
// (no gantry cdi generate), a pod without Gantry's runtime class gets its
// GPU and the driver through containerd's CDI support, and the spec is
// removed when the plugin goes back to envvar.
func TestPluginWritesCDISpec(t *testing.T) {
	k := newKube(t)
	n := len(k.hostGPUs())
	const specFile = "/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"
	os.Remove(specFile)
	orig, set := pluginConfig(k)
	root := driverRoot(t)
	patchPlugin(k, []map[string]any{
		// The host's driver root under /host (HOST_ROOT), not all of /:
		// a private / cannot be mounted with HostToContainer propagation.
		{"op": "add", "path": "/spec/template/spec/volumes/-", "value": map[string]any{"name": "host-root", "hostPath": map[string]string{"path": root}}},
		{"op": "add", "path": "/spec/template/spec/volumes/-", "value": map[string]any{"name": "cdi-root", "hostPath": map[string]string{"path": "/var/run/cdi", "type": "DirectoryOrCreate"}}},
		{"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-", "value": map[string]any{"name": "host-root", "mountPath": filepath.Join("/host", root), "readOnly": true}},
		{"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-", "value": map[string]any{"name": "cdi-root", "mountPath": "/var/run/cdi"}},
		addEnv("HOST_ROOT", "/host"),
		addEnv("GANTRY_CDI_HOOK_PATH", filepath.Join(k.bin, "gantry-cdi-hook")),
	})
	conf := "version: v1\nflags:\n  nvidiaDriverRoot: " + strconv.Quote(root) + "\n  plugin:\n    deviceListStrategy: cdi-cri\n" + gantrySection(t, orig)
	set(conf)
	k.waitAllocatable(n)
	k.eventually(60*time.Second, specFile, func() string {
		if _, err := os.Stat(specFile); err != nil {
			return err.Error()
		}
		return ""
	})
	k.apply(podSpec{name: "cdi", image: probeImage, gpus: 1, script: gpuScript}.yaml())
	sec := sections(k.logsUntil("cdi", "== end", 90*time.Second))
	if g := gpuNodes(sec["dev"]); len(g) != 1 {
		t.Errorf("GPU nodes %v, want 1 (/dev %v)", g, sec["dev"])
	}
	if len(sec["probe"]) < 1 || !strings.HasPrefix(sec["probe"][0], "cuda ") {
		t.Errorf("probe should load libcuda.so.1 from the driver the spec mounts, got %q", sec["probe"])
	}
	k.must("delete", "pod", "-n", k.ns, "cdi", "--grace-period=0", "--force", "--wait=true")
	set(orig)
	k.eventually(60*time.Second, specFile+" removed by the plugin that wrote it", func() string {
		if _, err := os.Stat(specFile); err == nil {
			return "still there"
		}
		return ""
	})
}

// TestPerNodeConfigLabel: NVIDIA's per-node configs without its
// config-manager sidecar: a ConfigMap of named configs, the plugin told
// CONFIG_FILE_SRCDIR and DEFAULT_CONFIG; labelling the Node
// nvidia.com/device-plugin.config=sliced switches it live to the
// time-sliced config; a label naming no config goes back to the default
// with a Warning Event naming the valid names.
func TestPerNodeConfigLabel(t *testing.T) {
	k := newKube(t)
	n := len(k.hostGPUs())
	var cm struct {
		Data map[string]string `json:"data"`
	}
	k.getJSON(&cm, "configmap", "-n", "kube-system", "gantry-config")
	g := gantrySection(t, cm.Data["config.yaml"])
	k.must("create", "configmap", "gantry-configs", "-n", "kube-system",
		"--from-literal=default=version: v1\n"+g,
		"--from-literal=sliced=version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 3\n"+g)
	t.Cleanup(func() {
		k.run("label", "node", nodeName, "nvidia.com/device-plugin.config-")
		k.run("delete", "configmap", "-n", "kube-system", "gantry-configs")
	})
	patchPlugin(k, []map[string]any{
		{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": []string{"--kubelet-dir=/var/lib/kubelet/device-plugins"}},
		{"op": "add", "path": "/spec/template/spec/volumes/-", "value": map[string]any{"name": "configs", "configMap": map[string]string{"name": "gantry-configs"}}},
		{"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-", "value": map[string]any{"name": "configs", "mountPath": "/available-configs"}},
		addEnv("CONFIG_FILE_SRCDIR", "/available-configs"),
		addEnv("DEFAULT_CONFIG", "default"),
	})
	k.waitAllocatable(n)
	k.must("label", "node", nodeName, "nvidia.com/device-plugin.config=sliced", "--overwrite")
	k.waitAllocatable(3 * n)
	k.must("label", "node", nodeName, "nvidia.com/device-plugin.config=no-such-config", "--overwrite")
	k.waitAllocatable(n)
	k.eventually(60*time.Second, "a ConfigLabelInvalid Event naming the valid names", func() string {
		out, _ := k.run("get", "events", "-n", "default", "--field-selector", "reason=ConfigLabelInvalid", "-o", "jsonpath={.items[*].message}")
		if !strings.Contains(out, "no-such-config") || !strings.Contains(out, "valid names: default, sliced") {
			return "events: " + out
		}
		return ""
	})
}
