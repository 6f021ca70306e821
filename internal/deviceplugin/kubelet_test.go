package deviceplugin

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
	"github.com/gantry-gpu/gantry/internal/health"
	"github.com/gantry-gpu/gantry/internal/mps"
	"github.com/gantry-gpu/gantry/internal/mps/mpstest"
)

// waitFor bounds every wait of these tests: generous, since a wait ends as
// soon as the awaited thing happens; it only stops a broken test hanging.
const waitFor = 30 * time.Second

// fakeKubelet is a kubelet's device manager as far as a device plugin can
// tell: it serves the real Registration service on kubelet.sock and, for
// each registration, dials the plugin's socket, asks for its options and
// follows ListAndWatch, as the kubelet does.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	t      testing.TB
	dir    string
	server *grpc.Server
	ln     *net.UnixListener
	regs   chan *pluginapi.RegisterRequest

	mu      sync.Mutex
	lists   map[string]chan []*pluginapi.Device // resource -> every list received
	conns   []*grpc.ClientConn
	options map[string]*pluginapi.DevicePluginOptions
}

func startKubelet(t testing.TB, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{
		t: t, dir: dir, regs: make(chan *pluginapi.RegisterRequest, 64),
		lists: map[string]chan []*pluginapi.Device{}, options: map[string]*pluginapi.DevicePluginOptions{},
	}
	sock := filepath.Join(dir, KubeletSocketName)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatalf("fake kubelet: %v", err)
	}
	k.ln = ln
	k.server = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(k.server, k)
	go k.server.Serve(ln)
	t.Cleanup(k.stop)
	return k
}

