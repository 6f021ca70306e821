package metrics

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

// fakeKubelet serves the pod-resources List call from a fixed answer.
type fakeKubelet struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	pods []*podresourcesv1.PodResources
}

func (f *fakeKubelet) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	return &podresourcesv1.ListPodResourcesResponse{PodResources: f.pods}, nil
}

// serveKubelet starts the fake on a real unix socket and returns its path.
func serveKubelet(t *testing.T, f *fakeKubelet) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, f)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return sock
}

func container(name, resource string, ids ...string) *podresourcesv1.ContainerResources {
	return &podresourcesv1.ContainerResources{Name: name, Devices: []*podresourcesv1.ContainerDevices{{ResourceName: resource, DeviceIds: ids}}}
}

// scrape fetches /metrics over HTTP and parses it with Prometheus' parser.
func scrape(t *testing.T, e *Exporter) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(e.Mux())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// series indexes a family's samples by "gpu/pod/namespace/container".
func series(t *testing.T, fams map[string]*dto.MetricFamily, name string) map[string]float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	out := map[string]float64{}
	for _, m := range f.GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		key := l["gpu"] + "/" + l["pod"] + "/" + l["namespace"] + "/" + l["container"]
		switch {
		case m.GetGauge() != nil:
			out[key] = m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			out[key] = m.GetCounter().GetValue()
		}
	}
	return out
}

