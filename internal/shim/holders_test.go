package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/request"
)

// The pod of the kubelet checkpoint in internal/kubeletckpt/testdata (a
// v1.37.2 kubelet's file, Gantry's device plugin on the 8 simulated
// H100s): container "a" holds GPUs 0 and 1, "init" GPU 0, "b" GPUs 4-6.
const heldPod = "75463ae5-18b4-4611-8d69-002e103c9c78"

// criAnnotations are containerd's annotations on a kubelet's container.
func criAnnotations(pod, container string) map[string]string {
	return map[string]string{request.AnnotationContainerdType: "container", request.AnnotationContainerdPodUID: pod,
		request.AnnotationContainerdContainer: container}
}

// TestGPUHeldByAnotherPod: the runtime refuses a container a GPU that the
// kubelet's device checkpoint (the real file format) or a DRA plugin's
// prepared claim gives to another pod while that pod runs (a real runc
// container in the pod's kubepods cgroup), naming the GPU and the other
// pod and container; a free GPU, the holder's own pod, and the same GPU
// once the holder has stopped all go through.
func TestGPUHeldByAnotherPod(t *testing.T) {
	kdir := t.TempDir()
	ckpt, err := os.ReadFile("../kubeletckpt/testdata/kubelet-v1.37.2.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"device-plugins", "plugins/gpu.nvidia.com"} {
		if err := os.MkdirAll(filepath.Join(kdir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(kdir, "device-plugins", "kubelet_internal_checkpoint"), ckpt, 0o644); err != nil {
		t.Fatal(err)
	}
	// A claim (gantry-dra-plugin's checkpoint format) of the same running
	// pod on GPU 3.
	if err := os.WriteFile(filepath.Join(kdir, "plugins/gpu.nvidia.com/checkpoint.json"), []byte(`{"version": 1, "driver": "gpu.nvidia.com",
 "claims": {"claim-uid-1": {"namespace": "ml", "name": "train", "spec": "/var/run/cdi/x.json",
  "devices": [{"pool": "n", "device": "gpu-3", "uuid": "GPU-652cae4c-ac33-9254-c7d3-251f6a8efab1", "cdiDeviceIDs": ["k8s.gpu.nvidia.com/claim=x"]}],
  "pods": [{"name": "trainer", "uid": "`+heldPod+`"}]}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("kubelet-dir = %q\nkubernetes-env = \"any\"\n", kdir)

	// The holding pod's container, in its pod's cgroup as the kubelet
	// names it (cgroupfs driver), below a cgroup of this test's own.
	top := fmt.Sprintf("gantry-test-holders-%d", os.Getpid())
	holder := newContainer(t, opts{args: []string{"busybox", "sleep", "600"}})
	var spec ocispecs.Spec
	if err := json.Unmarshal(holder.configJSON(), &spec); err != nil {
		t.Fatal(err)
	}
	spec.Linux.CgroupsPath = "/" + top + "/kubepods/besteffort/pod" + heldPod + "/holder"
	b, _ := json.Marshal(&spec)
	if err := os.WriteFile(filepath.Join(holder.bundle, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroups(top) })
	if _, e, err := holder.runtime("create", "--bundle", holder.bundle, holder.id); err != nil {
		t.Fatalf("holder create: %v\n%s", err, e)
	}
	t.Cleanup(func() { holder.runtime("delete", "--force", holder.id) })
	if _, e, err := holder.runtime("start", holder.id); err != nil {
		t.Fatalf("holder start: %v\n%s", err, e)
	}

	gpuCtr := func(devices, pod, container string) (string, error) {
		c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=" + devices}, args: []string{"true"}, config: conf,
			annotations: criAnnotations(pod, container)})
		out, stderr, err := c.run()
		return out + stderr, err
	}
	for _, tc := range []struct {
		devices, want string
	}{
		{"0", "GPU GPU-4f91bcb3-3e48-9102-8e22-ab4a3e0c4bce (index 0) is held by running pod " + heldPod + " container "},
		{"2,5", "GPU GPU-bc697928-9d1c-5b36-5712-291c411b6f0e (index 5) is held by running pod " + heldPod + " container b (nvidia.com/gpu in the kubelet's device checkpoint " + kdir},
		{"3", "GPU GPU-652cae4c-ac33-9254-c7d3-251f6a8efab1 (index 3) is held by running pod ml/trainer (uid " + heldPod + ") (DRA claim ml/train (uid claim-uid-1) prepared by gpu.nvidia.com"},
	} {
		out, err := gpuCtr(tc.devices, "other-pod", "cuda")
		if err == nil || !strings.Contains(out, tc.want) || !strings.Contains(out, "refusing to give it to pod other-pod container cuda") {
			t.Errorf("GPUs %s for another pod: %v, want a refusal saying %q:\n%s", tc.devices, err, tc.want, out)
		}
	}
	if out, err := gpuCtr("2,7", "other-pod", "cuda"); err != nil {
		t.Errorf("free GPUs 2 and 7 refused: %v\n%s", err, out)
	}
	if out, err := gpuCtr("0,1,3", heldPod, "a"); err != nil {
		t.Errorf("the holding pod's own GPUs refused to it: %v\n%s", err, out)
	}
	// Privileged, holding nothing (a plugin's DaemonSet): trusted.
	c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, args: []string{"true"}, config: conf, privileg: true,
		annotations: criAnnotations("plugin-pod", "plugin")})
	if out, stderr, err := c.run(); err != nil {
		t.Errorf("privileged all: %v\n%s%s", err, out, stderr)
	}

	// Unprivileged, but binding the kubelet's device-plugins directory
	// (NVIDIA's static DaemonSet), with no allocation: a plugin by
	// construction, trusted the same way.
	c = newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, args: []string{"true"},
		config:      strings.Replace(conf, `kubernetes-env = "any"`, `kubernetes-env = "allocated"`, 1),
		annotations: criAnnotations("plugin-pod", "plugin"),
		mounts: []ocispecs.Mount{{Destination: "/var/lib/kubelet/device-plugins", Type: "bind",
			Source: filepath.Join(kdir, "device-plugins"), Options: []string{"rbind", "rw"}}}})
	if out, stderr, err := c.run(); err != nil {
		t.Errorf("unprivileged plugin pod, all: %v\n%s%s", err, out, stderr)
	}

	// The holder stops: its records are stale, the GPUs free.
	if _, e, err := holder.runtime("delete", "--force", holder.id); err != nil {
		t.Fatalf("holder delete: %v\n%s", err, e)
	}
	if out, err := gpuCtr("0,3,5", "other-pod", "cuda"); err != nil {
		t.Errorf("GPUs of a pod that no longer runs refused: %v\n%s", err, out)
	}
	// runtime.exclusive-gpus = false turns the check off.
	holder2 := strings.Replace(conf, "kubernetes-env", "exclusive-gpus = false\nkubernetes-env", 1)
	c = newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"true"}, config: holder2,
		annotations: criAnnotations("other-pod", "cuda")})
	if out, stderr, err := c.run(); err != nil {
		t.Errorf("exclusive-gpus = false: %v\n%s%s", err, out, stderr)
	}
}

// removeCgroups removes the cgroup directories named top (v2, or under
// each v1 controller), deepest first.
func removeCgroups(top string) {
	var dirs []string
	for _, base := range append([]string{"/sys/fs/cgroup"}, globs("/sys/fs/cgroup/*")...) {
		filepath.WalkDir(filepath.Join(base, top), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		os.Remove(dirs[i])
	}
}

func globs(p string) []string {
	m, _ := filepath.Glob(p)
	return m
}
