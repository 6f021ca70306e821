package deviceplugin

import (
	"context"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gantry-gpu/gantry/internal/health"
	"github.com/gantry-gpu/gantry/internal/kubeapi/kubeapitest"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// The front end with labels written to a feature file and /metrics served:
// an XID injected through the simulated health socket shows in /metrics as
// an unhealthy GPU with one XID, and the labels describe the host.
func TestObservabilityFrontEnd(t *testing.T) {
	dir := shortTempDir(t)
	k := startKubelet(t, dir)
	addr := freeAddr(t)
	features := filepath.Join(dir, "features")
	sock := filepath.Join(dir, "h.sock")
	env := map[string]string{"GANTRY_LABELS": "file", "GANTRY_FEATURE_FILE": features, "GANTRY_METRICS_ADDR": addr,
		"GANTRY_POD_RESOURCES_SOCKET": filepath.Join(dir, "no-kubelet-pod-resources.sock")}
	getenv := func(k string) string { return env[k] }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var out, errb syncBuffer
	go func() {
		done <- run(ctx, []string{"--gpus=sim:h100x8", "--kubelet-dir=" + dir, "--sim-health-socket=" + sock, "--log-level=error"}, getenv, &out, &errb)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("exit %d: %s", code, errb.String())
		}
	}()
	if r := k.registration(); r.ResourceName != "nvidia.com/gpu" {
		t.Fatalf("registration %v", r)
	}
	devs := k.list("nvidia.com/gpu")
	uuid := devs[2].ID

	// Labels.
	var labels []byte
	for deadline := time.Now().Add(waitFor); time.Now().Before(deadline); {
		if labels, _ = os.ReadFile(features); len(labels) > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{"nvidia.com/gpu.count=8", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.family=hopper"} {
		if !strings.Contains(string(labels), want+"\n") {
			t.Errorf("feature file lacks %s:\n%s", want, labels)
		}
	}

	// Health through /metrics.
	if err := health.InjectSim(sock, "xid "+uuid+" 79"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitFor)
	for {
		healthy, xids := scrape(t, addr, uuid)
		if healthy == 0 && xids == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after XID 79 on %s: /metrics says healthy=%v xids=%v", uuid, healthy, xids)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if healthy, xids := scrape(t, addr, devs[0].ID); healthy != 1 || xids != 0 {
		t.Errorf("another GPU: healthy=%v xids=%v", healthy, xids)
	}
}

// scrape reads gantry_gpu_healthy and gantry_gpu_xid_errors_total of one GPU.
func scrape(t *testing.T, addr, uuid string) (healthy, xids float64) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	healthy, xids = -1, -1
	for name, dst := range map[string]*float64{"gantry_gpu_healthy": &healthy, "gantry_gpu_xid_errors_total": &xids} {
		f := fams[name]
		if f == nil {
			t.Fatalf("/metrics has no %s", name)
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "uuid" && l.GetValue() == uuid {
					if m.GetGauge() != nil {
						*dst = m.GetGauge().GetValue()
					}
					if m.GetCounter() != nil {
						*dst = m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return healthy, xids
}

func TestObservabilitySettings(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"GANTRY_LABELS": "nodes"}, "use off, node or file"},
		{map[string]string{"GANTRY_LABELS": "node"}, "NODE_NAME"},
		{map[string]string{"GANTRY_METRICS_ADDR": "9401"}, "host:port"},
	} {
		_, err := observabilityFromEnv(func(k string) string { return tc.env[k] })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %q", tc.env, err, tc.want)
		}
	}
	o, err := observabilityFromEnv(func(string) string { return "" })
	if err != nil || o.labelsMode != "off" || o.metricsAddr != "" {
		t.Errorf("defaults: %+v %v", o, err)
	}
}

// A health change becomes an Event on the Node (an in-memory API server
// checks and keeps what a real one would).
func TestHealthEventPosted(t *testing.T) {
	s := kubeapitest.New(t)
	c := s.Client()
	postHealthEvent(c, "node-a", health.Event{UUID: "GPU-1", Healthy: false, Reason: "XID 79 (GPU has fallen off the bus)", XID: 79}, testLogger(t))
	postHealthEvent(c, "node-a", health.Event{UUID: "GPU-1", Healthy: true, Reason: "recovered"}, testLogger(t))
	evs := s.Events()
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2", len(evs))
	}
	got := map[string]string{}
	for _, e := range evs {
		if e.Namespace != "default" || e.Count != 1 || e.FirstTimestamp.IsZero() || e.Source.Component != "gantry-device-plugin" {
			t.Errorf("event %+v", e)
		}
		if e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != "node-a" {
			t.Errorf("event on %v", e.InvolvedObject)
		}
		got[e.Reason] = e.Type + ": " + e.Message
	}
	if got["GPUUnhealthy"] != "Warning: GPU GPU-1: XID 79 (GPU has fallen off the bus)" || got["GPUHealthy"] != "Normal: GPU GPU-1: recovered" {
		t.Errorf("events %v", got)
	}
}

// TestNodeLabelsThroughKubeconfig runs the plugin as a node service would,
// outside a pod: GANTRY_LABELS=node with KUBECONFIG naming a kubeconfig
// with the node's client certificate (as the kubelet's own). The labels
// land on the Node and an XID becomes an Event, all sent with that
// certificate.
func TestNodeLabelsThroughKubeconfig(t *testing.T) {
	s := kubeapitest.New(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1", Labels: map[string]string{"kubernetes.io/os": "linux"}}})
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
  cluster:
    server: `+s.URL()+`
    certificate-authority-data: `+b64(s.CA())+`
users:
- name: node
  user:
    client-certificate-data: `+b64(cert)+`
    client-key-data: `+b64(key)+`
`), 0o600); err != nil {
		t.Fatal(err)
	}
	k := startKubelet(t, dir)
	sock := filepath.Join(dir, "h.sock")
	env := map[string]string{"GANTRY_LABELS": "node", "NODE_NAME": "gpu-node-1", "KUBECONFIG": kubeconfig}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var out, errb syncBuffer
	go func() {
		done <- run(ctx, []string{"--gpus=sim:h100x8", "--kubelet-dir=" + dir, "--sim-health-socket=" + sock, "--log-level=error"},
			func(k string) string { return env[k] }, &out, &errb)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("exit %d: %s", code, errb.String())
		}
	}()
	if r := k.registration(); r.ResourceName != "nvidia.com/gpu" {
		t.Fatalf("registration %v", r)
	}
	uuid := k.list("nvidia.com/gpu")[2].ID
	deadline := time.Now().Add(waitFor)
	for s.Node("gpu-node-1").Labels["nvidia.com/gpu.count"] != "8" {
		if time.Now().After(deadline) {
			t.Fatalf("no labels on the Node: %v (log: %s)", s.Node("gpu-node-1").Labels, errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := s.Node("gpu-node-1"); n.Labels["kubernetes.io/os"] != "linux" || n.Labels["nvidia.com/gpu.family"] != "hopper" {
		t.Errorf("labels %v", n.Labels)
	}
	if err := health.InjectSim(sock, "xid "+uuid+" 79"); err != nil {
		t.Fatal(err)
	}
	for len(s.Events()) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no Event for XID 79 (log: %s)", errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if e := s.Events()[0]; e.Reason != "GPUUnhealthy" || e.InvolvedObject.Name != "gpu-node-1" {
		t.Errorf("event %+v", e)
	}
	for i, u := range s.Users() {
		if u != "cert:"+kubeapitest.ClientCertCN {
			t.Errorf("request %d authenticated as %q, want the kubeconfig's client certificate", i, u)
		}
	}
}