func TestScrape(t *testing.T) {
	sys, err := sim.Load("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	uuid := func(i int) string { return sys.Devices[i].UUID }
	sock := serveKubelet(t, &fakeKubelet{pods: []*podresourcesv1.PodResources{
		{Name: "train-0", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
			container("trainer", "nvidia.com/gpu", uuid(0), uuid(1)),
			container("sidecar", "example.com/nic", uuid(2)), // not ours: ignored
		}},
		// Two replicas of GPU 3, time-sliced, in two pods; one by index.
		{Name: "nb-a", Namespace: "kubeflow", Containers: []*podresourcesv1.ContainerResources{container("notebook", "nvidia.com/gpu", uuid(3)+"::0")}},
		{Name: "nb-b", Namespace: "kubeflow", Containers: []*podresourcesv1.ContainerResources{container("notebook", "nvidia.com/gpu.shared", "3::1")}},
	}})
	pr, err := DialPodResources(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	health := func(u string) (bool, uint64) {
		if u == uuid(5) {
			return false, 3 // XID 79 three times, say
		}
		return true, 0
	}
	e := New(Options{System: sys, Reader: NewSim(sys), Health: health, PodResources: pr})
	fams := scrape(t, e)

	used := series(t, fams, "gantry_gpu_memory_used_bytes")
	wantKeys := []string{"0/train-0/ml/trainer", "1/train-0/ml/trainer", "2///", "3/nb-a/kubeflow/notebook", "3/nb-b/kubeflow/notebook", "4///", "5///", "6///", "7///"}
	if len(used) != len(wantKeys) {
		t.Errorf("memory_used series: %v, want keys %v", used, wantKeys)
	}
	sample := func(i int) Sample {
		s, err := NewSim(sys).Read(uuid(i))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, k := range wantKeys {
		i := int(k[0] - '0')
		if v, ok := used[k]; !ok || v != sample(i).MemoryUsedBytes {
			t.Errorf("memory_used{%s} = %v (present %v), want %v", k, v, ok, sample(i).MemoryUsedBytes)
		}
	}
	total := series(t, fams, "gantry_gpu_memory_total_bytes")
	if total["4///"] != 81559*(1<<20) {
		t.Errorf("memory_total of GPU 4 = %v, want %v", total["4///"], 81559*(1<<20))
	}
	for name, field := range map[string]func(Sample) float64{
		"gantry_gpu_utilization_percent":         func(s Sample) float64 { return s.UtilizationPercent },
		"gantry_gpu_memory_utilization_percent":  func(s Sample) float64 { return s.MemoryUtilizationPercent },
		"gantry_gpu_temperature_celsius":         func(s Sample) float64 { return s.TemperatureCelsius },
		"gantry_gpu_power_watts":                 func(s Sample) float64 { return s.PowerWatts },
		"gantry_gpu_encoder_utilization_percent": func(s Sample) float64 { return s.EncoderUtilizationPercent },
		"gantry_gpu_decoder_utilization_percent": func(s Sample) float64 { return s.DecoderUtilizationPercent },
		"gantry_gpu_sm_clock_hertz":              func(s Sample) float64 { return s.SMClockMHz * 1e6 },
		"gantry_gpu_memory_clock_hertz":          func(s Sample) float64 { return s.MemoryClockMHz * 1e6 },
	} {
		got := series(t, fams, name)
		for _, k := range []string{"0/train-0/ml/trainer", "1/train-0/ml/trainer", "6///"} { // GPU 0 is busy, GPU 1 idle
			i := int(k[0] - '0')
			if v, ok := got[k]; !ok || v != field(sample(i)) {
				t.Errorf("%s{%s} = %v (present %v), want %v", name, k, v, ok, field(sample(i)))
			}
		}
	}
	healthy := series(t, fams, "gantry_gpu_healthy")
	xids := series(t, fams, "gantry_gpu_xid_errors_total")
	if healthy["5///"] != 0 || xids["5///"] != 3 || healthy["4///"] != 1 || xids["4///"] != 0 {
		t.Errorf("health: healthy %v xids %v", healthy, xids)
	}
	if fams["gantry_gpu_xid_errors_total"].GetType() != dto.MetricType_COUNTER {
		t.Errorf("xid metric type %v, want counter", fams["gantry_gpu_xid_errors_total"].GetType())
	}
	if up := fams["gantry_pod_resources_up"].GetMetric()[0].GetGauge().GetValue(); up != 1 {
		t.Errorf("pod_resources_up = %v", up)
	}
	// The model and UUID labels.
	for _, m := range fams["gantry_gpu_healthy"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		if l["model"] != "NVIDIA H100 80GB HBM3" || !strings.HasPrefix(l["uuid"], "GPU-") {
			t.Errorf("labels %v", l)
		}
	}
}

// TestKubeletDown: the GPU metrics stay, without pod labels, and
// gantry_pod_resources_up says why.
func TestKubeletDown(t *testing.T) {
	sys, err := sim.Load("a100x2-mig")
	if err != nil {
		t.Fatal(err)
	}
	pr, err := DialPodResources(filepath.Join(t.TempDir(), "absent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	fams := scrape(t, New(Options{System: sys, Reader: NewSim(sys), PodResources: pr}))
	if up := fams["gantry_pod_resources_up"].GetMetric()[0].GetGauge().GetValue(); up != 0 {
		t.Errorf("pod_resources_up = %v, want 0", up)
	}
	if got := series(t, fams, "gantry_gpu_healthy"); len(got) != 2 || got["0///"] != 1 {
		t.Errorf("healthy = %v", got)
	}
	// MIG-enabled GPUs have no utilisation, as with NVML; their clocks are there.
	for _, name := range []string{"gantry_gpu_utilization_percent", "gantry_gpu_encoder_utilization_percent", "gantry_gpu_decoder_utilization_percent"} {
		if _, ok := fams[name]; ok {
			t.Errorf("%s reported for MIG-enabled GPUs", name)
		}
	}
	if got := series(t, fams, "gantry_gpu_sm_clock_hertz"); len(got) != 2 || !(got["1///"] > 1e8) {
		t.Errorf("sm_clock_hertz = %v", got)
	}
}

// TestMIGOwners: a MIG device's UUID and its "GPU:INSTANCE" name map to the
// parent GPU.
func TestMIGOwners(t *testing.T) {
	sys, err := sim.Load("a100x2-mig")
	if err != nil {
		t.Fatal(err)
	}
	sock := serveKubelet(t, &fakeKubelet{pods: []*podresourcesv1.PodResources{
		{Name: "p", Namespace: "n", Containers: []*podresourcesv1.ContainerResources{
			container("a", "nvidia.com/mig-1g.5gb", sys.Devices[1].MIGDevices[2].UUID),
			container("b", "nvidia.com/mig-3g.20gb", sys.Devices[0].MIGDevices[0].Name()),
		}},
	}})
	pr, err := DialPodResources(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	got := series(t, scrape(t, New(Options{System: sys, PodResources: pr})), "gantry_gpu_healthy")
	if _, ok := got["1/p/n/a"]; !ok {
		t.Errorf("MIG UUID not mapped to GPU 1: %v", got)
	}
	if _, ok := got["0/p/n/b"]; !ok {
		t.Errorf("MIG name not mapped to GPU 0: %v", got)
	}
}

func TestSimReader(t *testing.T) {
	sys := &gpu.System{Devices: []gpu.Device{{UUID: "GPU-a", MemoryMiB: 1024}}}
	r := NewSim(sys)
	a, err := r.Read("GPU-a")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := r.Read("GPU-a")
	if fmt.Sprintf("%+v", a) != fmt.Sprintf("%+v", b) || a.MemoryTotalBytes != 1<<30 || a.MemoryUsedBytes > a.MemoryTotalBytes || math.IsNaN(a.UtilizationPercent) || a.UtilizationPercent > 100 {
		t.Errorf("sample %+v / %+v", a, b)
	}
	if _, err := r.Read("GPU-b"); err == nil {
		t.Error("unknown GPU read without error")
	}
}
