package draplugin

import (
	"context"
	"encoding/base64"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gantry-gpu/gantry/internal/edits/editstest"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
	"github.com/gantry-gpu/gantry/internal/gpuowner"
	"github.com/gantry-gpu/gantry/internal/kubeapi/kubeapitest"
	"github.com/gantry-gpu/gantry/internal/kubeletckpt"
)

// One GPU, one owner, from the DRA plugin's side. The kubelet's device
// checkpoint (the file a v1.37.2 kubelet wrote with Gantry's device plugin
// offering the 8 simulated H100s) says a device plugin registered every
// GPU: while the Node has nvidia.com/gpu allocatable, the DRA plugin
// publishing GPUs 4-7 is refused, naming them, the resource and the
// settings, with a Warning Event on the Node; once the device plugin has
// gone (allocatable 0), the same start succeeds. A live gantry-device-plugin
// record in the owners directory refuses the overlap the same way, and a
// disjoint set starts beside it.
func TestDRAPluginRefusesDevicePluginGPUs(t *testing.T) {
	sys, err := sim.Load("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, d := range []string{"device-plugins", "plugins_registry", "plugins/gpu.nvidia.com"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ckpt, err := os.ReadFile("../kubeletckpt/testdata/kubelet-v1.37.2.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "device-plugins", kubeletckpt.File), ckpt, 0o644); err != nil {
		t.Fatal(err)
	}
	api := kubeapitest.New(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}})
	cert, key := api.ClientCertificate()
	b64 := base64.StdEncoding.EncodeToString
	kubeconfig := filepath.Join(root, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
current-context: node
contexts:
- {name: node, context: {cluster: local, user: node}}
clusters:
- {name: local, cluster: {server: `+api.URL()+`, certificate-authority-data: `+b64(api.CA())+`}}
users:
- {name: node, user: {client-certificate-data: `+b64(cert)+`, client-key-data: `+b64(key)+`}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfig)

	driver := func(devices string) *Driver {
		d, err := New(Options{NodeName: testNode, System: sys, Inventory: editstest.Inventory(), DevRoot: editstest.MakeDevRoot(t, sys),
			Checkpoint: filepath.Join(root, "plugins/gpu.nvidia.com", CheckpointFile), HookPath: testHook, Devices: devices})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	node := func(gpus int64) *fake.Clientset {
		return fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode},
			Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI)}}})
	}
	f := flags{nodeName: testNode, hostRoot: "/", registryDir: filepath.Join(root, "plugins_registry")}
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()

	_, err = claimGPUs(ctx, f, driver("4,5,6,7"), node(8), log)
	if err == nil {
		t.Fatal("the DRA plugin started on GPUs the kubelet's checkpoint gives the device plugin")
	}
	for _, want := range []string{"GPUs " + sys.Devices[4].UUID + " (index 4), " + sys.Devices[5].UUID + " (index 5)", sys.Devices[7].UUID,
		"already offered by the device plugin of resource nvidia.com/gpu (registered with the kubelet, " + filepath.Join(root, "device-plugins", kubeletckpt.File),
		"gantry-dra-plugin will not offer them too", "disjoint GPUs (gantry-dra-plugin: --devices (GANTRY_DRA_DEVICES); the device plugin of resource nvidia.com/gpu: gantry.devices (GANTRY_DEVICES) if it is gantry-device-plugin)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal does not say %q:\n%v", want, err)
		}
	}
	if evs := api.Events(); len(evs) != 1 || evs[0].Reason != gpuowner.EventReason || evs[0].InvolvedObject.Name != testNode {
		t.Errorf("events %+v, want one %s on the Node", evs, gpuowner.EventReason)
	}

	// The device plugin has gone: its resource has nothing allocatable.
	reg, err := claimGPUs(ctx, f, driver("4,5,6,7"), node(0), log)
	if err != nil {
		t.Fatalf("refused though the Node has no nvidia.com/gpu allocatable: %v", err)
	}
	reg.Release()

	// A live Gantry device plugin in the owners directory, no checkpoint.
	if err := os.Remove(filepath.Join(root, "device-plugins", kubeletckpt.File)); err != nil {
		t.Fatal(err)
	}
	dp, err := gpuowner.Register(filepath.Join(root, gpuowner.DirName), gpuowner.Record{Owner: gpuowner.DevicePlugin,
		GPUs: gpuowner.FromIDs(sys, []string{"0", "1", "2", "3"}), Select: "gantry.devices (GANTRY_DEVICES, --devices)"})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Release()
	if _, err := claimGPUs(ctx, f, driver("3,4"), node(4), log); err == nil ||
		!strings.Contains(err.Error(), "GPU "+sys.Devices[3].UUID+" (index 3) already offered by gantry-device-plugin (pid ") {
		t.Errorf("overlap with the live device plugin: %v", err)
	}
	reg, err = claimGPUs(ctx, f, driver("4,5,6,7"), node(4), log)
	if err != nil {
		t.Fatalf("disjoint GPUs refused: %v", err)
	}
	defer reg.Release()
	if live, _ := gpuowner.Live(filepath.Join(root, gpuowner.DirName)); len(live) != 2 {
		t.Errorf("live owners %+v, want both plugins", live)
	}
}
