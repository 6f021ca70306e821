package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The DRA scenarios run on a cluster brought up with the DRA plugin beside
// the device plugin (test/cluster/up.sh --dra, make e2e-cluster-dra): the
// device plugin offers the first half of the node's GPUs as nvidia.com/gpu,
// the DRA plugin publishes the rest as ResourceSlices of driver
// gpu.nvidia.com. Pods with claims run with no runtime class: the
// kubelet hands the claim's CDI device IDs to containerd, which applies the
// plugin's per-claim spec.

const (
	draDriver = "gpu.nvidia.com"
	draCDIDir = "/var/run/cdi"
)

// newDRA is newCluster for a cluster with the DRA plugin; the test skips
// without it.
func newDRA(t *testing.T) *kube {
	t.Helper()
	k := openKube(t, "gantry-dra", "the cluster runs no DRA plugin: bring it up with test/cluster/up.sh --dra (make e2e-cluster-dra)")
	// The pods go gracefully before newKube's forced deletion: the API
	// server drops a pod only once the kubelet has stopped it and
	// unprepared its claims. A forced deletion drops it at once; the
	// scheduler may then give its device to a new claim before the
	// kubelet has unprepared the old one, and the plugin refuses the
	// device until then (the kubelet retries, after a back-off of up to
	// a minute).
	t.Cleanup(func() {
		uids, _ := k.run("get", "resourceclaims", "-n", k.ns, "-o", "jsonpath={.items[*].metadata.uid}")
		k.run("delete", "pods", "--all", "-n", k.ns, "--wait=true", "--timeout=90s")
		for _, uid := range strings.Fields(uids) {
			k.waitUnprepared(uid)
		}
		k.run("delete", "resourceclaims", "--all", "-n", k.ns, "--wait=true", "--timeout=60s")
	})
	// After a kubelet restart the kubelet deletes the node's slices until
	// the plugin registers again.
	k.eventually(90*time.Second, "the DRA plugin's ResourceSlices", func() string {
		if len(k.draDevices()) == 0 {
			return "no device of " + draDriver + " published for " + nodeName
		}
		return ""
	})
	return k
}

// waitUnprepared waits until the claim's CDI spec is gone: the kubelet has
// unprepared it. (It does so after the pod is gone from the API server;
// until then the plugin refuses the claim's devices to other claims.)
func (k *kube) waitUnprepared(uid string) {
	k.t.Helper()
	k.eventually(90*time.Second, "claim "+uid+" unprepared", func() string {
		if _, err := os.Stat(specPath(uid)); err == nil {
			return specPath(uid) + " is still there"
		}
		return ""
	})
}

// draDevice is one device of the node's ResourceSlices, with the
// attributes the tests read.
type draDevice struct {
	Name, UUID, Type, Product, Arch, Profile, ParentUUID string
	Minor, ParentMinor                                   int
	Memory                                               string
}

// draDevices lists the devices the DRA plugin publishes for the node.
func (k *kube) draDevices() []draDevice {
	k.t.Helper()
	type attr struct {
		String *string `json:"string"`
		Int    *int64  `json:"int"`
	}
	var list struct {
		Items []struct {
			Spec struct {
				Driver   string `json:"driver"`
				NodeName string `json:"nodeName"`
				Devices  []struct {
					Name       string          `json:"name"`
					Attributes map[string]attr `json:"attributes"`
					Capacity   map[string]struct {
						Value string `json:"value"`
					} `json:"capacity"`
				} `json:"devices"`
			} `json:"spec"`
		} `json:"items"`
	}
	k.getJSON(&list, "resourceslices")
	str := func(a map[string]attr, key string) string {
		if v, ok := a[key]; ok && v.String != nil {
			return *v.String
		}
		return ""
	}
	num := func(a map[string]attr, key string) int {
		if v, ok := a[key]; ok && v.Int != nil {
			return int(*v.Int)
		}
		return -1
	}
	var out []draDevice
	for _, s := range list.Items {
		if s.Spec.Driver != draDriver || s.Spec.NodeName != nodeName {
			continue
		}
		for _, d := range s.Spec.Devices {
			out = append(out, draDevice{
				Name: d.Name, UUID: str(d.Attributes, "uuid"), Type: str(d.Attributes, "type"),
				Product: str(d.Attributes, "productName"), Arch: str(d.Attributes, "architecture"), Profile: str(d.Attributes, "profile"),
				ParentUUID: str(d.Attributes, "parentUUID"), Minor: num(d.Attributes, "minor"),
				ParentMinor: num(d.Attributes, "parentMinor"), Memory: d.Capacity["memory"].Value,
			})
		}
	}
	return out
}

func findDevice(devs []draDevice, name string) (draDevice, bool) {
	for _, d := range devs {
		if d.Name == name {
			return d, true
		}
	}
	return draDevice{}, false
}

// claimPod is a pod whose container uses one claim: from a template
// (template set) or an existing ResourceClaim (claim set).
type claimPod struct {
	name, template, claim, script string
}

func (p claimPod) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 0\n", p.name)
	b.WriteString("  resourceClaims:\n  - name: gpu\n")
	if p.template != "" {
		fmt.Fprintf(&b, "    resourceClaimTemplateName: %s\n", p.template)
	} else {
		fmt.Fprintf(&b, "    resourceClaimName: %s\n", p.claim)
	}
	script := p.script
	if script == "" {
		script = gpuScript
	}
	b.WriteString(podSpec{image: probeImage, script: script}.container())
	b.WriteString("    resources:\n      claims:\n      - name: gpu\n")
	return b.String()
}

// claimYAML is a ResourceClaimTemplate (template) or ResourceClaim with one
// request of class for count devices (0: all of them) and a CEL selector
// (none if empty).
func claimYAML(template bool, name, class, cel string, count int) string {
	var b strings.Builder
	ind := "  "
	if template {
		fmt.Fprintf(&b, "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata:\n  name: %s\nspec:\n  spec:\n", name)
		ind = "    "
	} else {
		fmt.Fprintf(&b, "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: %s\nspec:\n", name)
	}
	fmt.Fprintf(&b, "%sdevices:\n%s  requests:\n%s  - name: gpu\n%s    exactly:\n%s      deviceClassName: %s\n", ind, ind, ind, ind, ind, class)
	if count == 0 {
		fmt.Fprintf(&b, "%s      allocationMode: All\n", ind)
	} else {
		fmt.Fprintf(&b, "%s      count: %d\n", ind, count)
	}
	if cel != "" {
		q, _ := json.Marshal(cel)
		fmt.Fprintf(&b, "%s      selectors:\n%s      - cel:\n%s          expression: %s\n", ind, ind, ind, q)
	}
	return b.String()
}

