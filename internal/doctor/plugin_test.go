package doctor

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gantry-gpu/gantry/internal/deviceplugin"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
	"github.com/gantry-gpu/gantry/internal/health"
)

// waitFor bounds the waits of these tests; each ends as soon as the awaited
// thing happens.
const waitFor = 30 * time.Second

// kubelet is the part of a kubelet a device plugin and doctor meet, over
// the real gRPC APIs on unix sockets in a temporary kubelet root:
//
//   - device-plugins/kubelet.sock, the Registration service: for each
//     registration it dials the plugin, asks for its options and follows
//     ListAndWatch, keeping the latest list (all devices unhealthy once the
//     stream ends, as the kubelet marks a plugin that went away);
//   - pod-resources/kubelet.sock: List (the pods given to allocate) and
//     GetAllocatableResources (the healthy devices of the latest lists);
//   - allocate calls the plugin's Allocate for a pod's container and writes
//     device-plugins/kubelet_internal_checkpoint as the kubelet does.
type kubelet struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	pluginapi.UnimplementedRegistrationServer
	t    testing.TB
	root string

	mu      sync.Mutex
	devices map[string][]*pluginapi.Device // resource -> latest list
	clients map[string]pluginapi.DevicePluginClient
	pods    []*podresourcesv1.PodResources
	entries []map[string]any // checkpoint PodDeviceEntries
	updates chan string      // resource, on each list received
	conns   []*grpc.ClientConn
}

func startKubelet(t *testing.T) *kubelet {
	t.Helper()
	root, err := os.MkdirTemp("", "kl") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	k := &kubelet{t: t, root: root, devices: map[string][]*pluginapi.Device{},
		clients: map[string]pluginapi.DevicePluginClient{}, updates: make(chan string, 256)}
	reg := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(reg, k)
	go reg.Serve(listen(t, filepath.Join(root, "device-plugins/kubelet.sock")))
	pr := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(pr, k)
	go pr.Serve(listen(t, filepath.Join(root, "pod-resources/kubelet.sock")))
	t.Cleanup(func() {
		reg.Stop()
		pr.Stop()
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, c := range k.conns {
			c.Close()
		}
	})
	return k
}

func (k *kubelet) pluginDir() string { return filepath.Join(k.root, "device-plugins") }

func (k *kubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.pluginDir(), r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	c := pluginapi.NewDevicePluginClient(conn)
	if _, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		conn.Close()
		return nil, err
	}
	stream, err := c.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		conn.Close()
		return nil, err
	}
	k.mu.Lock()
	k.conns = append(k.conns, conn)
	k.clients[r.ResourceName] = c
	k.mu.Unlock()
	go func() {
		for {
			resp, err := stream.Recv()
			k.mu.Lock()
			if err != nil {
				for _, d := range k.devices[r.ResourceName] {
					d.Health = pluginapi.Unhealthy
				}
			} else {
				k.devices[r.ResourceName] = resp.Devices
			}
			k.mu.Unlock()
			k.updates <- r.ResourceName
			if err != nil {
				return
			}
		}
	}()
	return &pluginapi.Empty{}, nil
}

func (k *kubelet) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return &podresourcesv1.ListPodResourcesResponse{PodResources: k.pods}, nil
}

