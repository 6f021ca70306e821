package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// kube is a handle on the live cluster for one test: kubectl with the
// cluster's kubeconfig, and a namespace of the test's own that is deleted
// (with its pods, so their GPUs are free again) when the test ends.
type kube struct {
	t          *testing.T
	bin        string // bin/cluster
	kubeconfig string
	ns         string
}

const (
	nodeName     = "gantry-node"
	gantryConfig = "/etc/gantry-k8s/gantry.toml"
	probeImage   = "localhost/gantry-k8s/probe:1"
	probeAll     = "localhost/gantry-k8s/probe-all:1"
	criSocket    = "/run/gantry-k8s/containerd.sock"
)

// newKube is newCluster for a test of the device plugin: it skips on a
// cluster that runs none (up.sh --dra-only, or --dra on a one-GPU node,
// where the DRA plugin has every GPU).
func newKube(t *testing.T) *kube {
	t.Helper()
	return openKube(t, "gantry", "the cluster runs no device plugin (up.sh --dra-only, or --dra on a one-GPU node: the DRA plugin has every GPU); "+
		"the device plugin scenarios need test/cluster/up.sh without --dra-only")
}

// newCluster is newKube for a test that needs no device plugin: it runs
// on a cluster of any mode.
func newCluster(t *testing.T) *kube {
	t.Helper()
	return openKube(t, "", "")
}

// openKube connects to the live cluster and makes the test's namespace;
// the test skips with why when kube-system has no DaemonSet named
// daemonSet (none asked for when empty).
func openKube(t *testing.T, daemonSet, why string) *kube {
	t.Helper()
	if os.Getenv("GANTRY_CLUSTER") == "" {
		t.Skip("no live cluster: GANTRY_CLUSTER is not set (make e2e-cluster brings one up and runs these tests)")
	}
	bin := os.Getenv("GANTRY_CLUSTER_BIN")
	if bin == "" {
		abs, err := filepath.Abs("../../bin/cluster")
		if err != nil {
			t.Fatal(err)
		}
		bin = abs
	}
	kc := os.Getenv("KUBECONFIG")
	if kc == "" {
		kc = "/etc/gantry-k8s/admin.conf"
	}
	k := &kube{t: t, bin: bin, kubeconfig: kc}
	if daemonSet != "" {
		if _, err := k.run("get", "daemonset", "-n", "kube-system", daemonSet); err != nil {
			t.Skip(why)
		}
	}
	k.ns = "e2e-" + strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-"))
	if len(k.ns) > 50 {
		k.ns = k.ns[:50]
	}
	k.ns = strings.TrimRight(k.ns, "-")
	k.run("delete", "namespace", k.ns, "--ignore-not-found", "--wait=true")
	k.must("create", "namespace", k.ns)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := k.run("get", "pods,events", "-n", k.ns, "-o", "wide")
			t.Logf("namespace %s at the end:\n%s", k.ns, out)
		}
		k.run("delete", "pods", "--all", "-n", k.ns, "--grace-period=0", "--force", "--wait=true")
		k.run("delete", "namespace", k.ns, "--wait=false")
	})
	return k
}

// run is kubectl ARGS; it returns stdout (stderr appended on failure).
func (k *kube) run(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(k.bin, "kubectl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+k.kubeconfig)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String() + errb.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func (k *kube) must(args ...string) string {
	k.t.Helper()
	out, err := k.run(args...)
	if err != nil {
		k.t.Fatal(err)
	}
	return out
}

// apply applies a manifest in the test's namespace. A manifest with a
// container lacking noMulticast's environment is refused (the test fails).
func (k *kube) apply(manifest string) {
	k.t.Helper()
	if err := checkMulticastOff(manifest); err != nil {
		k.t.Fatalf("%v\n%s", err, manifest)
	}
	cmd := exec.Command(filepath.Join(k.bin, "kubectl"), "apply", "-n", k.ns, "-f", "-")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+k.kubeconfig)
	cmd.Stdin = strings.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		k.t.Fatalf("kubectl apply: %v\n%s\n%s", err, out, manifest)
	}
}

