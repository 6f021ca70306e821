package deviceplugin

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gantry-gpu/gantry/internal/gpuowner"
	"github.com/gantry-gpu/gantry/internal/kubeapi/kubeapitest"
)

// One GPU, one owner: with a live DRA plugin recording GPUs 4-7 of the node
// in the owners directory (the kubelet root's gantry-gpu-owners), the
// device plugin offering all 8 refuses to start, naming the GPUs, the DRA
// plugin and the settings, posts a Warning Event on the Node and never
// registers; with gantry.devices 0-3 it serves those four through the
// kubelet's real gRPC API and records them, and its record goes when it
// stops.
func TestDevicePluginRefusesDRAGPUs(t *testing.T) {
	root := shortTempDir(t)
	kdir := filepath.Join(root, "device-plugins")
	if err := os.Mkdir(kdir, 0o755); err != nil {
		t.Fatal(err)
	}
	owners := filepath.Join(root, gpuowner.DirName)
	sys := loadSim(t, "h100x8")
	var draGPUs []gpuowner.GPU
	for _, d := range sys.Devices[4:] {
		draGPUs = append(draGPUs, gpuowner.GPU{UUID: d.UUID, Index: strconv.Itoa(d.Index)})
	}
	dra, err := gpuowner.Register(owners, gpuowner.Record{Owner: gpuowner.DRAPlugin, GPUs: draGPUs, Select: "--devices (GANTRY_DRA_DEVICES)"})
	if err != nil {
		t.Fatal(err)
	}
	defer dra.Release()

	s := kubeapitest.New(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1"}})
	cert, key := s.ClientCertificate()
	b64 := base64.StdEncoding.EncodeToString
	kubeconfig := filepath.Join(root, "kubelet.conf")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
current-context: node
contexts:
- {name: node, context: {cluster: local, user: node}}
clusters:
- {name: local, cluster: {server: `+s.URL()+`, certificate-authority-data: `+b64(s.CA())+`}}
users:
- {name: node, user: {client-certificate-data: `+b64(cert)+`, client-key-data: `+b64(key)+`}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"NODE_NAME": "gpu-node-1", "KUBECONFIG": kubeconfig}
	getenv := func(k string) string { return env[k] }
	k := startKubelet(t, kdir)
	args := []string{"--gpus=sim:h100x8", "--kubelet-dir=" + kdir, "--sim-health-socket=" + filepath.Join(root, "h.sock"), "--log-level=error"}

	var out, errb syncBuffer
	// Bounded, so that a plugin that does not refuse ends the test.
	rctx, rcancel := context.WithTimeout(context.Background(), waitFor)
	code := run(rctx, args, getenv, &out, &errb)
	rcancel()
	if code != 1 {
		t.Fatalf("overlapping GPUs: exit %d, want 1 (%s)", code, errb.String())
	}
	msg := errb.String()
	for _, want := range []string{"GPUs " + draGPUs[0].String() + ", " + draGPUs[1].String(), draGPUs[3].UUID,
		"already offered by gantry-dra-plugin (pid ", "gantry-device-plugin will not offer them too",
		"disjoint GPUs (gantry-device-plugin: gantry.devices (GANTRY_DEVICES, --devices); gantry-dra-plugin: --devices (GANTRY_DRA_DEVICES))"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal does not say %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, sys.Devices[0].UUID) {
		t.Errorf("refusal names GPU 0, which the DRA plugin does not have:\n%s", msg)
	}
	evs := s.Events()
	if len(evs) != 1 || evs[0].Reason != gpuowner.EventReason || evs[0].Type != "Warning" || evs[0].InvolvedObject.Kind != "Node" ||
		evs[0].InvolvedObject.Name != "gpu-node-1" || !strings.Contains(evs[0].Message, draGPUs[0].UUID) {
		t.Errorf("events %+v, want one Warning %s on Node gpu-node-1 naming the GPUs", evs, gpuowner.EventReason)
	}
	if _, err := os.Stat(filepath.Join(owners, gpuowner.DevicePlugin+".json")); err == nil {
		t.Error("the refused plugin recorded itself")
	}

	// Disjoint: GPUs 0-3, by index and UUID.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	errb = syncBuffer{}
	go func() {
		done <- run(ctx, append(args, "--devices=0,1,"+sys.Devices[2].UUID+",3"), getenv, &out, &errb)
	}()
	if r := k.registration(); r.ResourceName != "nvidia.com/gpu" {
		t.Fatalf("registration %v (%s)", r, errb.String())
	}
	devs := k.list("nvidia.com/gpu")
	if len(devs) != 4 {
		t.Errorf("%d devices advertised, want 4", len(devs))
	}
	for _, d := range devs {
		for _, g := range draGPUs {
			if d.ID == g.UUID {
				t.Errorf("advertised %s, which the DRA plugin has", d.ID)
			}
		}
	}
	live, err := gpuowner.Live(owners)
	if err != nil || len(live) != 2 {
		t.Errorf("live owners %+v (%v), want both plugins", live, err)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d: %s", code, errb.String())
	}
	if _, err := os.Stat(filepath.Join(owners, gpuowner.DevicePlugin+".json")); err == nil {
		t.Error("the device plugin's record is left after it stopped")
	}
}

func TestOnlyDevices(t *testing.T) {
	sys := loadSim(t, "a100x2-mig")
	got, err := onlyDevices(sys, "1", "test")
	if err != nil || len(got.Devices) != 1 || got.Devices[0].Index != 1 || len(sys.Devices) != 2 {
		t.Fatalf("onlyDevices 1: %+v, %v", got, err)
	}
	if _, err := onlyDevices(sys, "7", "GANTRY_DEVICES=7"); err == nil || !strings.Contains(err.Error(), "GANTRY_DEVICES=7") {
		t.Errorf("unknown GPU: %v", err)
	}
	if _, err := onlyDevices(sys, "0:0", "test"); err == nil || !strings.Contains(err.Error(), "MIG device") {
		t.Errorf("MIG device: %v", err)
	}
}