// claimOf is the name of the ResourceClaim behind the pod's claim "gpu"
// (made from a template) once the controller has made it.
func (k *kube) claimOf(pod string) string {
	k.t.Helper()
	var name string
	k.eventually(60*time.Second, "the claim of pod "+pod, func() string {
		out, _ := k.run("get", "pod", "-n", k.ns, pod, "-o", `jsonpath={.status.resourceClaimStatuses[?(@.name=="gpu")].resourceClaimName}`)
		name = strings.TrimSpace(out)
		if name == "" {
			return k.podState(pod)
		}
		return ""
	})
	return name
}

// claim is the part of a ResourceClaim the tests read.
type claim struct {
	Metadata struct {
		UID string `json:"uid"`
	} `json:"metadata"`
	Status struct {
		Allocation *struct {
			Devices struct {
				Results []struct {
					Driver, Pool, Device string
				} `json:"results"`
			} `json:"devices"`
		} `json:"allocation"`
		ReservedFor []struct {
			Name string `json:"name"`
		} `json:"reservedFor"`
	} `json:"status"`
}

func (k *kube) claim(name string) claim {
	k.t.Helper()
	var c claim
	k.getJSON(&c, "resourceclaim", "-n", k.ns, name)
	return c
}

// allocated is the devices of driver gpu.nvidia.com allocated to the claim.
func (c claim) allocated() []string {
	var out []string
	if c.Status.Allocation != nil {
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == draDriver && r.Pool == nodeName {
				out = append(out, r.Device)
			}
		}
	}
	sort.Strings(out)
	return out
}

// specPath is where the plugin writes the claim's CDI spec.
func specPath(uid string) string {
	return draCDIDir + "/k8s." + draDriver + "-claim_" + uid + ".json"
}

// smiUUIDs is the GPU UUIDs the fake (or real) nvidia-smi -L listed.
func smiUUIDs(smi []string) []string {
	var out []string
	for _, l := range smi {
		if m := regexp.MustCompile(`\(UUID: (GPU-[0-9a-f-]+)\)`).FindStringSubmatch(l); m != nil {
			out = append(out, m[1])
		}
	}
	sort.Strings(out)
	return out
}

