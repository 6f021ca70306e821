package deviceplugin

import (
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// TestPassDeviceSpecsControlDevices: with passDeviceSpecs the answer lists
// the driver's control devices that exist under the device root before the
// GPUs' own nodes, as NVIDIA's plugin does; one that appears later (the
// nvidia-uvm-tools node once the module loads) is in the next answer.
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
	check := func(want ...*pluginapi.DeviceSpec) {
		t.Helper()
		resp, err := allocate(t, c, []string{u0, u5})
		if err != nil {
			t.Fatal(err)
		}
		got := resp.ContainerResponses[0].Devices
		if len(got) != len(want) {
			t.Fatalf("Devices = %v, want %v", got, want)
		}
		for i := range want {
			if !proto.Equal(got[i], want[i]) {
				t.Errorf("Devices[%d] = %v, want %v", i, got[i], want[i])
			}
		}
	}
	check(spec("/dev/nvidiactl"), spec("/dev/nvidia-uvm"), spec("/dev/nvidia-modeset"), spec("/dev/nvidia0"), spec("/dev/nvidia5"))
	mk("nvidia-uvm-tools")
	check(spec("/dev/nvidiactl"), spec("/dev/nvidia-uvm"), spec("/dev/nvidia-uvm-tools"), spec("/dev/nvidia-modeset"), spec("/dev/nvidia0"), spec("/dev/nvidia5"))
}
