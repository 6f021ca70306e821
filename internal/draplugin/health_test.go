package draplugin

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/gantry-gpu/gantry/internal/health"
)

// TestHealthReports: the kubelet's DRA health stream gets every device
// healthy, then the XID the simulated source is fed (the device plugin's
// tracker), then the recovery.
func TestHealthReports(t *testing.T) {
	var sock string
	e := newEnvWith(t, "h100x8", func(dir string) health.Source {
		sock = filepath.Join(dir, "h.sock")
		return health.NewSim(sock, health.DefaultPolicy())
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := drahealth.NewDRAResourceHealthClient(e.conn).NodeWatchResources(ctx, &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// next waits for a report in which device has health want.
	next := func(device string, want drahealth.HealthStatus) *drahealth.DeviceHealth {
		t.Helper()
		for {
			r, err := stream.Recv()
			if err != nil {
				t.Fatalf("waiting for %s to be %s: %v", device, want, err)
			}
			if len(r.Devices) != 8 {
				t.Fatalf("report of %d devices, want all 8", len(r.Devices))
			}
			for _, d := range r.Devices {
				if d.Device.PoolName != testNode {
					t.Errorf("device %s in pool %s", d.Device.DeviceName, d.Device.PoolName)
				}
				if d.Device.DeviceName == device && d.Health == want {
					return d
				}
			}
		}
	}
	next("gpu-2", drahealth.HealthStatus_HEALTHY)

	uuid := e.sys.Devices[2].UUID
	// An application XID (13) leaves it healthy; a fallen-off-the-bus one does not.
	for _, line := range []string{"xid " + uuid + " 13", "xid " + uuid + " 79"} {
		if err := health.InjectSim(sock, line); err != nil {
			t.Fatal(err)
		}
	}
	d := next("gpu-2", drahealth.HealthStatus_UNHEALTHY)
	if !strings.Contains(d.Message, "79") || d.LastUpdatedTime == 0 {
		t.Errorf("unhealthy report %+v, want XID 79 in the message and a time", d)
	}
	if err := health.InjectSim(sock, "reset "+uuid); err != nil {
		t.Fatal(err)
	}
	next("gpu-2", drahealth.HealthStatus_HEALTHY)
}

// TestHealthDeclinedWithoutSource: with health checks off the kubelet is
// told the service is not there.
func TestHealthDeclinedWithoutSource(t *testing.T) {
	e := newEnv(t, "h100x1")
	stream, err := drahealth.NewDRAResourceHealthClient(e.conn).NodeWatchResources(context.Background(), &drahealth.NodeWatchResourcesRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if err == nil || !strings.Contains(err.Error(), "Unimplemented") {
		t.Errorf("health watch without a source: %v, want Unimplemented", err)
	}
}
