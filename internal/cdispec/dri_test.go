package cdispec

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/driver"
)

// A GPU whose DRM nodes udev names by PCI address gets them in its CDI
// device (with the graphics capability), and only that GPU.
func TestGenerateDRINodes(t *testing.T) {
	sys := testSystem()
	devRoot := makeDevRoot(t, sys)
	dri := filepath.Join(devRoot, "dev", "dri")
	if err := os.MkdirAll(filepath.Join(dri, "by-path"), 0o755); err != nil {
		t.Fatal(err)
	}
	// GPU 0 is 00000000:18:00.0 in the test system.
	for name, minor := range map[string]uint32{"card1": 1, "renderD128": 128} {
		if err := unix.Mknod(filepath.Join(dri, name), unix.S_IFCHR|0o666, int(unix.Mkdev(226, minor))); err != nil && !errors.Is(err, unix.EEXIST) {
			t.Fatal(err)
		}
	}
	for kind, target := range map[string]string{"card": "../card1", "render": "../renderD128"} {
		if err := os.Symlink(target, filepath.Join(dri, "by-path", "pci-0000:18:00.0-"+kind)); err != nil {
			t.Fatal(err)
		}
	}
	nodes := func(caps []driver.Capability, device string) map[string]bool {
		spec, err := Generate(sys, testInventory(), Options{DevRoot: devRoot, HookPath: hookPath, Capabilities: caps})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, d := range spec.Devices {
			if d.Name == device {
				for _, n := range d.ContainerEdits.DeviceNodes {
					got[n.Path] = true
				}
			}
		}
		return got
	}
	if got := nodes(nil, "0"); !got["/dev/dri/card1"] || !got["/dev/dri/renderD128"] {
		t.Errorf("device 0 with every capability: nodes %v, want /dev/dri/card1 and renderD128", got)
	}
	if got := nodes(nil, "1"); got["/dev/dri/card1"] {
		t.Errorf("device 1 got GPU 0's DRM node: %v", got)
	}
	if got := nodes([]driver.Capability{driver.Compute, driver.Utility}, "0"); got["/dev/dri/card1"] {
		t.Errorf("compute-only spec has DRM nodes: %v", got)
	}
}
