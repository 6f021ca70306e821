package deviceplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// TestPassDeviceSpecsControlDevices: with passDeviceSpecs the answer lists
// the driver's control devices that exist under the device root before the
// GPUs' own nodes, as NVIDIA's plugin does; one that appears later (the
// nvidia-uvm-tools node once the module loads) is in the answers within
// controlRecheck. The request's order does not matter.
func TestPassDeviceSpecsControlDevices(t *testing.T) {
	root := t.TempDir()
	mk := func(name string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "dev", name), nil, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"nvidiactl", "nvidia-uvm", "nvidia-modeset"} {
		mk(n)
	}
	cfg := DefaultConfig()
	cfg.Flags.Plugin.PassDeviceSpecs = true
	cfg.Flags.NvidiaDevRoot = root
	h := startHarness(t, "h100x8", cfg)
	h.kubelet.registration()
	c := h.kubelet.client("nvidia-gpu.sock")
	u0, u5 := h.sys.Devices[0].UUID, h.sys.Devices[5].UUID
	spec := func(p string) *pluginapi.DeviceSpec {
		return &pluginapi.DeviceSpec{ContainerPath: p, HostPath: filepath.Join(root, p), Permissions: "rw"}
	}
	// answer is the device specs of an Allocate, and whether they are want.
	answer := func(want ...*pluginapi.DeviceSpec) ([]*pluginapi.DeviceSpec, bool) {
		t.Helper()
		resp, err := allocate(t, c, []string{u5, u0})
		if err != nil {
			t.Fatal(err)
		}
		got := resp.ContainerResponses[0].Devices
		return got, slices.EqualFunc(got, want, func(a, b *pluginapi.DeviceSpec) bool { return proto.Equal(a, b) })
	}
	want := []*pluginapi.DeviceSpec{spec("/dev/nvidiactl"), spec("/dev/nvidia-uvm"), spec("/dev/nvidia-modeset"), spec("/dev/nvidia0"), spec("/dev/nvidia5")}
	for range 3 {
		if got, ok := answer(want...); !ok {
			t.Fatalf("Devices = %v, want %v", got, want)
		}
	}
	// Looked for again within controlRecheck, not on every call.
	mk("nvidia-uvm-tools")
	want = slices.Insert(want, 2, spec("/dev/nvidia-uvm-tools"))
	deadline := time.Now().Add(controlRecheck + waitFor) // however busy the machine
	for {
		got, ok := answer(want...)
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after nvidia-uvm-tools appeared: Devices = %v, want %v", controlRecheck+waitFor, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAllocateConcurrent: answers share the device specs, mounts and CDI
// names that the server makes once; concurrent calls over the socket (the
// kubelet admits pods in parallel) all get whole, equal answers, and the
// race detector sees no write to the shared messages.
func TestAllocateConcurrent(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "dev", "nvidiactl"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Flags.Plugin.PassDeviceSpecs = true
	cfg.Flags.NvidiaDevRoot = root
	cfg.Flags.Plugin.DeviceListStrategy = StrategyList{ListVolumeMounts, ListCDIAnnotations, ListCDICRI}
	h := startHarness(t, "h100x8", cfg)
	h.kubelet.registration()
	c := h.kubelet.client("nvidia-gpu.sock")
	d := h.sys.Devices
	reqs := [][]string{{d[1].UUID, d[0].UUID}, {d[7].UUID, d[3].UUID, d[5].UUID}, {d[2].UUID}}
	want := make([]*pluginapi.ContainerAllocateResponse, len(reqs))
	for i, ids := range reqs {
		resp, err := allocate(t, c, ids)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = resp.ContainerResponses[0]
		if n := len(want[i].Devices); n != 1+len(ids) {
			t.Fatalf("request %d: %d device specs, want %d: %v", i, n, 1+len(ids), want[i].Devices)
		}
	}
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for n := range 40 {
				i := (g + n) % len(reqs)
				resp, err := c.Allocate(context.Background(), &pluginapi.AllocateRequest{
					ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: reqs[i]}}})
				if err != nil {
					errs <- err
					return
				}
				if got := resp.ContainerResponses[0]; !proto.Equal(got, want[i]) {
					errs <- fmt.Errorf("request %d answered %v, want %v", i, got, want[i])
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// The control devices present when the plugin starts are in every answer,
// also one given while another Allocate is still looking for them (it won
// the recheck, so this one does not look itself).
func TestPassDeviceSpecsWhileAnotherLooks(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "dev", "nvidiactl"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Flags.Plugin.PassDeviceSpecs = true
	cfg.Flags.NvidiaDevRoot = root
	sys := loadSim(t, "h100x8")
	p, err := New(Options{Config: cfg, System: sys, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	// Another Allocate's recheck is under way.
	p.controlNext.Store(time.Now().Add(time.Hour).UnixNano())
	s := p.servers[0]
	devs, err := s.lookup([]string{sys.Devices[0].UUID})
	if err != nil {
		t.Fatal(err)
	}
	got := s.deviceSpecs(devs)
	if len(got) == 0 || got[0].ContainerPath != "/dev/nvidiactl" {
		t.Errorf("Devices = %v, want /dev/nvidiactl first", got)
	}
}
