package labels

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gantry-gpu/gantry/internal/kubeapi/kubeapitest"
)

// TestNodeWriter runs the writer against an in-memory API server that
// applies strategic merge patches with the API server's own code.
func TestNodeWriter(t *testing.T) {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: "gpu-node-1",
		Labels: map[string]string{
			"kubernetes.io/hostname":       "gpu-node-1",
			"nvidia.com/mig.config":        "all-1g.5gb", // the user's: never touched
			"nvidia.com/gpu.deploy.dcgm":   "true",       // the GPU operator's
			"nvidia.com/gpu.present":       "true",       // set by hand
			"nvidia.com/mig-7g.40gb.count": "1",          // left by GFD: ours now
			"nvidia.com/gfd.timestamp":     "1594644571",
		},
	}}
	client := kubeapitest.New(t, node)
	w := &NodeWriter{Client: client.Client(), NodeName: "gpu-node-1"}

	sys := load(t, "a100x2-mig")
	first, err := Generate(sys, Config{MIGStrategy: MIGMixed}, ForSystem(sys, ""))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, first); err != nil {
		t.Fatal(err)
	}
	got := getNode(t, client)
	for k, v := range first {
		if got.Labels[k] != v {
			t.Errorf("after first write: %s = %q, want %q", k, got.Labels[k], v)
		}
	}
	for _, k := range []string{"nvidia.com/mig-7g.40gb.count", "nvidia.com/gfd.timestamp"} {
		if _, ok := got.Labels[k]; ok {
			t.Errorf("stale GFD label %s kept", k)
		}
	}
	for _, k := range []string{"kubernetes.io/hostname", "nvidia.com/mig.config", "nvidia.com/gpu.deploy.dcgm"} {
		if _, ok := got.Labels[k]; !ok {
			t.Errorf("label %s of someone else removed", k)
		}
	}

	// Switching to strategy none drops every mig-* and the mig.strategy label.
	second, err := Generate(sys, Config{}, ForSystem(sys, ""))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, second); err != nil {
		t.Fatal(err)
	}
	got = getNode(t, client)
	for k := range got.Labels {
		if strings.HasPrefix(k, "nvidia.com/mig-") || k == "nvidia.com/mig.strategy" {
			t.Errorf("label %s survived the switch to MIG strategy none", k)
		}
	}
	if got.Annotations[OwnedAnnotation] != strings.Join(second.Keys(), ",") {
		t.Errorf("owned annotation = %q", got.Annotations[OwnedAnnotation])
	}

	// No GPUs any more: our nvidia.com/gpu.present goes too (we wrote it).
	if err := w.Write(ctx, Set{"nvidia.com/vgpu.present": "false"}); err != nil {
		t.Fatal(err)
	}
	got = getNode(t, client)
	want := map[string]string{
		"kubernetes.io/hostname":     "gpu-node-1",
		"nvidia.com/mig.config":      "all-1g.5gb",
		"nvidia.com/gpu.deploy.dcgm": "true",
		"nvidia.com/vgpu.present":    "false",
	}
	if len(got.Labels) != len(want) {
		t.Errorf("labels = %v, want %v", got.Labels, want)
	}
	for k, v := range want {
		if got.Labels[k] != v {
			t.Errorf("%s = %q, want %q", k, got.Labels[k], v)
		}
	}

	// An unchanged set sends no patch.
	client.ClearActions()
	if err := w.Write(ctx, Set{"nvidia.com/vgpu.present": "false"}); err != nil {
		t.Fatal(err)
	}
	for _, a := range client.Actions() {
		if strings.HasPrefix(a, "PATCH ") {
			t.Errorf("unchanged labels sent a patch: %v", a)
		}
	}
}

func TestNodeWriterErrors(t *testing.T) {
	ctx := context.Background()
	w := &NodeWriter{Client: kubeapitest.New(t).Client(), NodeName: "absent"}
	if err := w.Write(ctx, Set{"nvidia.com/gpu.count": "1"}); err == nil || !strings.Contains(err.Error(), "reading node absent") {
		t.Errorf("missing node: error %v", err)
	}
	long := strings.Repeat("x", 64)
	if err := w.Write(ctx, Set{"nvidia.com/gpu.machine": long}); err == nil || !strings.Contains(err.Error(), "nvidia.com/gpu.machine") {
		t.Errorf("over-long value: error %v", err)
	}
	if _, err := NewNodeWriter(""); err == nil || !strings.Contains(err.Error(), "NODE_NAME") {
		t.Errorf("no node name: error %v", err)
	}
}

func getNode(t *testing.T, s *kubeapitest.Server) *corev1.Node {
	t.Helper()
	n := s.Node("gpu-node-1")
	if n == nil {
		t.Fatal("node gpu-node-1 gone")
	}
	return n
}

// TestLabelChecks: the writer's own key and value checks agree with the API
// server's (k8s.io/apimachinery's validation), which the binary no longer
// links.
func TestLabelChecks(t *testing.T) {
	long63, long64 := strings.Repeat("a", 63), strings.Repeat("a", 64)
	keys := []string{
		"nvidia.com/gpu.count", "nvidia.com/mig-1g.10gb.count", "gpu", "a/b", "A.com/x", "nvidia.com/",
		"/x", "a/b/c", "-a.com/x", "a-.com/x", "a..com/x", "nvidia.com/-x", "nvidia.com/x_", "nvidia.com/x.y_z-1",
		"nvidia.com/" + long63, "nvidia.com/" + long64, strings.Repeat("a.", 126) + "a/x", strings.Repeat("a.", 127) + "a/x",
		"nvidia.com/x y", "nvidia.com/ü", "", "x_y", "_x", "1.2/3",
	}
	for _, k := range keys {
		want := len(validation.IsQualifiedName(k)) == 0
		if got := checkKey(k) == nil; got != want {
			t.Errorf("key %q: ours valid=%v (%v), the API server's valid=%v %v", k, got, checkKey(k), want, validation.IsQualifiedName(k))
		}
	}
	values := []string{"", "true", "NVIDIA-H100-80GB-HBM3", "1g.10gb", long63, long64, "-x", "x-", "a b", "a/b", "x_y.z", "_"}
	for _, v := range values {
		want := len(validation.IsValidLabelValue(v)) == 0
		if got := checkValue(v) == nil; got != want {
			t.Errorf("value %q: ours valid=%v (%v), the API server's valid=%v", v, got, checkValue(v), want)
		}
	}
}
