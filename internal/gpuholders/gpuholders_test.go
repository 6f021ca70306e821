package gpuholders

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

// Check's rules on a kubelet checkpoint with time-slicing replicas and a
// whole GPU: replicas of one resource share, an unallocated container or
// another pod's whole GPU is refused, the holding pod and a privileged
// container holding nothing are not. (Every holder counts as running: the
// cgroup root has no kubepods.)
func TestCheckRules(t *testing.T) {
	sys, err := sim.Load("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	g0, g1 := sys.Devices[0].UUID, sys.Devices[1].UUID
	kdir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(kdir, "device-plugins"), 0o755); err != nil {
		t.Fatal(err)
	}
	ckpt := `{"Data":{"PodDeviceEntries":[
 {"PodUID":"pod-a","ContainerName":"c","ResourceName":"nvidia.com/gpu.shared","DeviceIDs":{"0":["` + g0 + `::0"]},"AllocResp":""},
 {"PodUID":"pod-b","ContainerName":"c","ResourceName":"nvidia.com/gpu.shared","DeviceIDs":{"0":["` + g0 + `::1"]},"AllocResp":""},
 {"PodUID":"pod-w","ContainerName":"w","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["1"]},"AllocResp":""},
 {"PodUID":"pod-x","ContainerName":"x","ResourceName":"example.com/fpga","DeviceIDs":{"0":["2"]},"AllocResp":""}],
 "RegisteredDevices":{}},"Checksum":1}`
	if err := os.WriteFile(filepath.Join(kdir, "device-plugins", "kubelet_internal_checkpoint"), []byte(ckpt), 0o644); err != nil {
		t.Fatal(err)
	}
	o := Options{KubeletDir: kdir, CgroupRoot: t.TempDir()}
	u := func(i int) []Unit { return []Unit{{UUID: sys.Devices[i].UUID, Index: i}} }
	for _, c := range []struct {
		name, pod  string
		privileged bool
		units      []Unit
		refused    string
	}{
		{"replica beside a replica", "pod-b", false, u(0), ""},
		{"unallocated on a replicated GPU", "pod-c", false, u(0), "GPU " + g0 + " (index 0) is held by running pod pod-"},
		{"another pod's whole GPU", "pod-b", false, u(1), "GPU " + g1 + " (index 1) is held by running pod pod-w container w (nvidia.com/gpu in the kubelet's device checkpoint"},
		{"the holder itself", "pod-w", false, u(1), ""},
		{"privileged, holding nothing", "plugin", true, append(u(0), u(1)...), ""},
		{"another vendor's index 2 is not GPU 2", "pod-c", false, u(2), ""},
		{"outside Kubernetes", "", false, u(1), "refusing to give it to this container"},
	} {
		err := Check(o, sys, c.pod, "c", c.privileged, c.units)
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.refused != "" && (!errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), c.refused)):
			t.Errorf("%s: %v, want a refusal saying %q", c.name, err, c.refused)
		}
	}
}
