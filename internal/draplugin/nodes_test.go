package draplugin

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gantry-gpu/gantry/internal/edits"
)

// mknod makes a character device node at root/p (the tests run as root:
// editstest.MakeDevRoot makes the GPUs' nodes the same way).
func mknod(t testing.TB, root, p string, major, minor uint32) {
	t.Helper()
	h := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(h), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(h, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		t.Skipf("mknod %s: %v (needs root)", h, err)
	}
}

func deviceByName(devs []Device, name string) (Device, bool) {
	i := slices.IndexFunc(devs, func(d Device) bool { return d.Slice.Name == name })
	if i < 0 {
		return Device{}, false
	}
	return devs[i], true
}

// TestIMEXChannelClaim: the IMEX channels under the device root are
// published as NVIDIA's DRA driver published them for imex.nvidia.com
// (imex-channel-N, type imex-channel, channel N); a claim for one injects
// that channel's node and nothing else (no GPU, no driver files, the
// visible devices void), and a claim for a GPU and a channel gets both.
func TestIMEXChannelClaim(t *testing.T) {
	e := newEnvSetup(t, "h100x8", func(e *testEnv, base string) {
		for _, n := range []uint32{0, 1, 10} {
			mknod(t, e.devRoot, IMEXChannelDir+"/channel"+itoa(int(n)), 509, n)
		}
		// Not channels: left out.
		if err := os.WriteFile(filepath.Join(e.devRoot, IMEXChannelDir, "channelx"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	var names []string
	for _, d := range e.drv.Devices() {
		if strings.HasPrefix(d.Slice.Name, "imex") {
			names = append(names, d.Slice.Name)
		}
	}
	if want := []string{"imex-channel-0", "imex-channel-1", "imex-channel-10"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("IMEX devices %v, want %v", names, want)
	}
	d, _ := deviceByName(e.drv.Devices(), "imex-channel-10")
	if tp := d.Slice.Attributes["type"].StringValue; tp == nil || *tp != TypeIMEXChannel {
		t.Errorf("type %v, want %s", tp, TypeIMEXChannel)
	}
	if ch := d.Slice.Attributes["channel"].IntValue; ch == nil || *ch != 10 {
		t.Errorf("channel %v, want 10", ch)
	}

	c := e.claim("imex", "imex-channel-1")
	oci := inject(t, e.cdiRoot, cdiIDs(t, e.prepare(c), c))
	if got, want := devicePaths(oci), []string{IMEXChannelDir + "/channel1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("an IMEX claim injects %v, want %v", got, want)
	}
	for _, dev := range oci.Linux.Devices {
		if dev.Major != 509 || dev.Minor != 1 {
			t.Errorf("%s is %d:%d, want 509:1 (the node under the dev root)", dev.Path, dev.Major, dev.Minor)
		}
	}
	if len(oci.Mounts) > 0 || oci.Hooks != nil || !slices.Contains(oci.Process.Env, edits.VisibleDevicesVoid) {
		t.Errorf("an IMEX claim got mounts %v, hooks %v, env %v: want the node only and %s", oci.Mounts, oci.Hooks, oci.Process.Env, edits.VisibleDevicesVoid)
	}

	both := e.claim("both", "gpu-2", "imex-channel-0")
	oci = inject(t, e.cdiRoot, cdiIDs(t, e.prepare(both), both))
	got := devicePaths(oci)
	if !slices.Contains(got, "/dev/nvidia2") || !slices.Contains(got, IMEXChannelDir+"/channel0") || slices.Contains(got, IMEXChannelDir+"/channel1") {
		t.Errorf("a GPU and channel 0 inject %v", got)
	}
	if len(oci.Mounts) == 0 {
		t.Errorf("a claim with a GPU got no driver files")
	}
}

// fakePCI writes a PCI function into a fake sysfs as the kernel lays it
// out: bus/pci/devices/ADDR with vendor, device, class, numa_node and the
// driver and iommu_group links ("" leaves a link out).
func fakePCI(t *testing.T, sys, addr, vendor, class, drv, group string) {
	t.Helper()
	d := filepath.Join(sys, "devices/pci0000:00", addr)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"vendor": vendor, "device": "0x2330", "class": class, "numa_node": "1"} {
		if err := os.WriteFile(filepath.Join(d, name), []byte(v+"\n"), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, name string) {
		if err := os.MkdirAll(filepath.Join(sys, target), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("../../..", target), filepath.Join(d, name)); err != nil {
			t.Fatal(err)
		}
	}
	if drv != "" {
		link("bus/pci/drivers/"+drv, "driver")
	}
	if group != "" {
		link("kernel/iommu_groups/"+group, "iommu_group")
	}
	if err := os.MkdirAll(filepath.Join(sys, "bus/pci/devices"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("../../../devices/pci0000:00", addr), filepath.Join(sys, "bus/pci/devices", addr)); err != nil {
		t.Fatal(err)
	}
}

// TestVFIODevices: in a fake sysfs, only NVIDIA display functions bound to
// vfio-pci are published (type vfio, their PCI address, NUMA node and
// IOMMU group), not a GPU on the nvidia driver, not the GPU's audio
// function, not another vendor's device; a claim for one injects
// /dev/vfio/vfio and its group's node only. Without the group's node or
// without an IOMMU group it is refused naming the fix, and the plugin
// still publishes its GPUs.
func TestVFIODevices(t *testing.T) {
	sys, dev := t.TempDir(), t.TempDir()
	fakePCI(t, sys, "0000:41:00.0", "0x10de", "0x030200", "vfio-pci", "42")
	fakePCI(t, sys, "0000:41:00.1", "0x10de", "0x040300", "vfio-pci", "42") // its audio function
	fakePCI(t, sys, "0000:42:00.0", "0x10de", "0x030200", "nvidia", "43")
	fakePCI(t, sys, "0000:43:00.0", "0x8086", "0x030000", "vfio-pci", "44")
	if devs, err := VFIODevices(sys, dev); !errors.Is(err, ErrVFIONotReady) || !strings.Contains(err.Error(), "modprobe vfio-pci") {
		t.Errorf("without /dev/vfio: %v, %v; want ErrVFIONotReady naming modprobe vfio-pci", devs, err)
	}
	mknod(t, dev, "/dev/vfio/vfio", 10, 196)
	mknod(t, dev, "/dev/vfio/42", 240, 0)
	devs, err := VFIODevices(sys, dev)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 {
		t.Fatalf("devices %+v, want the one NVIDIA GPU on vfio-pci", devs)
	}
	d := devs[0]
	for k, want := range map[string]string{"type": TypeVFIO, "pcieBusID": "0000:41:00.0", "vendorID": "0x10de", "deviceID": "0x2330"} {
		if v := d.Slice.Attributes[resourceName(k)].StringValue; v == nil || *v != want {
			t.Errorf("%s = %v, want %s", k, v, want)
		}
	}
	if g := d.Slice.Attributes["iommuGroup"].IntValue; d.Slice.Name != "gpu-vfio-0" || g == nil || *g != 42 {
		t.Errorf("name %s, iommuGroup %v; want gpu-vfio-0, 42", d.Slice.Name, g)
	}
	if !reflect.DeepEqual(d.Nodes, []string{"/dev/vfio/vfio", "/dev/vfio/42"}) {
		t.Errorf("nodes %v", d.Nodes)
	}

	// Through the plugin: published beside the GPUs, a claim gets the nodes.
	e := newEnvSetup(t, "h100x8", func(e *testEnv, base string) {
		e.sysRoot = sys
		mknod(t, e.devRoot, "/dev/vfio/vfio", 10, 196)
		mknod(t, e.devRoot, "/dev/vfio/42", 240, 0)
	})
	if _, ok := deviceByName(e.drv.Devices(), "gpu-vfio-0"); !ok {
		t.Fatalf("gpu-vfio-0 not published: %d devices", len(e.drv.Devices()))
	}
	c := e.claim("vm", "gpu-vfio-0")
	oci := inject(t, e.cdiRoot, cdiIDs(t, e.prepare(c), c))
	if got, want := devicePaths(oci), []string{"/dev/vfio/42", "/dev/vfio/vfio"}; !reflect.DeepEqual(got, want) || len(oci.Mounts) > 0 {
		t.Errorf("a vfio claim injects %v and mounts %v, want %v only", got, oci.Mounts, want)
	}

	// No IOMMU group: refused naming the kernel options.
	sys2 := t.TempDir()
	fakePCI(t, sys2, "0000:41:00.0", "0x10de", "0x030200", "vfio-pci", "")
	if _, err := VFIODevices(sys2, dev); !errors.Is(err, ErrVFIONotReady) || !strings.Contains(err.Error(), "intel_iommu=on") {
		t.Errorf("without an IOMMU group: %v", err)
	}
	e2 := newEnvSetup(t, "h100x8", func(e *testEnv, base string) { e.sysRoot = sys2 })
	if n := len(e2.drv.Devices()); n != 8 {
		t.Errorf("with a vfio GPU that cannot be offered the plugin publishes %d devices, want the 8 GPUs", n)
	}
}

func resourceName(s string) resourceapi.QualifiedName { return resourceapi.QualifiedName(s) }
