package labels

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestNodeWriter runs the writer against client-go's fake clientset, whose
// object tracker applies strategic merge patches as the API server does.
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
	client := fake.NewSimpleClientset(node)
	w := &NodeWriter{Client: client, NodeName: "gpu-node-1"}

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
		if _, ok := a.(k8stesting.PatchAction); ok {
			t.Errorf("unchanged labels sent a patch: %v", a)
		}
	}
}

func TestNodeWriterErrors(t *testing.T) {
	ctx := context.Background()
	w := &NodeWriter{Client: fake.NewSimpleClientset(), NodeName: "absent"}
	if err := w.Write(ctx, Set{"nvidia.com/gpu.count": "1"}); err == nil || !strings.Contains(err.Error(), "reading node absent") {
		t.Errorf("missing node: error %v", err)
	}
	long := strings.Repeat("x", 64)
	if err := w.Write(ctx, Set{"nvidia.com/gpu.machine": long}); err == nil || !strings.Contains(err.Error(), "nvidia.com/gpu.machine") {
		t.Errorf("over-long value: error %v", err)
	}
	if _, err := NewInClusterNodeWriter(""); err == nil || !strings.Contains(err.Error(), "NODE_NAME") {
		t.Errorf("no node name: error %v", err)
	}
}

func getNode(t *testing.T, c *fake.Clientset) *corev1.Node {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), "gpu-node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
