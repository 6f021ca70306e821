package deviceplugin

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gantry-gpu/gantry/internal/kubeapi/kubeapitest"
)

// configMapDir lays files out as the kubelet mounts a ConfigMap: the files
// in a ..<timestamp> directory, ..data linking to it, and a link per key.
func configMapDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_11_28_21_00_00.000000001")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range files {
		if err := os.WriteFile(filepath.Join(data, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPerNodeConfig: NVIDIA's per-node configs, built in. With a
// directory of named configs (laid out as a mounted ConfigMap) and no
// label, the plugin runs the config named default; labelling the Node
// nvidia.com/device-plugin.config=sliced restarts it live with that one
// (time-slicing renamed: nvidia.com/gpu.shared registers); a label naming
// no config goes back to the default and posts a Warning Event naming the
// valid names; all against a fake API server and the real gRPC kubelet API.
func TestPerNodeConfig(t *testing.T) {
	defer func(d time.Duration) { configLabelPoll = d }(configLabelPoll)
	configLabelPoll = 100 * time.Millisecond
	t.Setenv("GANTRY_CONFIG", "")
	s := kubeapitest.New(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1"}})
	dir := shortTempDir(t)
	cert, key := s.ClientCertificate()
	b64 := base64.StdEncoding.EncodeToString
	kubeconfig := filepath.Join(dir, "kubelet.conf")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
current-context: node
contexts:
- name: node
  context: {cluster: local, user: node}
clusters:
- name: local
  cluster: {server: `+s.URL()+`, certificate-authority-data: `+b64(s.CA())+`}
users:
- name: node
  user: {client-certificate-data: `+b64(cert)+`, client-key-data: `+b64(key)+`}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	configs := configMapDir(t, map[string]string{
		"default": "version: v1\n",
		"sliced":  "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
	})
	env := map[string]string{"CONFIG_FILE_SRCDIR": configs, "NODE_NAME": "gpu-node-1", "KUBECONFIG": kubeconfig}
	k := startKubelet(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var out, errb syncBuffer
	go func() {
		done <- run(ctx, []string{"--gpus=sim:h100x8", "--kubelet-dir=" + dir, "--sim-health-socket=" + filepath.Join(dir, "h.sock"), "--log-level=warn"},
			func(k string) string { return env[k] }, &out, &errb)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("exit %d: %s", code, errb.String())
		}
	}()
	if r := k.registration(); r.ResourceName != "nvidia.com/gpu" {
		t.Fatalf("no label: registration %v, want nvidia.com/gpu (config default)", r.ResourceName)
	}
	label := func(v string) {
		t.Helper()
		patch := `{"metadata":{"labels":{"` + DefaultConfigLabel + `":"` + v + `"}}}`
		if err := s.Client().PatchNode(context.Background(), "gpu-node-1", []byte(patch)); err != nil {
			t.Fatal(err)
		}
	}
	label("sliced")
	if r := k.registration(); r.ResourceName != "nvidia.com/gpu.shared" {
		t.Fatalf("label sliced: registration %v, want nvidia.com/gpu.shared", r.ResourceName)
	}
	if l := k.list("nvidia.com/gpu.shared"); len(l) != 32 {
		t.Errorf("label sliced: %d devices, want 8 GPUs x 4 replicas", len(l))
	}
	label("no-such-config")
	if r := k.registration(); r.ResourceName != "nvidia.com/gpu" {
		t.Fatalf("unknown label value: registration %v, want nvidia.com/gpu (the default again)", r.ResourceName)
	}
	deadline := time.Now().Add(waitFor)
	for {
		var msg string
		for _, e := range s.Events() {
			if e.Reason == "ConfigLabelInvalid" {
				msg = e.Message
			}
		}
		if strings.Contains(msg, "no-such-config") && strings.Contains(msg, "valid names: default, sliced;") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ConfigLabelInvalid Event naming the value and the valid names (got %q; log %s)", msg, errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