// Register is the kubelet's Registration service.
func (k *fakeKubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if r.Version != pluginapi.Version {
		return nil, errors.New("unsupported version " + r.Version)
	}
	conn, err := k.dial(r.Endpoint)
	if err != nil {
		return nil, err
	}
	// As the kubelet: the options, then a ListAndWatch stream that lives
	// until the plugin or this kubelet goes away.
	client := pluginapi.NewDevicePluginClient(conn)
	opts, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		conn.Close()
		return nil, err
	}
	stream, err := client.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		conn.Close()
		return nil, err
	}
	k.mu.Lock()
	k.options[r.ResourceName] = opts
	ch, ok := k.lists[r.ResourceName]
	if !ok {
		ch = make(chan []*pluginapi.Device, 256)
		k.lists[r.ResourceName] = ch
	}
	k.conns = append(k.conns, conn)
	k.mu.Unlock()
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			ch <- resp.Devices
		}
	}()
	k.regs <- r
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) dial(endpoint string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+filepath.Join(k.dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// stop is a kubelet going away: its socket disappears, its streams close.
func (k *fakeKubelet) stop() {
	k.server.Stop()
	os.Remove(filepath.Join(k.dir, KubeletSocketName))
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range k.conns {
		c.Close()
	}
	k.conns = nil
}

// crash is a kubelet killed: its streams close but its socket stays behind
// (nothing unlinks it), as after SIGKILL.
func (k *fakeKubelet) crash() {
	k.ln.SetUnlinkOnClose(false)
	k.stop()
}

// restartKubelet starts a kubelet the way the real device manager starts
// (pkg/kubelet/cm/devicemanager/plugin/v1beta1 server.Start): it first
// removes every file in the socket directory (an old kubelet.sock and the
// plugins' sockets), then listens on a new kubelet.sock.
func restartKubelet(t testing.TB, dir string) *fakeKubelet {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	return startKubelet(t, dir)
}

// registration waits for the next registration.
func (k *fakeKubelet) registration() *pluginapi.RegisterRequest {
	k.t.Helper()
	select {
	case r := <-k.regs:
		return r
	case <-time.After(waitFor):
		k.t.Fatalf("fake kubelet: no registration within %v", waitFor)
		return nil
	}
}

// registrations waits for n registrations and returns them by resource.
func (k *fakeKubelet) registrations(n int) map[string]*pluginapi.RegisterRequest {
	k.t.Helper()
	out := map[string]*pluginapi.RegisterRequest{}
	for range n {
		r := k.registration()
		out[r.ResourceName] = r
	}
	return out
}

// list waits for the next device list of resource.
func (k *fakeKubelet) list(resource string) []*pluginapi.Device {
	k.t.Helper()
	k.mu.Lock()
	ch := k.lists[resource]
	k.mu.Unlock()
	if ch == nil {
		k.t.Fatalf("fake kubelet: %s never registered", resource)
	}
	select {
	case l := <-ch:
		return l
	case <-time.After(waitFor):
		k.t.Fatalf("fake kubelet: no device list for %s within %v", resource, waitFor)
		return nil
	}
}

// client is a device plugin client on resource's socket, as the kubelet
// uses for Allocate and GetPreferredAllocation.
func (k *fakeKubelet) client(endpoint string) pluginapi.DevicePluginClient {
	k.t.Helper()
	conn, err := k.dial(endpoint)
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// harness runs a plugin against a fake kubelet in a short temporary
// directory (unix socket paths are limited to 107 bytes).
type harness struct {
	t       testing.TB
	dir     string
	sys     *gpu.System
	plugin  *Plugin
	kubelet *fakeKubelet
	health  string // the simulated health socket
	cancel  context.CancelFunc
	done    chan error
}

func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// loadSim is the simulated host of a built-in profile.
func loadSim(t testing.TB, profile string) *gpu.System {
	t.Helper()
	sys, err := sim.Load(profile)
	if err != nil {
		t.Fatal(err)
	}
	return sys
}

// startHarness starts a kubelet and then the plugin with cfg (validated
// here) on the profile's GPUs and the simulated health source.
func startHarness(t testing.TB, profile string, cfg Config) *harness {
	t.Helper()
	return startHarnessResync(t, profile, cfg, 0)
}

// startHarnessResync is startHarness with the plugin's periodic check of
// the kubelet directory every resync (0: the default).
func startHarnessResync(t testing.TB, profile string, cfg Config, resync time.Duration) *harness {
	t.Helper()
	return startHarnessLog(t, profile, cfg, resync, testLogger(t))
}

// startHarnessLog is startHarnessResync with the plugin logging to log.
func startHarnessLog(t testing.TB, profile string, cfg Config, resync time.Duration, log *slog.Logger) *harness {
	t.Helper()
	h := &harness{t: t, dir: shortTempDir(t), sys: loadSim(t, profile), done: make(chan error, 1)}
	// Not in the kubelet directory, which a restarting kubelet empties.
	h.health = filepath.Join(shortTempDir(t), "health.sock")
	cfg.Gantry.KubeletDir = h.dir
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h.kubelet = startKubelet(t, h.dir)
	p, err := New(Options{Config: cfg, System: h.sys, Health: health.NewSim(h.health, health.DefaultPolicy()), Log: log, Resync: resync})
	if err != nil {
		t.Fatal(err)
	}
	h.plugin = p
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- p.Run(ctx) }()
	t.Cleanup(h.stop)
	return h
}

// stop ends Run and waits for it.
func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run: %v", err)
		}
	case <-time.After(waitFor):
		h.t.Errorf("Run did not return within %v of cancellation", waitFor)
	}
}

// inject sends a fault command to the simulated health source, waiting for
// its socket to appear first.
func (h *harness) inject(line string) {
	h.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		err := health.InjectSim(h.health, line)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("inject %q: %v", line, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMain quiets the default logger, which the simulated health source
// logs to, unless -v asks for the logs.
func TestMain(m *testing.M) {
	// The MPS tests start daemons through the launcher (this binary
	// again) and mount their shm: in a mount namespace of the tests' own.
	mps.LaunchMain()
	mpstest.PrivateMounts()
	flag.Parse()
	if !testing.Verbose() {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	os.Exit(m.Run())
}
