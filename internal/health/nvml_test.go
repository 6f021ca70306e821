//go:build cgo

package health

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpunvml "github.com/gantry-gpu/gantry/internal/gpu/nvml"
)

func TestNVMLEventConstants(t *testing.T) {
	if nvmlEventXIDCritical != nvml.EventTypeXidCriticalError ||
		nvmlEventDoubleBitECC != nvml.EventTypeDoubleBitEccError ||
		nvmlEventSingleBitECC != nvml.EventTypeSingleBitEccError {
		t.Error("event type bits differ from go-nvml's")
	}
}

// TestNVMLRegisters runs on a GPU host (it skips without a driver): it
// registers events on every GPU and MIG device and runs the NVML source for
// 2 s, which must end without error.
//
//	CGO_CFLAGS=-Wno-deprecated-declarations go test ./internal/health -run TestNVMLRegisters -v
func TestNVMLRegisters(t *testing.T) {
	sys, err := gpunvml.Discover(gpunvml.Options{Light: true})
	if errors.Is(err, gpunvml.ErrNoNVML) || errors.Is(err, gpunvml.ErrDriverNotLoaded) {
		t.Skipf("no NVIDIA driver here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	var uuids []string
	for _, d := range sys.Devices {
		uuids = append(uuids, d.UUID)
		for _, m := range d.MIGDevices {
			uuids = append(uuids, m.UUID)
		}
	}
	t.Logf("%d devices: %v", len(uuids), uuids)

	lib, shutdown, err := gpunvml.Open("")
	if err != nil {
		t.Fatal(err)
	}
	ws, err := register(lib, uuids)
	if err != nil {
		shutdown()
		t.Fatal(err)
	}
	for u, why := range ws.unknown {
		t.Errorf("%s: health unknown: %s", u, why)
	}
	for _, o := range ws.lost {
		t.Errorf("%s: NVML reports it lost", o.uuid)
	}
	for _, u := range uuids {
		if err := probeDevice(lib, u); err != nil {
			t.Errorf("%s: probe: %v", u, err)
		}
	}
	ws.set.Free()
	shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out := make(chan Event, len(uuids))
	if err := NewNVML("", DefaultPolicy()).Run(ctx, uuids, out); err != nil {
		t.Fatalf("Run: %v", err)
	}
	close(out)
	for e := range out {
		t.Logf("event during the run: %+v", e)
	}
}
