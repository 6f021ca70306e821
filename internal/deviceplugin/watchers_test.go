package deviceplugin

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// watchers is how many ListAndWatch streams the resource's server feeds.
func (s *server) watcherCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers)
}

// TestOtherListAndWatchClients is `gantry doctor` reading the plugin beside
// the kubelet: it asks for the options (and learns from their header that
// the plugin is Gantry's), takes the first device list and leaves, several
// times; another client opens a stream and never reads again. The kubelet's
// stream must still get every health change, and the streams of clients
// that left must end in the plugin.
func TestOtherListAndWatchClients(t *testing.T) {
	h := startHarness(t, "h100x8", DefaultConfig())
	h.kubelet.registration()
	if l := h.kubelet.list("nvidia.com/gpu"); len(l) != 8 {
		t.Fatalf("kubelet's first list has %d devices, want 8", len(l))
	}
	srv := h.plugin.servers[0]
	c := h.kubelet.client("nvidia-gpu.sock")

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	var header metadata.MD
	if _, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.Header(&header)); err != nil {
		t.Fatal(err)
	}
	if got := header.Get(ResourceHeader); !slices.Equal(got, []string{"nvidia.com/gpu"}) {
		t.Errorf("header %s = %q, want [nvidia.com/gpu]", ResourceHeader, got)
	}

	for range 3 {
		sctx, scancel := context.WithTimeout(context.Background(), waitFor)
		stream, err := c.ListAndWatch(sctx, &pluginapi.Empty{})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil || len(resp.Devices) != 8 {
			t.Fatalf("a second client's first list: %v, %d devices", err, len(resp.GetDevices()))
		}
		scancel()
	}
	idle, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idle.Recv(); err != nil {
		t.Fatal(err)
	}
	// The kubelet's stream and the idle one are left; the three that left
	// are gone (a bounded wait: the handlers return as their contexts end).
	deadline := time.Now().Add(waitFor)
	for srv.watcherCount() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d streams fed after three clients left, want 2 (the kubelet's and the idle one)", srv.watcherCount())
		}
		time.Sleep(10 * time.Millisecond)
	}

	bad := h.sys.Devices[2].UUID
	h.inject("xid " + bad + " 79")
	if st := deviceHealth(h.kubelet.list("nvidia.com/gpu"))[bad]; st != pluginapi.Unhealthy {
		t.Errorf("kubelet after XID 79 on %s: %s", bad, st)
	}
	h.inject("reset " + bad)
	if st := deviceHealth(h.kubelet.list("nvidia.com/gpu"))[bad]; st != pluginapi.Healthy {
		t.Errorf("kubelet after the reset of %s: %s", bad, st)
	}
	// The idle client was told too (each list has the state when it was
	// sent, so it ends with the reset).
	for {
		resp, err := idle.Recv()
		if err != nil {
			t.Fatalf("idle client: %v", err)
		}
		if deviceHealth(resp.Devices)[bad] == pluginapi.Healthy {
			break
		}
	}
}