// checkSeesGPU checks a pod's gpuScript sections: exactly the device nodes
// of want (the GPU itself or a MIG device's parent), nvidia-smi naming
// that GPU, and libcuda loaded from the injected driver.
func checkSeesGPU(t *testing.T, pod string, sec map[string][]string, wantMinor int, wantUUID string) {
	t.Helper()
	if g := gpuNodes(sec["dev"]); len(g) != 1 || g[0] != "nvidia"+strconv.Itoa(wantMinor) {
		t.Errorf("%s: GPU nodes %v, want exactly nvidia%d (/dev: %v)", pod, g, wantMinor, sec["dev"])
	}
	if wantUUID != "" {
		if u := smiUUIDs(sec["smi"]); len(u) != 1 || u[0] != wantUUID {
			t.Errorf("%s: nvidia-smi -L lists %v, want exactly %s (%q)", pod, u, wantUUID, sec["smi"])
		}
	}
	if len(sec["probe"]) < 2 || !strings.HasPrefix(sec["probe"][0], "cuda ") || !strings.HasPrefix(sec["probe"][1], "nvml ") {
		t.Errorf("%s: probe should load libcuda.so.1 and libnvidia-ml.so.1 from the injected driver, got %q", pod, sec["probe"])
	}
	if v := envValue(sec["env"], "NVIDIA_VISIBLE_DEVICES"); v != "void" {
		t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q, want void (the claim's CDI spec sets it)", pod, v)
	}
}

// DRA scenario 1: a ResourceClaimTemplate whose CEL selector asks for the
// product and at least its memory gets one matching GPU of the DRA plugin;
// the pod sees exactly that GPU (its device node and UUID) and loads
// libcuda; the claim's CDI spec is on the node.
func TestDRAClaimSelectsGPUByCEL(t *testing.T) {
	k := newDRA(t)
	devs := k.draDevices()
	var gpus []draDevice
	for _, d := range devs {
		if d.Type == "gpu" {
			gpus = append(gpus, d)
		}
	}
	if len(gpus) == 0 {
		t.Fatalf("the DRA plugin publishes no GPU: %+v", devs)
	}
	product, memory := gpus[0].Product, gpus[0].Memory
	cel := fmt.Sprintf("device.attributes['%s'].productName == %q && device.capacity['%s'].memory.compareTo(quantity(%q)) >= 0",
		draDriver, product, draDriver, memory)
	k.apply(claimYAML(true, "by-cel", "gpu.nvidia.com", cel, 1))
	k.apply(claimPod{name: "cel", template: "by-cel"}.yaml())
	sec := sections(k.logsUntil("cel", "== end", 120*time.Second))
	t.Logf("pod log: %v", sec)

	c := k.claim(k.claimOf("cel"))
	got := c.allocated()
	if len(got) != 1 {
		t.Fatalf("claim allocated %v, want one device of %s", got, draDriver)
	}
	d, ok := findDevice(devs, got[0])
	if !ok || d.Type != "gpu" || d.Product != product {
		t.Fatalf("allocated %s (%+v): not a published GPU of product %q", got[0], d, product)
	}
	checkSeesGPU(t, "cel", sec, d.Minor, d.UUID)
	if _, err := os.Stat(specPath(c.Metadata.UID)); err != nil {
		t.Errorf("the claim's CDI spec: %v", err)
	}
}

// DRA scenario 1b: a ResourceClaimTemplate for 2 GPUs (count 2) whose CEL
// selector asks for a product, its architecture and at least its memory
// gets two matching GPUs; the pod sees exactly their two device nodes and
// UUIDs (nvidia-smi -L), loads libcuda, and with GANTRY_CLUSTER_REAL_GPU
// set runs cuda-check's kernel on each of the two. It needs 2 GPUs of one
// product published by the DRA plugin: on a 2-GPU node the --dra split
// leaves it one, so it skips there; up.sh --dra-only gives it every GPU.
func TestDRAClaimTwoGPUsCEL(t *testing.T) {
	k := newDRA(t)
	devs := k.draDevices()
	byProduct := map[string][]draDevice{}
	var products []string
	for _, d := range devs {
		if d.Type == "gpu" {
			if len(byProduct[d.Product]) == 0 {
				products = append(products, d.Product)
			}
			byProduct[d.Product] = append(byProduct[d.Product], d)
		}
	}
	sort.Slice(products, func(i, j int) bool { return len(byProduct[products[i]]) > len(byProduct[products[j]]) })
	if len(products) == 0 || len(byProduct[products[0]]) < 2 {
		t.Skipf("needs 2 GPUs of one product published by the DRA plugin, it publishes %+v: "+
			"bring the cluster up with test/cluster/up.sh --dra-only (every GPU to the DRA plugin)", devs)
	}
	gpus := byProduct[products[0]]
	product, arch := gpus[0].Product, gpus[0].Arch
	if arch == "" {
		t.Fatalf("the DRA plugin's GPU %s has no architecture attribute: %+v", gpus[0].Name, gpus[0])
	}
	// The least memory of the product's GPUs, so that the selector keeps
	// them all.
	var memory resource.Quantity
	for i, g := range gpus {
		q, err := resource.ParseQuantity(g.Memory)
		if err != nil {
			t.Fatalf("the DRA plugin's GPU %s: memory capacity %q: %v", g.Name, g.Memory, err)
		}
		if i == 0 || q.Cmp(memory) < 0 {
			memory = q
		}
	}
	cel := fmt.Sprintf("device.attributes['%[1]s'].productName == %[2]q && device.attributes['%[1]s'].architecture == %[3]q && "+
		"device.capacity['%[1]s'].memory.compareTo(quantity(%[4]q)) >= 0", draDriver, product, arch, memory.String())
	real := os.Getenv("GANTRY_CLUSTER_REAL_GPU") != ""
	cuda := "cuda-check --load-only"
	if real {
		cuda = "cuda-check"
	}
	script := strings.Replace(gpuScript, "echo '== end'", "echo '== cuda'; "+cuda+"\necho '== end'", 1)
	k.apply(claimYAML(true, "two-by-cel", "gpu.nvidia.com", cel, 2))
	k.apply(claimPod{name: "two", template: "two-by-cel", script: script}.yaml())
	sec := sections(k.logsUntil("two", "== end", 180*time.Second))
	t.Logf("CEL selector: %s; pod log: %v", cel, sec)

	c := k.claim(k.claimOf("two"))
	got := c.allocated()
	if len(got) != 2 {
		t.Fatalf("claim allocated %v, want two devices of %s", got, draDriver)
	}
	var nodes, uuids []string
	for _, name := range got {
		d, ok := findDevice(devs, name)
		if !ok || d.Type != "gpu" || d.Product != product || d.Arch != arch {
			t.Fatalf("allocated %s (%+v): not a published GPU of product %q, architecture %q", name, d, product, arch)
		}
		nodes = append(nodes, "nvidia"+strconv.Itoa(d.Minor))
		uuids = append(uuids, d.UUID)
	}
	sort.Strings(nodes)
	sort.Strings(uuids)
	if nodes[0] == nodes[1] || uuids[0] == uuids[1] {
		t.Fatalf("the claim's two devices are one GPU: %v %v", nodes, uuids)
	}
	if g := gpuNodes(sec["dev"]); !slices.Equal(g, nodes) {
		t.Errorf("GPU nodes %v, want exactly the claim's %v (/dev: %v)", g, nodes, sec["dev"])
	}
	if u := smiUUIDs(sec["smi"]); !slices.Equal(u, uuids) {
		t.Errorf("nvidia-smi -L lists %v, want exactly the claim's %v (%q)", u, uuids, sec["smi"])
	}
	if len(sec["probe"]) < 2 || !strings.HasPrefix(sec["probe"][0], "cuda ") || !strings.HasPrefix(sec["probe"][1], "nvml ") {
		t.Errorf("probe should load libcuda.so.1 and libnvidia-ml.so.1 from the injected driver, got %q", sec["probe"])
	}
	if v := envValue(sec["env"], "NVIDIA_VISIBLE_DEVICES"); v != "void" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want void (the claim's CDI spec sets it)", v)
	}
	cu := sec["cuda"]
	if len(cu) == 0 || !strings.HasPrefix(cu[len(cu)-1], "cuda-check: OK") {
		t.Errorf("%s in the pod: %q, want it to end with cuda-check: OK", cuda, cu)
	}
	if real {
		// One kernel per device, each a GPU of the claim.
		var ran []string
		for _, l := range cu {
			if m := regexp.MustCompile(`^cuda-check: device \d+: .*\(UUID: (GPU-[0-9a-f-]+)\)`).FindStringSubmatch(l); m != nil {
				ran = append(ran, m[1])
			}
		}
		sort.Strings(ran)
		if !slices.Equal(ran, uuids) || !strings.HasPrefix(cu[len(cu)-1], "cuda-check: OK devices=2 ") {
			t.Errorf("cuda-check ran on %v (%q), want the claim's two GPUs %v", ran, cu[len(cu)-1], uuids)
		}
	}
	if _, err := os.Stat(specPath(c.Metadata.UID)); err != nil {
		t.Errorf("the claim's CDI spec: %v", err)
	}
}

// DRA scenario 2: one ResourceClaim used by two pods: one allocation,
// reserved for both, and both pods see the same GPU.
func TestDRASharedClaim(t *testing.T) {
	k := newDRA(t)
	k.apply(claimYAML(false, "shared", "gpu.nvidia.com", "", 1))
	k.apply(claimPod{name: "first", claim: "shared"}.yaml())
	k.apply(claimPod{name: "second", claim: "shared"}.yaml())
	a := sections(k.logsUntil("first", "== end", 120*time.Second))
	b := sections(k.logsUntil("second", "== end", 120*time.Second))
	c := k.claim("shared")
	got := c.allocated()
	if len(got) != 1 {
		t.Fatalf("claim allocated %v, want one device", got)
	}
	d, ok := findDevice(k.draDevices(), got[0])
	if !ok {
		t.Fatalf("allocated %s is not a published device", got[0])
	}
	checkSeesGPU(t, "first", a, d.Minor, d.UUID)
	checkSeesGPU(t, "second", b, d.Minor, d.UUID)
	var users []string
	for _, r := range c.Status.ReservedFor {
		users = append(users, r.Name)
	}
	sort.Strings(users)
	if strings.Join(users, ",") != "first,second" {
		t.Errorf("claim reserved for %v, want first and second", users)
	}
}

// setDRAEnv changes the DRA DaemonSet's environment (kubectl set env
// syntax, NAME=VALUE or NAME- to drop) and waits until the node's
// ResourceSlices list devices that satisfy ready.
func (k *kube) setDRAEnv(ready func([]draDevice) string, env ...string) {
	k.t.Helper()
	k.must(append([]string{"set", "env", "-n", "kube-system", "daemonset/gantry-dra"}, env...)...)
	k.must("rollout", "status", "-n", "kube-system", "daemonset/gantry-dra", "--timeout=120s")
	k.eventually(90*time.Second, "the DRA plugin's ResourceSlices after set env "+strings.Join(env, " "), func() string {
		return ready(k.draDevices())
	})
}

// DRA scenario 3: a claim for a MIG device (class mig.nvidia.com, a
// 1g.5gb profile) on simulated A100s in MIG mode. The node's simulated
// GPUs are H100s, so the DRA plugin is switched to a copy of the
// a100x2-mig profile for this test only, its two GPUs at minors 4 and 5
// (device nodes the node's fake driver root has and the device plugin
// does not offer); it is switched back at the end.
func TestDRAMIGDevice(t *testing.T) {
	k := newDRA(t)
	if !strings.Contains(readFile(t, gantryConfig), `gpus = "sim:`) {
		t.Skip("MIG is tested on simulated GPUs (sim:a100x2-mig); this node has real ones")
	}
	prof, err := os.ReadFile("../../internal/gpu/sim/profiles/a100x2-mig.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The profile with seed a100x2-mig (its UUIDs) and minors 4 and 5.
	var b strings.Builder
	b.WriteString("seed: a100x2-mig\n")
	minor := 4
	for _, l := range strings.Split(string(prof), "\n") {
		b.WriteString(l + "\n")
		if strings.HasPrefix(l, "- name:") {
			fmt.Fprintf(&b, "  minor: %d\n", minor)
			minor++
		}
	}
	file := "/etc/gantry-k8s/dra-a100x2-mig.yaml"
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// The MIG devices' capability nodes, which a MIG-mode driver makes,
	// in the node's fake driver root (it has only config and monitor,
	// nvidia-cap1 and -cap2): with their major, as the driver would.
	m := regexp.MustCompile(`(?m)^driver-root = "(.*)"`).FindStringSubmatch(readFile(t, gantryConfig))
	if m == nil {
		t.Fatalf("no driver-root in %s", gantryConfig)
	}
	caps := m[1] + "/dev/nvidia-caps/"
	var cap1 syscall.Stat_t
	if err := syscall.Stat(caps+"nvidia-cap1", &cap1); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(k.bin, "gantry"), "--gpus", "sim:"+file, "info", "--json").Output()
	if err != nil {
		t.Fatalf("gantry --gpus sim:%s info --json: %v", file, err)
	}
	for _, mm := range regexp.MustCompile(`"(?:gi|ci)CapMinor": *([0-9]+)`).FindAllStringSubmatch(string(out), -1) {
		minor, _ := strconv.Atoi(mm[1])
		p := caps + "nvidia-cap" + mm[1]
		if _, err := os.Stat(p); err == nil {
			continue
		}
		if err := unix.Mknod(p, cap1.Mode, int(unix.Mkdev(unix.Major(cap1.Rdev), uint32(minor)))); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
	var saved struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Env []struct{ Name, Value string } `json:"env"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	k.getJSON(&saved, "daemonset", "-n", "kube-system", "gantry-dra")
	var restore []string
	before := k.draDevices()
	for _, e := range saved.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "GANTRY_GPUS" || e.Name == "GANTRY_DRA_DEVICES" {
			restore = append(restore, e.Name+"="+e.Value)
		}
	}
	t.Cleanup(func() {
		uids, _ := k.run("get", "resourceclaims", "-n", k.ns, "-o", "jsonpath={.items[*].metadata.uid}")
		k.run("delete", "pods", "--all", "-n", k.ns, "--wait=true", "--timeout=90s")
		for _, uid := range strings.Fields(uids) {
			k.waitUnprepared(uid)
		}
		k.setDRAEnv(func(d []draDevice) string {
			if len(d) != len(before) {
				return fmt.Sprintf("%d devices, want the %d of before", len(d), len(before))
			}
			return ""
		}, restore...)
		os.Remove(file)
	})
	k.setDRAEnv(func(d []draDevice) string {
		n := 0
		for _, x := range d {
			if x.Type == "mig" {
				n++
			}
		}
		if n != 10 {
			return fmt.Sprintf("%d MIG devices, want a100x2-mig's 10: %+v", n, d)
		}
		return ""
	}, "GANTRY_GPUS=sim:/host"+file, "GANTRY_DRA_DEVICES-")

	cel := fmt.Sprintf("device.attributes['%s'].profile == '1g.5gb'", draDriver)
	k.apply(claimYAML(true, "mig", "mig.nvidia.com", cel, 1))
	k.apply(claimPod{name: "mig", template: "mig"}.yaml())
	sec := sections(k.logsUntil("mig", "== end", 120*time.Second))
	t.Logf("pod log: %v", sec)
	c := k.claim(k.claimOf("mig"))
	got := c.allocated()
	if len(got) != 1 {
		t.Fatalf("claim allocated %v, want one MIG device", got)
	}
	d, ok := findDevice(k.draDevices(), got[0])
	if !ok || d.Type != "mig" || d.Profile != "1g.5gb" || d.ParentMinor < 4 {
		t.Fatalf("allocated %s (%+v): want a published 1g.5gb MIG device of GPU 4 or 5", got[0], d)
	}
	// The pod has its parent GPU's node and the MIG device's capability
	// nodes, which the spec lists; the spec names the MIG device.
	checkSeesGPU(t, "mig", sec, d.ParentMinor, "")
	spec := readFile(t, specPath(c.Metadata.UID))
	if !strings.Contains(spec, fmt.Sprintf(`"/dev/nvidia%d"`, d.ParentMinor)) || !strings.Contains(spec, "nvidia-caps") {
		t.Errorf("the claim's CDI spec lacks /dev/nvidia%d or the MIG capability nodes:\n%s", d.ParentMinor, spec)
	}
	for _, l := range regexp.MustCompile(`"(/dev/nvidia-caps/nvidia-cap[0-9]+)"`).FindAllStringSubmatch(spec, -1) {
		name := strings.TrimPrefix(l[1], "/dev/")
		out, err := k.run("exec", "-n", k.ns, "mig", "--", "ls", "/dev/"+name)
		if err != nil {
			t.Errorf("the pod lacks %s, which the spec lists: %v %s", l[1], err, out)
		}
	}
}

// DRA scenario 4: a claim no device can satisfy (more memory than any GPU
// has) leaves its pod Pending, unschedulable, with the scheduler's reason
// in the PodScheduled condition and a FailedScheduling event.
func TestDRAUnsatisfiableClaimPending(t *testing.T) {
	k := newDRA(t)
	cel := fmt.Sprintf("device.capacity['%s'].memory.compareTo(quantity('4Ti')) >= 0", draDriver)
	k.apply(claimYAML(true, "huge", "gpu.nvidia.com", cel, 1))
	k.apply(claimPod{name: "huge", template: "huge"}.yaml())
	var msg string
	k.eventually(60*time.Second, "PodScheduled=False, Unschedulable", func() string {
		out, _ := k.run("get", "pod", "-n", k.ns, "huge", "-o",
			`jsonpath={.status.phase}|{.status.conditions[?(@.type=="PodScheduled")].status}|{.status.conditions[?(@.type=="PodScheduled")].reason}|{.status.conditions[?(@.type=="PodScheduled")].message}`)
		f := strings.SplitN(out, "|", 4)
		if len(f) < 4 || f[0] != "Pending" || f[1] != "False" || f[2] != "Unschedulable" {
			return "pod: " + out
		}
		msg = f[3]
		return ""
	})
	t.Logf("the scheduler's reason: %s", msg)
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("PodScheduled message %q does not give the DRA reason (cannot allocate all claims)", msg)
	}
	ev := k.must("get", "events", "-n", k.ns, "--field-selector", "involvedObject.name=huge,reason=FailedScheduling", "-o", "jsonpath={.items[*].message}")
	if !strings.Contains(ev, "cannot allocate all claims") {
		t.Errorf("FailedScheduling events: %q", ev)
	}
	// And it stays so.
	time.Sleep(5 * time.Second)
	if ph := k.must("get", "pod", "-n", k.ns, "huge", "-o", "jsonpath={.status.phase} {.spec.nodeName}"); strings.TrimSpace(ph) != "Pending" {
		t.Errorf("pod after 5 s: %q, want Pending with no node", ph)
	}
	if c := k.claim(k.claimOf("huge")); c.Status.Allocation != nil {
		t.Errorf("the claim is allocated: %v", c.allocated())
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// draPluginLog is the DRA plugin pod's log (all of its runs).
func (k *kube) draPluginLog() string {
	k.t.Helper()
	out, _ := k.run("logs", "-n", "kube-system", "-l", "app.kubernetes.io/name=gantry-dra", "--tail=-1")
	return out
}

// fileID is a file's inode and modification time.
func fileID(t *testing.T, path string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return fmt.Sprintf("inode %d mtime %d.%09d", st.Ino, st.Mtim.Sec, st.Mtim.Nsec)
}

// DRA scenario 5: the kubelet restarts while a pod holds a prepared claim:
// the claim is not prepared again (its spec file keeps its inode and
// mtime, the plugin logs one "prepared" for it), the pod keeps running,
// and new claims are prepared after the restart. Deleting the pod
// unprepares the claim: its CDI spec is removed.
func TestDRAKubeletRestart(t *testing.T) {
	k := newDRA(t)
	k.apply(claimYAML(true, "one", "gpu.nvidia.com", "", 1))
	k.apply(claimPod{name: "keeper", template: "one"}.yaml())
	k.logsUntil("keeper", "== end", 120*time.Second)
	c := k.claim(k.claimOf("keeper"))
	uid := c.Metadata.UID
	spec := specPath(uid)
	id := fileID(t, spec)
	keeperID := k.must("get", "pod", "-n", k.ns, "keeper", "-o", "jsonpath={.status.containerStatuses[0].containerID}")
	prepared := func(uid string) int {
		return len(regexp.MustCompile(`msg=prepared .*uid=`+uid).FindAllString(k.draPluginLog(), -1))
	}
	if n := prepared(uid); n != 1 {
		t.Fatalf("the plugin logged %d \"prepared\" for claim %s before the restart, want 1", n, uid)
	}

	many := len(k.draDevices()) > 1
	restartKubelet(t)
	if many {
		// A new pod with a claim runs: the kubelet is back and talks to the plugin.
		k.apply(claimPod{name: "after", template: "one"}.yaml())
		k.logsUntil("after", "== end", 120*time.Second)
		if n := prepared(k.claim(k.claimOf("after")).Metadata.UID); n != 1 {
			t.Errorf("the claim of a pod started after the restart: %d \"prepared\", want 1", n)
		}
	} else {
		// The keeper holds the only device: wait for the kubelet to
		// answer, and give it time to resync its pods.
		k.eventually(60*time.Second, "the kubelet back", func() string {
			if _, err := k.run("get", "--raw", "/api/v1/nodes/"+nodeName+"/proxy/healthz"); err != nil {
				return err.Error()
			}
			return ""
		})
		time.Sleep(15 * time.Second)
	}
	if n := prepared(uid); n != 1 {
		t.Errorf("after the kubelet restart the plugin logged %d \"prepared\" for the running pod's claim, want 1 (prepared again)", n)
	}
	if got := fileID(t, spec); got != id {
		t.Errorf("the claim's CDI spec was rewritten across the restart: %s, was %s", got, id)
	}
	if st := k.must("get", "pod", "-n", k.ns, "keeper", "-o", "jsonpath={.status.containerStatuses[0].containerID} {.status.phase}"); st != keeperID+" Running" {
		t.Errorf("the running pod was disturbed: %q, was %q Running", st, keeperID)
	}
	if out, err := k.run("exec", "-n", k.ns, "keeper", "--", "sh", "-c", "ls /dev | grep '^nvidia[0-9]'"); err != nil || strings.TrimSpace(out) == "" {
		t.Errorf("the running pod's GPU after the restart: %q %v", out, err)
	}

	k.must("delete", "pod", "-n", k.ns, "keeper", "--wait=true")
	k.eventually(90*time.Second, "the claim's CDI spec removed after the pod's deletion", func() string {
		if _, err := os.Stat(spec); err == nil {
			return spec + " is still there"
		}
		if !regexp.MustCompile(`msg=unprepared .*uid=` + uid).MatchString(k.draPluginLog()) {
			return "no \"unprepared\" for " + uid + " in the plugin's log"
		}
		return ""
	})
}

// DRA scenario 6: the device plugin and the DRA plugin side by side on the
// node, each with its own GPUs: the Node's nvidia.com/gpu and the
// ResourceSlices add up to the node's GPUs with no UUID in both; a pod
// holding every nvidia.com/gpu and a pod whose claim holds every DRA GPU
// run at once and see disjoint GPUs; then neither plugin has a GPU left to
// give.
func TestDRABesideDevicePlugin(t *testing.T) {
	k := newDRA(t)
	host := k.hostGPUs()
	dp, _ := strconv.Atoi(k.allocatable())
	var draUUIDs []string
	for _, d := range k.draDevices() {
		if d.Type == "gpu" {
			draUUIDs = append(draUUIDs, d.UUID)
		}
	}
	if dp == 0 || len(draUUIDs) == 0 {
		t.Skipf("needs both plugins on the node (%d nvidia.com/gpu, %d DRA GPUs; a one-GPU node and up.sh --dra-only run the DRA plugin alone)", dp, len(draUUIDs))
	}
	if dp+len(draUUIDs) != len(host) {
		t.Errorf("%d nvidia.com/gpu + %d DRA GPUs, want the node's %d GPUs", dp, len(draUUIDs), len(host))
	}
	// Every DRA device free (claims of earlier tests deallocated): the
	// scheduler tries a pod it found unschedulable again only on the
	// events it watches for, or after minutes.
	k.eventually(90*time.Second, "no claim allocated on the node", func() string {
		out, _ := k.run("get", "resourceclaims", "-A", "-o", `jsonpath={range .items[?(@.status.allocation)]}{.metadata.namespace}/{.metadata.name} {end}`)
		return strings.TrimSpace(out)
	})
	k.apply(podSpec{name: "dp", image: probeImage, gpus: dp, runtimeClass: true, script: gpuScript}.yaml())
	k.apply(claimYAML(true, "all", "gpu.nvidia.com", "", 0))
	k.apply(claimPod{name: "dra", template: "all"}.yaml())
	a := sections(k.logsUntil("dp", "== end", 120*time.Second))
	b := sections(k.logsUntil("dra", "== end", 120*time.Second))
	dpUUIDs, draSeen := smiUUIDs(a["smi"]), smiUUIDs(b["smi"])
	t.Logf("device plugin pod: %v %v; DRA pod: %v %v", gpuNodes(a["dev"]), dpUUIDs, gpuNodes(b["dev"]), draSeen)
	sort.Strings(draUUIDs)
	if strings.Join(draSeen, ",") != strings.Join(draUUIDs, ",") {
		t.Errorf("the DRA pod sees %v, want the DRA plugin's GPUs %v", draSeen, draUUIDs)
	}
	if len(dpUUIDs) != dp {
		t.Errorf("the device plugin pod sees %v, want %d GPUs", dpUUIDs, dp)
	}
	for _, u := range dpUUIDs {
		if slices.Contains(draUUIDs, u) {
			t.Errorf("GPU %s handed out by both plugins", u)
		}
	}
	for _, n := range gpuNodes(a["dev"]) {
		if slices.Contains(gpuNodes(b["dev"]), n) {
			t.Errorf("/dev/%s in both pods", n)
		}
	}
	// Nothing left: one more GPU from either plugin waits.
	k.apply(podSpec{name: "dp-more", image: probeImage, gpus: 1, runtimeClass: true, script: gpuScript}.yaml())
	k.apply(claimYAML(true, "one", "gpu.nvidia.com", "", 1))
	k.apply(claimPod{name: "dra-more", template: "one"}.yaml())
	for _, p := range []string{"dp-more", "dra-more"} {
		k.eventually(60*time.Second, p+" unschedulable", func() string {
			out, _ := k.run("get", "pod", "-n", k.ns, p, "-o", `jsonpath={.status.phase} {.status.conditions[?(@.type=="PodScheduled")].reason}`)
			if out != "Pending Unschedulable" {
				return "pod: " + out
			}
			return ""
		})
	}
}

// TestDRAPrepareLatencyAndRSS runs last: it reports the plugin's prepare
// time per claim (the "took" of its "prepared" lines over this run's
// claims, p50 and max), the kubelet's NodePrepareResources round trips
// (dra_operations_duration_seconds) and the plugin's resident memory. It
// fails only if there is nothing to measure.
func TestDRAPrepareLatencyAndRSS(t *testing.T) {
	k := newDRA(t)
	// Some claims of its own, one after another, so the figure has a few
	// samples even when run alone.
	const rounds = 8
	k.apply(claimYAML(true, "one", "gpu.nvidia.com", "", 1))
	for i := range rounds {
		name := fmt.Sprintf("p%d", i)
		k.apply(claimPod{name: name, template: "one", script: "echo '== end'; sleep 3600"}.yaml())
		k.logsUntil(name, "== end", 120*time.Second)
		uid := k.claim(k.claimOf(name)).Metadata.UID
		k.must("delete", "pod", "-n", k.ns, name, "--wait=true")
		k.waitUnprepared(uid)
	}
	var took []time.Duration
	for _, m := range regexp.MustCompile(`msg=prepared .* took=([0-9.]+[µmn]?s)`).FindAllStringSubmatch(k.draPluginLog(), -1) {
		d, err := time.ParseDuration(strings.Replace(m[1], "µ", "u", 1))
		if err == nil {
			took = append(took, d)
		}
	}
	if len(took) < rounds {
		t.Fatalf("%d \"prepared ... took=\" lines in the plugin's log, want at least %d", len(took), rounds)
	}
	slices.Sort(took)
	t.Logf("plugin prepare time over %d claims: p50 %v, max %v", len(took), took[len(took)/2], took[len(took)-1])

	metrics := k.must("get", "--raw", "/api/v1/nodes/"+nodeName+"/proxy/metrics")
	var sum, count float64
	for _, l := range strings.Split(metrics, "\n") {
		if !strings.Contains(l, `operation_name="PrepareResources"`) {
			continue
		}
		f := strings.Fields(l)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		switch {
		case strings.HasPrefix(l, "dra_operations_duration_seconds_sum"):
			sum += v
		case strings.HasPrefix(l, "dra_operations_duration_seconds_count"):
			count += v
		}
	}
	if count > 0 {
		t.Logf("kubelet PrepareResources (dra_operations_duration_seconds): %v calls, mean %.1f ms", count, 1000*sum/count)
	}

	pid := 0
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		b, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err == nil && strings.HasPrefix(string(b), "gantry-dra-plugin\x00") {
			pid, _ = strconv.Atoi(d.Name())
		}
	}
	if pid == 0 {
		t.Fatal("no gantry-dra-plugin process on this host")
	}
	status := readFile(t, fmt.Sprintf("/proc/%d/status", pid))
	if m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindStringSubmatch(status); m != nil {
		kb, _ := strconv.Atoi(m[1])
		t.Logf("gantry-dra-plugin RSS: %.1f MiB (pid %d)", float64(kb)/1024, pid)
	} else {
		t.Errorf("no VmRSS in /proc/%d/status", pid)
	}
}

// draCheckpoint is the DRA plugin's checkpoint on the node.
const draCheckpoint = "/var/lib/kubelet/plugins/" + draDriver + "/checkpoint.json"

// preparedSharing is the part of the checkpoint that records what prepare
// applied to a claim's devices.
type preparedSharing struct {
	Strategy string   `json:"strategy"`
	GPUs     []string `json:"gpus"`
	Interval string   `json:"interval"`
	MPS      *struct {
		Dir   string   `json:"dir"`
		UUIDs []string `json:"uuids"`
	} `json:"mps"`
}

// sharingOf reads the plugin's checkpoint for what prepare applied to the
// claim of uid (nil when it is not prepared).
func sharingOf(t *testing.T, uid string) ([]preparedSharing, bool) {
	t.Helper()
	var cp struct {
		Claims map[string]struct {
			Sharing []preparedSharing `json:"sharing"`
		} `json:"claims"`
	}
	if err := json.Unmarshal([]byte(readFile(t, draCheckpoint)), &cp); err != nil {
		t.Fatalf("%s: %v", draCheckpoint, err)
	}
	c, ok := cp.Claims[uid]
	return c.Sharing, ok
}

// withConfig adds an opaque configuration of the driver, NVIDIA's GpuConfig
// with sharing (JSON), to a claimYAML ResourceClaim.
func withConfig(claimYAML, sharing string) string {
	return claimYAML + fmt.Sprintf("    config:\n    - opaque:\n        driver: %s\n        parameters: {\"apiVersion\": \"resource.nvidia.com/v1beta1\", \"kind\": \"GpuConfig\", \"sharing\": %s}\n", draDriver, sharing)
}

// computeMode is the GPU's compute mode by the host's nvidia-smi (real
// GPUs only).
func computeMode(t *testing.T, uuid string) string {
	out, err := exec.Command("nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader", "-i", uuid).CombinedOutput()
	if err != nil {
		t.Errorf("nvidia-smi --query-gpu=compute_mode -i %s: %v: %s", uuid, err, out)
	}
	return strings.TrimSpace(string(out))
}

// DRA sharing, MPS (NVIDIA's GpuConfig sharing.strategy MPS): one claim
// shared by two pods at once. The plugin runs one MPS control daemon for
// the claim, with the claim's defaults (50% of the threads, 4 GiB of
// pinned memory per client); both pods get CUDA_MPS_PIPE_DIRECTORY and
// the daemon's pipe and shm directories mounted, and reach the daemon (it
// answers them its default thread percentage). With real GPUs both run a
// CUDA kernel through it at once, each held to the limit, the GPU is in
// EXCLUSIVE_PROCESS while the claim is prepared and DEFAULT after. Deleting
// the pods unprepares the claim: the daemon's directory goes.
func TestDRAMPSSharedClaim(t *testing.T) {
	k := newDRA(t)
	real := os.Getenv("GANTRY_CLUSTER_REAL_GPU") != ""
	cuda := "cuda-check --load-only"
	if real {
		cuda = "cuda-check --mem 2048,6144 --hold 20"
	}
	script := `exec 2>&1
echo '== mps'; echo "pipe=$CUDA_MPS_PIPE_DIRECTORY"
echo "threads=$(echo get_default_active_thread_percentage | nvidia-cuda-mps-control)"
awk '$5 == "/tmp/nvidia-mps" || $5 == "/dev/shm" { print "mount", $5, $4, $6 }' /proc/self/mountinfo
echo '== cuda'; ` + cuda + `
echo '== end'; sleep 3600`
	k.apply(withConfig(claimYAML(false, "mps", "gpu.nvidia.com", "", 1),
		`{"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "4Gi"}}`))
	k.apply(claimPod{name: "mps-a", claim: "mps", script: script}.yaml())
	k.apply(claimPod{name: "mps-b", claim: "mps", script: script}.yaml())
	logs := map[string]map[string][]string{}
	for _, p := range []string{"mps-a", "mps-b"} {
		logs[p] = sections(k.logsUntil(p, "== end", 180*time.Second))
		t.Logf("%s: %v", p, logs[p])
	}
	c := k.claim("mps")
	uid := c.Metadata.UID
	got := c.allocated()
	if len(got) != 1 {
		t.Fatalf("claim allocated %v, want one device", got)
	}
	d, _ := findDevice(k.draDevices(), got[0])
	sh, ok := sharingOf(t, uid)
	if !ok || len(sh) != 1 || sh[0].MPS == nil || len(sh[0].MPS.UUIDs) != 1 || sh[0].MPS.UUIDs[0] != d.UUID {
		t.Fatalf("the checkpoint records %+v (prepared %v) for the claim, want one MPS daemon for %s", sh, ok, d.UUID)
	}
	dir := sh[0].MPS.Dir
	if _, err := os.Stat(filepath.Join(dir, "pipe", "control")); err != nil {
		t.Errorf("the daemon's control socket on the node: %v", err)
	}
	for p, sec := range logs {
		m := sec["mps"]
		if !slices.Contains(m, "pipe=/tmp/nvidia-mps") {
			t.Errorf("%s: CUDA_MPS_PIPE_DIRECTORY: %q, want /tmp/nvidia-mps", p, m)
		}
		if !slices.Contains(m, "threads=50.0") {
			t.Errorf("%s: the daemon answered %q, want threads=50.0 (the claim's defaultActiveThreadPercentage)", p, m)
		}
		mounts, opts := map[string]string{}, map[string]string{}
		for _, l := range m {
			if f := strings.Fields(l); len(f) == 4 && f[0] == "mount" {
				mounts[f[1]], opts[f[1]] = f[2], f[3]
			}
		}
		// Clients only connect to the daemon's sockets: the pipe directory
		// is read-only to them, so no client plants a link where the
		// daemon (root, in the host's root) creates its files.
		if o := opts["/tmp/nvidia-mps"]; !slices.Contains(strings.Split(o, ","), "ro") {
			t.Errorf("%s: /tmp/nvidia-mps is mounted %q, want read-only", p, o)
		}
		// The mount's root in its file system: the host path, or its tail
		// when /var/lib/kubelet is a file system of its own.
		if r := mounts["/tmp/nvidia-mps"]; r == "" || !strings.HasSuffix(dir+"/pipe", r) {
			t.Errorf("%s: /tmp/nvidia-mps is %q, want the daemon's pipe directory %s/pipe", p, r, dir)
		}
		if r := mounts["/dev/shm"]; r == "" || !strings.HasSuffix(dir+"/shm", r) {
			t.Errorf("%s: /dev/shm is %q, want the daemon's shm directory %s/shm", p, r, dir)
		}
		if cu := sec["cuda"]; len(cu) == 0 || !strings.HasPrefix(cu[len(cu)-1], "cuda-check: OK") {
			t.Errorf("%s: %s: %q, want it to end with cuda-check: OK", p, cuda, cu)
		}
		if real {
			out := strings.Join(sec["cuda"], "\n")
			if !strings.Contains(out, "alloc 2048 MiB: ok") || strings.Contains(out, "alloc 6144 MiB: ok") {
				t.Errorf("%s: want 2048 MiB allocated and 6144 MiB refused (the claim's 4Gi limit): %q", p, sec["cuda"])
			}
		}
	}
	if real {
		if st, err := os.Stat(filepath.Join(dir, "log", "server.log")); err != nil || st.Size() == 0 {
			t.Errorf("no MPS server log (%v): the pods did not go through the claim's daemon", err)
		}
		if m := computeMode(t, d.UUID); m != "Exclusive_Process" {
			t.Errorf("compute mode %q while the MPS claim is prepared, want Exclusive_Process", m)
		}
	}

	k.must("delete", "pods", "-n", k.ns, "mps-a", "mps-b", "--wait=true")
	k.waitUnprepared(uid)
	k.eventually(60*time.Second, "the MPS daemon's directory removed", func() string {
		if _, err := os.Stat(dir); err == nil {
			return dir + " is still there"
		}
		return ""
	})
	if real {
		if m := computeMode(t, d.UUID); m != "Default" {
			t.Errorf("compute mode %q after unprepare, want Default", m)
		}
	}
}

// DRA sharing, time-slicing (NVIDIA's GpuConfig sharing.strategy
// TimeSlicing, interval Long): the pod runs on its GPU, the checkpoint
// records the interval applied to it, and unprepare forgets it (with real
// GPUs the host's nvidia-smi shows the policy; logged).
func TestDRATimeSlicingLong(t *testing.T) {
	k := newDRA(t)
	k.apply(withConfig(claimYAML(false, "ts-long", "gpu.nvidia.com", "", 1),
		`{"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}`))
	k.apply(claimPod{name: "ts", claim: "ts-long"}.yaml())
	sec := sections(k.logsUntil("ts", "== end", 120*time.Second))
	c := k.claim("ts-long")
	got := c.allocated()
	if len(got) != 1 {
		t.Fatalf("claim allocated %v, want one device", got)
	}
	d, _ := findDevice(k.draDevices(), got[0])
	checkSeesGPU(t, "ts", sec, d.Minor, d.UUID)
	sh, ok := sharingOf(t, c.Metadata.UID)
	if !ok || len(sh) != 1 || sh[0].Strategy != "TimeSlicing" || sh[0].Interval != "Long" || !slices.Equal(sh[0].GPUs, []string{d.UUID}) {
		t.Errorf("the checkpoint records %+v (prepared %v), want time-slicing Long on %s", sh, ok, d.UUID)
	}
	if os.Getenv("GANTRY_CLUSTER_REAL_GPU") != "" {
		out, err := exec.Command("nvidia-smi", "compute-policy", "--list", "-i", d.UUID).CombinedOutput()
		t.Logf("nvidia-smi compute-policy --list -i %s (%v):\n%s", d.UUID, err, out)
		if m := computeMode(t, d.UUID); m != "Default" {
			t.Errorf("compute mode %q under time-slicing, want Default", m)
		}
	}
	k.must("delete", "pod", "-n", k.ns, "ts", "--wait=true")
	k.waitUnprepared(c.Metadata.UID)
	if _, ok := sharingOf(t, c.Metadata.UID); ok {
		t.Error("the claim is still in the checkpoint after unprepare")
	}
}

// imexScript is gpuScript with the IMEX channel nodes the container has.
const imexScript = `exec 2>&1
echo '== imex'; ls -1 /dev/nvidia-caps-imex-channels
echo '== dev'; ls -1 /dev
echo '== probe'; probe
echo '== env'; env | grep '^NVIDIA_' | sort
echo '== end'; sleep 3600`

// DRA scenario: NVIDIA's quickstart IMEX spec (imex-test1), written here in
// its shape: a ResourceClaim "deployment0-imex-channel" whose one request
// "channel" asks for exactly one device of class imex.nvidia.com, a
// ResourceClaimTemplate "node-gpus" of class gpu.nvidia.com, and a
// Deployment of 2 replicas whose container uses both (image swapped for
// the probe). Both replicas share the one IMEX channel the claim was
// allocated (an imex-channel-N device of the node) and see exactly that
// channel's node, each with a GPU of its own. The simulated node has two
// channels (up.sh --dra makes them).
func TestDRAIMEXChannel(t *testing.T) {
	k := newDRA(t)
	var chans []string
	for _, d := range k.draDevices() {
		if d.Type == "imex-channel" {
			chans = append(chans, d.Name)
		}
	}
	if len(chans) == 0 {
		t.Skip("the node has no IMEX channel (/dev/nvidia-caps-imex-channels): up.sh --dra makes two on simulated GPUs")
	}
	script, _ := json.Marshal(imexScript)
	k.apply(`apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: deployment0-imex-channel
spec:
  devices:
    requests:
    - name: channel
      exactly:
        deviceClassName: imex.nvidia.com
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: node-gpus
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: deployment0
  labels:
    app: imex-test1-deployment0
spec:
  replicas: 2
  selector:
    matchLabels:
      app: deployment0
  template:
    metadata:
      labels:
        app: deployment0
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: ctr
        image: ` + probeImage + `
        imagePullPolicy: Never
        command: ["sh", "-c", ` + string(script) + `]
` + multicastOffEnv("        ") + `        resources:
          claims:
          - name: gpus
          - name: imex-channel
      resourceClaims:
      - name: gpus
        resourceClaimTemplateName: node-gpus
      - name: imex-channel
        resourceClaimName: deployment0-imex-channel
`)
	t.Cleanup(func() { k.run("delete", "deployment", "-n", k.ns, "deployment0", "--wait=true", "--timeout=60s") })
	var pods []string
	k.eventually(120*time.Second, "the Deployment's 2 pods", func() string {
		out, _ := k.run("get", "pods", "-n", k.ns, "-l", "app=deployment0", "-o", "jsonpath={.items[*].metadata.name}")
		pods = strings.Fields(out)
		if len(pods) != 2 {
			return fmt.Sprintf("pods %v", pods)
		}
		return ""
	})
	got := k.claim("deployment0-imex-channel").allocated()
	if len(got) != 1 || !strings.HasPrefix(got[0], "imex-channel-") {
		t.Fatalf("the IMEX claim was allocated %v, want one imex-channel-N of %v", got, chans)
	}
	want := "channel" + strings.TrimPrefix(got[0], "imex-channel-")
	for _, pod := range pods {
		sec := sections(k.logsUntil(pod, "== end", 180*time.Second))
		if strings.Join(sec["imex"], ",") != want {
			t.Errorf("%s: /dev/nvidia-caps-imex-channels has %v, want exactly %s (the claim's %s)", pod, sec["imex"], want, got[0])
		}
		if g := gpuNodes(sec["dev"]); len(g) != 1 {
			t.Errorf("%s: GPU nodes %v, want one (its node-gpus claim)", pod, g)
		}
		if len(sec["probe"]) < 1 || !strings.HasPrefix(sec["probe"][0], "cuda ") {
			t.Errorf("%s: libcuda should load from the GPU claim's driver files: %q", pod, sec["probe"])
		}
	}
}