func (k *kubelet) GetAllocatableResources(context.Context, *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	resp := &podresourcesv1.AllocatableResourcesResponse{}
	for _, res := range slices.Sorted(mapKeys(k.devices)) {
		var ids []string
		for _, d := range k.devices[res] {
			if d.Health == pluginapi.Healthy {
				ids = append(ids, d.ID)
			}
		}
		if len(ids) > 0 {
			resp.Devices = append(resp.Devices, &podresourcesv1.ContainerDevices{ResourceName: res, DeviceIds: ids})
		}
	}
	return resp, nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// await waits until the latest list of resource satisfies ok.
func (k *kubelet) await(resource string, ok func([]*pluginapi.Device) bool) {
	k.t.Helper()
	deadline := time.After(waitFor)
	for {
		k.mu.Lock()
		done := ok(k.devices[resource])
		k.mu.Unlock()
		if done {
			return
		}
		select {
		case <-k.updates:
		case <-deadline:
			k.t.Fatalf("kubelet: %s never reached the awaited state", resource)
		}
	}
}

func healthOf(list []*pluginapi.Device, id string) string {
	for _, d := range list {
		if d.ID == id {
			return d.Health
		}
	}
	return ""
}

// allocate gives a pod's container devices as the kubelet does: Allocate on
// the plugin, then the pod in List and the entry in the checkpoint file.
func (k *kubelet) allocate(ns, name, uid, container, resource string, ids ...string) {
	k.t.Helper()
	k.mu.Lock()
	c := k.clients[resource]
	k.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		k.t.Fatal(err)
	}
	allocResp, err := proto.Marshal(resp.ContainerResponses[0])
	if err != nil {
		k.t.Fatal(err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods = append(k.pods, pod(ns, name, ctr(container, gpus(resource, ids...))))
	// The kubelet's checkpoint (pkg/kubelet/cm/devicemanager/checkpoint):
	// device IDs per NUMA node, the Allocate answer as protobuf bytes
	// (base64 in JSON), RegisteredDevices the healthy devices.
	perNUMA := map[string][]string{}
	for _, id := range ids {
		numa := "-1"
		for _, d := range k.devices[resource] {
			if d.ID == id && d.Topology != nil && len(d.Topology.Nodes) > 0 {
				numa = fmt.Sprint(d.Topology.Nodes[0].ID)
			}
		}
		perNUMA[numa] = append(perNUMA[numa], id)
	}
	k.entries = append(k.entries, map[string]any{"PodUID": uid, "ContainerName": container, "ResourceName": resource,
		"DeviceIDs": perNUMA, "AllocResp": allocResp})
	registered := map[string][]string{}
	for res, list := range k.devices {
		for _, d := range list {
			if d.Health == pluginapi.Healthy {
				registered[res] = append(registered[res], d.ID)
			}
		}
	}
	data, err := json.Marshal(map[string]any{
		"Data":     map[string]any{"PodDeviceEntries": k.entries, "RegisteredDevices": registered},
		"Checksum": 2401186911, // the kubelet's hash of a Go dump of Data; doctor does not verify it
	})
	if err != nil {
		k.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(k.pluginDir(), checkpointFile), data, 0o644); err != nil {
		k.t.Fatal(err)
	}
}

// runPlugin runs the real device plugin in this process on the profile's
// simulated GPUs and their simulated health socket; it returns the system
// and that socket once the kubelet has the plugin's first list.
func runPlugin(t *testing.T, k *kubelet, profile string) (*gpu.System, string) {
	t.Helper()
	sys, err := sim.Load(profile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := deviceplugin.DefaultConfig()
	cfg.Gantry.KubeletDir = k.pluginDir()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	healthSock := filepath.Join(k.root, "health.sock")
	p, err := deviceplugin.New(deviceplugin.Options{Config: cfg, System: sys,
		Health: health.NewSim(healthSock, health.DefaultPolicy()), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if !testing.Verbose() {
		// The simulated health source logs to the default logger.
		prev := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
		t.Cleanup(func() { slog.SetDefault(prev) })
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("plugin Run: %v", err)
		}
	})
	k.await("nvidia.com/gpu", func(l []*pluginapi.Device) bool { return len(l) == len(sys.Devices) })
	return sys, healthSock
}

// inject sends a fault to the simulated health source once it listens.
func inject(t *testing.T, sock, line string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		err := health.InjectSim(sock, line)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("inject %q: %v", line, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// apiServer serves one Node over TLS, as the API server does to a pod's
// service account: the Node JSON is data (status.capacity and
// status.allocatable as the kubelet reports them), the client path is real.
type apiServer struct {
	srv   *httptest.Server
	saDir string
	mu    sync.Mutex
	node  string // its JSON
	gets  int
}

const testToken = "eyJhbGciOiJSUzI1NiJ9.test-token"

func startAPIServer(t *testing.T, nodeName string) *apiServer {
	t.Helper()
	a := &apiServer{saDir: t.TempDir()}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.gets++
		if r.Header.Get("Authorization") != "Bearer "+testToken {
			http.Error(w, `{"kind":"Status","code":401,"reason":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		if r.Method != http.MethodGet || r.URL.Path != "/api/v1/nodes/"+nodeName {
			http.Error(w, `{"kind":"Status","code":404,"reason":"NotFound"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, a.node)
	}))
	t.Cleanup(a.srv.Close)
	// The files a pod's service account mount holds.
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.srv.Certificate().Raw})
	for name, data := range map[string][]byte{"ca.crt": ca, "token": []byte(testToken + "\n"), "namespace": []byte("kube-system")} {
		if err := os.WriteFile(filepath.Join(a.saDir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

// setNode makes the Node report these nvidia.com/gpu counts.
func (a *apiServer) setNode(name string, capacity, allocatable int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.node = fmt.Sprintf(`{"kind":"Node","apiVersion":"v1","metadata":{"name":%q,"labels":{"nvidia.com/gpu.present":"true"}},
"status":{"capacity":{"cpu":"64","memory":"527988148Ki","nvidia.com/gpu":"%d","pods":"110"},
"allocatable":{"cpu":"63800m","memory":"516343732Ki","nvidia.com/gpu":"%d","pods":"110"},
"nodeInfo":{"kubeletVersion":"v1.31.4","containerRuntimeVersion":"containerd://1.7.24"}}}`, name, capacity, allocatable)
}

func (a *apiServer) options(k *kubelet, node string) Options {
	return Options{KubeletDir: k.root, NodeName: node, APIServer: a.srv.URL, ServiceAccountDir: a.saDir}
}

// TestDoctorWithGantryPlugin runs doctor beside the real device plugin on
// simulated GPUs and a kubelet: all healthy, then XID 79 on a GPU a pod
// holds, then the GPU's recovery, which the kubelet must still hear after
// doctor read the plugin.
func TestDoctorWithGantryPlugin(t *testing.T) {
	k := startKubelet(t)
	sys, healthSock := runPlugin(t, k, "h100x8")
	u := func(i int) string { return sys.Devices[i].UUID }
	k.allocate("ml", "train-0", "0b6a5f3e-7d1c-4a8e-9a51-3c2f0e7d9b41", "trainer", "nvidia.com/gpu", u(1), u(3))
	api := startAPIServer(t, "gpu-node-1")
	api.setNode("gpu-node-1", 8, 8)
	opts := api.options(k, "gpu-node-1")
	opts.Pod = "ml/train-0"

	checks := checkKubernetes(opts)
	expect(t, checks, CheckDevicePlugin, Pass, []string{"nvidia-gpu.sock (nvidia.com/gpu, gantry-device-plugin)"}, "")
	expect(t, checks, CheckPluginHealth, Pass, []string{"nvidia.com/gpu: 8 devices, 8 healthy"}, "")
	expect(t, checks, CheckAllocatable, Pass, []string{"nvidia.com/gpu: 8 allocatable, 2 in use (the plugin advertises 8, 8 healthy)"}, "")
	expect(t, checks, CheckCheckpoint, Pass, []string{"nvidia.com/gpu: 8 registered", "nvidia.com/gpu: 2 held by pods", checkpointFile}, "")
	expect(t, checks, CheckNode, Pass, []string{"node gpu-node-1", "kubelet v1.31.4", "nvidia.com/gpu capacity 8, allocatable 8"}, "")
	expect(t, checks, CheckPod, Pass, []string{"container trainer: nvidia.com/gpu " + u(1) + "," + u(3)}, "")
	if len(checks) != 6 || Failed(checks) {
		t.Fatalf("want six passing checks:\n%s", dump(checks))
	}

	// XID 79 on a GPU the training pod holds. The kubelet hears it and
	// stops offering it; the Node then reports one fewer allocatable.
	inject(t, healthSock, "xid "+u(3)+" 79")
	k.await("nvidia.com/gpu", func(l []*pluginapi.Device) bool { return healthOf(l, u(3)) == pluginapi.Unhealthy })
	api.setNode("gpu-node-1", 8, 7)
	checks = checkKubernetes(opts)
	events := "kubectl get events -A --field-selector involvedObject.kind=Node,involvedObject.name=gpu-node-1"
	c := expect(t, checks, CheckPluginHealth, Fail,
		[]string{"nvidia.com/gpu: 8 devices, 7 healthy; unhealthy: " + u(3) + " (held by pod ml/train-0 container trainer)"}, events)
	for _, want := range []string{"kubectl -n kube-system logs $(kubectl -n kube-system get pods -l app.kubernetes.io/name=gantry --field-selector spec.nodeName=gpu-node-1 -o name)",
		"quiet period", "kubectl drain gpu-node-1", "nvidia-smi -r"} {
		if !strings.Contains(c.Fix, want) {
			t.Errorf("health fix %q lacks %q", c.Fix, want)
		}
	}
	expect(t, checks, CheckAllocatable, Pass, []string{"nvidia.com/gpu: 7 allocatable, 1 in use (the plugin advertises 8, 7 healthy)"}, "")
	expect(t, checks, CheckNode, Fail, []string{"nvidia.com/gpu capacity 8, allocatable 7 (1 not allocatable: unhealthy " + u(3) + ")"}, events)
	expect(t, checks, CheckDevicePlugin, Pass, nil, "")

	// Doctor's streams did not take the kubelet's: it hears the recovery.
	inject(t, healthSock, "reset "+u(3))
	k.await("nvidia.com/gpu", func(l []*pluginapi.Device) bool { return healthOf(l, u(3)) == pluginapi.Healthy })
	api.setNode("gpu-node-1", 8, 8)
	if checks := checkKubernetes(opts); Failed(checks) {
		t.Errorf("after the reset:\n%s", dump(checks))
	}
}

// TestDoctorKubeletBehindPlugin: the plugin reports a GPU unhealthy that
// the kubelet still offers (its stream is behind), and a healthy one the
// kubelet does not offer.
func TestDoctorKubeletBehindPlugin(t *testing.T) {
	k := startKubelet(t)
	sys, healthSock := runPlugin(t, k, "h100x8")
	// A kubelet that no longer follows the plugin: freeze its view.
	k.mu.Lock()
	frozen := slices.Clone(k.devices["nvidia.com/gpu"])
	for i, d := range frozen {
		frozen[i] = proto.Clone(d).(*pluginapi.Device)
	}
	frozen[5].Health = pluginapi.Unhealthy
	k.mu.Unlock()
	inject(t, healthSock, "xid "+sys.Devices[2].UUID+" 48")
	k.await("nvidia.com/gpu", func(l []*pluginapi.Device) bool { return healthOf(l, sys.Devices[2].UUID) == pluginapi.Unhealthy })
	k.mu.Lock()
	k.devices["nvidia.com/gpu"] = frozen
	k.mu.Unlock()

	checks := checkKubernetes(Options{KubeletDir: k.root, NodeName: "gpu-node-1", ServiceAccountDir: filepath.Join(k.root, "no-sa"), APIServer: "https://127.0.0.1:1"})
	c := expect(t, checks, CheckAllocatable, Fail, []string{
		"the kubelet does not offer nvidia.com/gpu " + sys.Devices[5].UUID + " that the plugin on nvidia-gpu.sock advertises healthy",
		"the kubelet still offers nvidia.com/gpu " + sys.Devices[2].UUID + " that the plugin reports unhealthy",
	}, "restart the device plugin so it registers again")
	if !strings.Contains(c.Fix, "journalctl -u kubelet") {
		t.Errorf("fix %q", c.Fix)
	}
	expect(t, checks, CheckPluginHealth, Fail, []string{"unhealthy: " + sys.Devices[2].UUID}, "")
	expect(t, checks, CheckNode, Skip, []string{"no service account token"}, "")
}

// TestHelperPluginProcess is not a test: it is gantry-device-plugin, run
// as a child process by TestDoctorStaleRegistration so that it can be
// killed as a crash would.
func TestHelperPluginProcess(t *testing.T) {
	args := os.Getenv("GANTRY_DOCTOR_TEST_PLUGIN")
	if args == "" {
		t.Skip("helper process for TestDoctorStaleRegistration")
	}
	os.Exit(deviceplugin.Main(strings.Fields(args), os.Stdout, os.Stderr))
}

// TestDoctorStaleRegistration kills the real plugin process with SIGKILL:
// its socket stays behind with nobody serving it.
func TestDoctorStaleRegistration(t *testing.T) {
	k := startKubelet(t)
	cfg := filepath.Join(k.root, "config.toml")
	if err := os.WriteFile(cfg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPluginProcess$")
	cmd.Env = append(os.Environ(),
		"GANTRY_DOCTOR_TEST_PLUGIN=--gpus sim:a100x2-mig --mig-strategy mixed --kubelet-dir "+k.pluginDir()+
			" --sim-health-socket "+filepath.Join(k.root, "health.sock")+" --log-level error",
		"GANTRY_CONFIG="+cfg, "GANTRY_LABELS=off", "GANTRY_METRICS_ADDR=")
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("the plugin process's output:\n%s", stderr.String())
		}
	})

	// Registered: the kubelet follows each resource's stream.
	for _, res := range []string{"nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb"} {
		k.await(res, func(l []*pluginapi.Device) bool { return len(l) > 0 })
	}
	checks := checkKubernetes(Options{KubeletDir: k.root, ServiceAccountDir: filepath.Join(k.root, "no-sa"), APIServer: "https://127.0.0.1:1"})
	expect(t, checks, CheckDevicePlugin, Pass, []string{"nvidia-mig-1g.5gb.sock (nvidia.com/mig-1g.5gb, gantry-device-plugin)",
		"nvidia-mig-3g.20gb.sock (nvidia.com/mig-3g.20gb, gantry-device-plugin)"}, "")
	expect(t, checks, CheckPluginHealth, Pass, []string{"nvidia.com/mig-2g.10gb: "}, "")

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	// The kubelet marks a resource's devices unhealthy once it sees that
	// stream end; under load that can come after the kill returns.
	for _, res := range []string{"nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb"} {
		k.await(res, func(l []*pluginapi.Device) bool {
			for _, d := range l {
				if d.Health == pluginapi.Healthy {
					return false
				}
			}
			return true
		})
	}
	sock := filepath.Join(k.pluginDir(), "nvidia-mig-1g.5gb.sock")
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("the killed plugin's socket is gone (%v); the test needs it left behind", err)
	}
	checks = checkKubernetes(Options{KubeletDir: k.root, NodeName: "gpu-node-1", ServiceAccountDir: filepath.Join(k.root, "no-sa"), APIServer: "https://127.0.0.1:1"})
	expect(t, checks, CheckDevicePlugin, Fail, []string{"stale registration: " + sock + ": connection refused: no process serves this socket any more"},
		"the plugin that served it has crashed or stopped and left its socket")
	expect(t, checks, CheckPluginHealth, Skip, []string{CheckDevicePlugin}, "")
	// The kubelet saw the streams end and offers nothing any more.
	expect(t, checks, CheckAllocatable, Fail, []string{"no allocatable nvidia.com/ devices"}, "--field-selector spec.nodeName=gpu-node-1")
}

// nvidiaLikePlugin is another vendor's device plugin program as far as doctor
// can tell: it answers the API without Gantry's header. It records whether
// ListAndWatch was called, which doctor must not do to it.
type nvidiaLikePlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	mu      sync.Mutex
	watched bool
}

func (p *nvidiaLikePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func (p *nvidiaLikePlugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	p.mu.Lock()
	p.watched = true
	p.mu.Unlock()
	return s.Send(&pluginapi.ListAndWatchResponse{})
}

func serveNVIDIALike(t *testing.T, path string) *nvidiaLikePlugin {
	t.Helper()
	p := &nvidiaLikePlugin{}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go srv.Serve(listen(t, path))
	t.Cleanup(srv.Stop)
	return p
}

// TestDoctorForeignPlugin: NVIDIA's plugin (no Gantry header) is asked for
// its options only; its health is left to the Node's counts.
func TestDoctorForeignPlugin(t *testing.T) {
	dir := kubeletNode(t, "", node())
	p := serveNVIDIALike(t, filepath.Join(dir, "device-plugins/nvidia-gpu.sock"))
	serveNVIDIALike(t, filepath.Join(dir, "device-plugins/sriov-net.sock"))
	api := startAPIServer(t, "gpu-node-1")
	api.setNode("gpu-node-1", 4, 3)
	opts := Options{KubeletDir: dir, NodeName: "gpu-node-1", APIServer: api.srv.URL, ServiceAccountDir: api.saDir}
	checks := checkKubernetes(opts)
	expect(t, checks, CheckDevicePlugin, Pass, []string{"nvidia-gpu.sock (nvidia.com/gpu, not Gantry's plugin)", "other vendors' plugins, not checked: sriov-net.sock"}, "")
	expect(t, checks, CheckPluginHealth, Skip, []string{"nvidia-gpu.sock: not read (not Gantry's plugin"}, "")
	expect(t, checks, CheckNode, Fail, []string{"nvidia.com/gpu capacity 4, allocatable 3 (1 not allocatable)"}, "some are unhealthy")
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.watched {
		t.Error("doctor opened ListAndWatch on a plugin that is not Gantry's")
	}
}

// TestDoctorNodeAccess: reaching the API server is never a GPU failure.
func TestDoctorNodeAccess(t *testing.T) {
	dir := kubeletNode(t, "", node())
	serveNVIDIALike(t, filepath.Join(dir, "device-plugins/nvidia-gpu.sock"))
	api := startAPIServer(t, "gpu-node-1")
	api.setNode("gpu-node-1", 4, 4)
	base := Options{KubeletDir: dir, NodeName: "gpu-node-1", APIServer: api.srv.URL, ServiceAccountDir: api.saDir}
	expect(t, checkKubernetes(base), CheckNode, Pass, []string{"nvidia.com/gpu capacity 4, allocatable 4"}, "")

	gets := func() int {
		api.mu.Lock()
		defer api.mu.Unlock()
		return api.gets
	}
	cases := map[string]struct {
		opts func(o *Options)
		want string
	}{
		"wrong token": {func(o *Options) {
			o.ServiceAccountDir = t.TempDir()
			data, _ := os.ReadFile(filepath.Join(api.saDir, "ca.crt"))
			os.WriteFile(filepath.Join(o.ServiceAccountDir, "ca.crt"), data, 0o600)
			os.WriteFile(filepath.Join(o.ServiceAccountDir, "token"), []byte("expired"), 0o600)
		}, "401 Unauthorized: the service account may not get nodes"},
		"no token": {func(o *Options) { o.ServiceAccountDir = filepath.Join(dir, "none") }, "no service account token"},
		"no node name": {func(o *Options) {
			o.NodeName = ""
			t.Setenv("NODE_NAME", "")
		}, "NODE_NAME is not set"},
		"unknown node": {func(o *Options) { o.NodeName = "gpu-node-9" }, `no Node "gpu-node-9"`},
		"not in a pod": {func(o *Options) {
			o.APIServer = ""
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
		}, "not in a pod"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := base
			tc.opts(&o)
			expect(t, checkKubernetes(o), CheckNode, Skip, []string{tc.want}, "")
		})
	}

	// A server whose certificate the cluster CA did not sign gets no
	// request, so the token never goes over an unverified connection.
	o := base
	o.ServiceAccountDir = t.TempDir()
	os.WriteFile(filepath.Join(o.ServiceAccountDir, "ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: otherCA(t)}), 0o600)
	os.WriteFile(filepath.Join(o.ServiceAccountDir, "token"), []byte(testToken), 0o600)
	before := gets()
	expect(t, checkKubernetes(o), CheckNode, Skip, []string{"certificate signed by unknown authority"}, "")
	if gets() != before {
		t.Error("the API server answered a client that could not verify its certificate")
	}
}

// otherCA is a self-signed CA certificate (DER) that signed nothing here.
func otherCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other-cluster-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// TestCheckpointFormats: the kubelet's checkpoint before 1.20 (a list of
// IDs) and since (IDs per NUMA node), devices held that the plugin no longer
// advertises, and a file that is not a checkpoint.
func TestCheckpointFormats(t *testing.T) {
	k := startKubelet(t)
	sys, _ := runPlugin(t, k, "h100x8")
	opts := Options{KubeletDir: k.root, ServiceAccountDir: filepath.Join(k.root, "no-sa"), APIServer: "https://127.0.0.1:1"}
	write := func(s string) {
		if err := os.WriteFile(filepath.Join(k.pluginDir(), checkpointFile), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	expect(t, checkKubernetes(opts), CheckCheckpoint, Skip, []string{"the kubelet has not written one"}, "")

	write(`{"Data":{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"c","ResourceName":"nvidia.com/gpu","DeviceIDs":["` + sys.Devices[0].UUID + `"],"AllocResp":""}],` +
		`"RegisteredDevices":{"nvidia.com/gpu":["` + sys.Devices[0].UUID + `"],"example.com/nic":["eth1"]}},"Checksum":123}`)
	expect(t, checkKubernetes(opts), CheckCheckpoint, Pass, []string{"nvidia.com/gpu: 1 registered; nvidia.com/gpu: 1 held by pods"}, "")

	gone := "GPU-00000000-dead-beef-0000-000000000000"
	write(`{"Data":{"PodDeviceEntries":[{"PodUID":"u2","ContainerName":"cuda","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["` + gone + `"],"1":["` + sys.Devices[4].UUID + `"]}}],` +
		`"RegisteredDevices":{"nvidia.com/gpu":["` + sys.Devices[4].UUID + `"]}},"Checksum":1}`)
	expect(t, checkKubernetes(opts), CheckCheckpoint, Fail,
		[]string{"pods hold devices the plugin no longer advertises: nvidia.com/gpu " + gone + " (pod UID u2 container cuda)"}, "delete the pods")

	write(`{"Data":{"PodDeviceEntries":[{"PodUID":"u3","DeviceIDs":7}]}}`)
	expect(t, checkKubernetes(opts), CheckCheckpoint, Fail, []string{"DeviceIDs is neither a list nor an object"}, "journalctl -u kubelet")
	write(`{"Data":`)
	expect(t, checkKubernetes(opts), CheckCheckpoint, Fail, []string{"not the kubelet's device checkpoint JSON"}, "journalctl -u kubelet")
}

// TestFormatIDs: replicas of a time-sliced GPU are named once.
func TestFormatIDs(t *testing.T) {
	got := formatIDs([]string{"GPU-a::0", "GPU-a::1", "GPU-b", "GPU-a::3", "MIG-c"})
	if want := "GPU-a (3 replicas), GPU-b, MIG-c"; got != want {
		t.Errorf("formatIDs = %q, want %q", got, want)
	}
}

// TestHealthyKubernetesNode: the whole chain on a Kubernetes node that
// runs GPU pods through containerd's CRI plugin and Gantry's device plugin
// (no Docker): nothing fails, from the driver to the Node's capacity.
func TestHealthyKubernetesNode(t *testing.T) {
	h := newHost(t)
	k := startKubelet(t)
	runPlugin(t, k, "h100x8")
	api := startAPIServer(t, "gpu-node-1")
	api.setNode("gpu-node-1", 8, 8)
	ko := api.options(k, "gpu-node-1")
	opts := h.opts
	opts.KubeletDir, opts.NodeName, opts.APIServer, opts.ServiceAccountDir = ko.KubeletDir, ko.NodeName, ko.APIServer, ko.ServiceAccountDir
	os.Remove(opts.DockerConfig)
	os.RemoveAll(filepath.Join(opts.Proc, "100"))
	h.write(t, opts.ContainerdConfig, `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "`+filepath.Join(h.bin, "gantry-runtime")+`"
`)
	checks := Run(opts)
	if Failed(checks) {
		t.Fatalf("a healthy Kubernetes node fails:\n%s", dump(checks))
	}
	for _, n := range []string{CheckContainerd, CheckDevicePlugin, CheckPluginHealth, CheckAllocatable, CheckNode} {
		expect(t, checks, n, Pass, nil, "")
	}
}