// getJSON is kubectl get ARGS -o json, decoded into v.
func (k *kube) getJSON(v any, args ...string) {
	k.t.Helper()
	out := k.must(append(append([]string{"get"}, args...), "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		k.t.Fatalf("kubectl get %v: %v", args, err)
	}
}

// eventually polls f every half second until it returns "" (done) or the
// timeout passes, then fails with f's last answer.
func (k *kube) eventually(timeout time.Duration, what string, f func() string) {
	k.t.Helper()
	end := time.Now().Add(timeout)
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(end) {
			k.t.Fatalf("%s: not after %v: %s", what, timeout, msg)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// logsUntil waits for the pod's log to contain marker and returns the log.
func (k *kube) logsUntil(pod, marker string, timeout time.Duration) string {
	k.t.Helper()
	var log string
	k.eventually(timeout, "pod "+pod+" log shows "+marker, func() string {
		out, err := k.run("logs", "-n", k.ns, pod)
		if err != nil {
			return err.Error() + "; " + k.podState(pod)
		}
		log = out
		if !strings.Contains(out, marker) {
			return "log so far: " + out + "; " + k.podState(pod)
		}
		return ""
	})
	return log
}

// podState is a pod's phase and container states, for messages.
func (k *kube) podState(pod string) string {
	out, _ := k.run("get", "pod", "-n", k.ns, pod, "-o",
		"jsonpath={.status.phase} {.status.containerStatuses[*].state}")
	return "pod " + pod + ": " + out
}

// noMulticast is the environment of every container the tests start:
// NVLink multicast (NVLS) off for NCCL, PyTorch's symmetric memory and
// NVSHMEM. On the shared multi-GPU hosts the cluster runs on, a program
// that uses multicast can take the host's GPUs out of service for a day
// (issue 29). podSpec's containers carry it; hand-written manifests add
// multicastOffEnv; apply refuses a manifest with a container without it.
var noMulticast = [][2]string{
	{"NCCL_NVLS_ENABLE", "0"},
	{"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"},
	{"NVSHMEM_DISABLE_NVLS", "1"},
}

// multicastOffEnv is a container's env: list of noMulticast, its keys
// indented by ind (the indentation of the container's name:, image:).
func multicastOffEnv(ind string) string {
	var b strings.Builder
	b.WriteString(ind + "env:\n")
	for _, e := range noMulticast {
		fmt.Fprintf(&b, "%s- name: %s\n%s  value: %q\n", ind, e[0], ind, e[1])
	}
	return b.String()
}

// checkMulticastOff fails a manifest in which some document has more
// containers (image: lines) than settings of any of noMulticast's
// variables to their value.
func checkMulticastOff(manifest string) error {
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(manifest, -1) {
		images := len(regexp.MustCompile(`(?m)^\s*(- )?image:`).FindAllString(doc, -1))
		if images == 0 {
			continue
		}
		for _, e := range noMulticast {
			re := regexp.MustCompile(`(?m)^\s*- name: ` + e[0] + `\n\s*value: "?` + e[1] + `"?\s*$`)
			if n := len(re.FindAllString(doc, -1)); n < images {
				return fmt.Errorf("a manifest with %d containers sets %s=%s in %d: every container the tests start must have "+
					"NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 (NVLink multicast off; "+
					"podSpec adds them, multicastOffEnv writes them)", images, e[0], e[1], n)
			}
		}
	}
	return nil
}

type podSpec struct {
	name, image  string
	gpus         int  // nvidia.com/gpu limit; 0 for none
	runtimeClass bool // runtimeClassName: nvidia
	script       string
	restart      string // restartPolicy, default Never
}

func (p podSpec) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\nspec:\n", p.name)
	restart := p.restart
	if restart == "" {
		restart = "Never"
	}
	fmt.Fprintf(&b, "  restartPolicy: %s\n  terminationGracePeriodSeconds: 0\n", restart)
	if p.runtimeClass {
		b.WriteString("  runtimeClassName: nvidia\n")
	}
	b.WriteString(p.container())
	return b.String()
}

// container is the pod spec's containers list.
func (p podSpec) container() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  containers:\n  - name: main\n    image: %s\n    imagePullPolicy: Never\n", p.image)
	script, _ := json.Marshal(p.script)
	fmt.Fprintf(&b, "    command: [\"sh\", \"-c\", %s]\n", script)
	b.WriteString(multicastOffEnv("    "))
	if p.gpus > 0 {
		fmt.Fprintf(&b, "    resources:\n      limits:\n        nvidia.com/gpu: %d\n", p.gpus)
	}
	return b.String()
}

// gpuScript is what GPU test pods run (busybox sh): the /dev entries, the
// probe's dlopen of libcuda.so.1 and libnvidia-ml.so.1 by SONAME (the image
// has neither: what loads, Gantry put there), the injected nvidia-smi's GPU
// list and the NVIDIA_ environment, each under a "== name" header. It ends
// with "== end" and then sleeps, so the pod holds its GPUs until deleted.
const gpuScript = `exec 2>&1
echo '== dev'; ls -1 /dev
echo '== probe'; probe
echo '== smi'; nvidia-smi -L
echo '== env'; env | grep '^NVIDIA_' | sort
echo '== end'; sleep 3600`

// sections splits gpuScript's output by its headers.
func sections(out string) map[string][]string {
	sec := map[string][]string{}
	name := ""
	for _, line := range strings.Split(out, "\n") {
		if h, ok := strings.CutPrefix(line, "== "); ok {
			name = h
			sec[name] = []string{}
			continue
		}
		if line != "" {
			sec[name] = append(sec[name], line)
		}
	}
	return sec
}

var gpuNodeRE = regexp.MustCompile(`^nvidia[0-9]+$`)

// gpuNodes lists the /dev/nvidiaN names among dev entries.
func gpuNodes(dev []string) []string {
	var out []string
	for _, n := range dev {
		if gpuNodeRE.MatchString(n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// node is the part of the Node object the tests read.
type node struct {
	Metadata struct {
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Status struct {
		Capacity    map[string]string `json:"capacity"`
		Allocatable map[string]string `json:"allocatable"`
	} `json:"status"`
}

func (k *kube) node() node {
	k.t.Helper()
	var n node
	k.getJSON(&n, "node", nodeName)
	return n
}

// hostGPUs is the GPUs Gantry sees on the node (the cluster's own
// configuration: simulated or real), by UUID.
func (k *kube) hostGPUs() []string {
	k.t.Helper()
	cmd := exec.Command(filepath.Join(k.bin, "gantry"), "--config", gantryConfig, "info", "--json")
	out, err := cmd.Output()
	if err != nil {
		k.t.Fatalf("gantry info --json: %v", err)
	}
	var info struct {
		Devices []struct {
			UUID string `json:"uuid"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		k.t.Fatalf("gantry info --json: %v\n%s", err, out)
	}
	var uuids []string
	for _, g := range info.Devices {
		uuids = append(uuids, g.UUID)
	}
	if len(uuids) == 0 {
		k.t.Fatalf("gantry info --json lists no GPU:\n%s", out)
	}
	return uuids
}

// pluginGPUs are the host's GPUs the device plugin offers: every GPU, or
// under up.sh --dra the ones its DaemonSet's GANTRY_DEVICES names (indexes
// or UUIDs), the DRA plugin having the rest.
func (k *kube) pluginGPUs() []string {
	k.t.Helper()
	host := k.hostGPUs()
	sel, _ := k.run("get", "daemonset", "-n", "kube-system", "gantry", "-o",
		`jsonpath={.spec.template.spec.containers[0].env[?(@.name=="GANTRY_DEVICES")].value}`)
	if sel = strings.TrimSpace(sel); sel == "" {
		return host
	}
	var out []string
	for _, f := range strings.Split(sel, ",") {
		f = strings.TrimSpace(f)
		if i, err := strconv.Atoi(f); err == nil && i >= 0 && i < len(host) {
			out = append(out, host[i])
		} else if contains(host, f) {
			out = append(out, f)
		}
	}
	return out
}

// pluginPod is the device plugin DaemonSet's running pod: name and IP.
func (k *kube) pluginPod() (name, ip string) {
	k.t.Helper()
	var list struct {
		Items []struct {
			Metadata struct {
				Name              string  `json:"name"`
				DeletionTimestamp *string `json:"deletionTimestamp"`
			} `json:"metadata"`
			Status struct {
				PodIP string `json:"podIP"`
				Phase string `json:"phase"`
			} `json:"status"`
		} `json:"items"`
	}
	k.getJSON(&list, "pods", "-n", "kube-system", "-l", "app.kubernetes.io/name=gantry")
	for _, p := range list.Items {
		if p.Metadata.DeletionTimestamp == nil && p.Status.Phase == "Running" {
			return p.Metadata.Name, p.Status.PodIP
		}
	}
	k.t.Fatalf("no running device plugin pod in kube-system: %+v", list.Items)
	return "", ""
}

// allocatable is the Node's allocatable nvidia.com/gpu ("" when absent).
func (k *kube) allocatable() string {
	out, _ := k.run("get", "node", nodeName, "-o", `jsonpath={.status.allocatable.nvidia\.com/gpu}`)
	return out
}

// TestPodManifestsTurnMulticastOff needs no cluster: every container of
// the harness's pod manifests (device plugin pods, claim pods, the Job of
// TestPendingUntilGPUsFree's shape) has noMulticast's variables in its
// env as YAML reads it, and apply's check refuses manifests where a
// container lacks one or sets another value.
func TestPodManifestsTurnMulticastOff(t *testing.T) {
	job := "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: j\nspec:\n  template:\n    spec:\n" +
		strings.Replace(strings.ReplaceAll(podSpec{image: probeImage, gpus: 2, script: "true"}.container(), "\n  ", "\n      "), "  containers:", "      containers:", 1)
	for name, m := range map[string]string{
		"podSpec":  podSpec{name: "p", image: probeImage, gpus: 2, runtimeClass: true, script: gpuScript}.yaml(),
		"claimPod": claimPod{name: "c", template: "t"}.yaml(),
		"job":      job,
	} {
		if err := checkMulticastOff(m); err != nil {
			t.Errorf("%s: %v\n%s", name, err, m)
		}
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(m), &obj); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, m)
		}
		spec := obj["spec"].(map[string]any)
		if tmpl, ok := spec["template"].(map[string]any); ok {
			spec = tmpl["spec"].(map[string]any)
		}
		containers, _ := spec["containers"].([]any)
		if len(containers) != 1 {
			t.Fatalf("%s: containers %v", name, spec["containers"])
		}
		env := map[string]any{}
		for _, e := range containers[0].(map[string]any)["env"].([]any) {
			env[e.(map[string]any)["name"].(string)] = e.(map[string]any)["value"]
		}
		for _, e := range noMulticast {
			if env[e[0]] != e[1] {
				t.Errorf("%s: the container's env has %s=%v, want %q (env %v)", name, e[0], env[e[0]], e[1], env)
			}
		}
	}

	bare := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: a\n    image: x\n"
	two := bare + multicastOffEnv("    ") + "  - name: b\n    image: x\n"
	other := strings.Replace(bare+multicastOffEnv("    "), `value: "0"`, `value: "1"`, 1)
	for name, m := range map[string]string{"no env": bare, "one of two containers": two, "NCCL_NVLS_ENABLE=1": other,
		"second document": "apiVersion: v1\nkind: ConfigMap\n---\n" + bare} {
		if err := checkMulticastOff(m); err == nil {
			t.Errorf("%s: checkMulticastOff accepts\n%s", name, m)
		}
	}
	if err := checkMulticastOff("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n"); err != nil {
		t.Errorf("a manifest without containers: %v", err)
	}
}
