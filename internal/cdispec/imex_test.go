package cdispec

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// The IMEX channels' spec: one device per channel node, named by its
// number, as NVIDIA's generates it; checked with the CNCF CDI library.
func TestGenerateIMEX(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "dev/nvidia-caps-imex-channels")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := GenerateIMEX(root); !errors.Is(err, ErrNoDevices) {
		t.Fatalf("no channels: %v, want ErrNoDevices", err)
	}
	for _, n := range []uint32{0, 1, 2047} {
		err := unix.Mknod(filepath.Join(dir, "channel"+strconv.Itoa(int(n))), unix.S_IFCHR|0o666, int(unix.Mkdev(508, n)))
		if errors.Is(err, unix.EPERM) {
			t.Skip("mknod needs root")
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	spec, err := GenerateIMEX(root)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Kind != "nvidia.com/imex-channel" {
		t.Errorf("kind %s", spec.Kind)
	}
	want := map[string]string{"0": "/dev/nvidia-caps-imex-channels/channel0", "1": "/dev/nvidia-caps-imex-channels/channel1",
		"2047": "/dev/nvidia-caps-imex-channels/channel2047"}
	if len(spec.Devices) != len(want) {
		t.Fatalf("devices %+v, want %v", spec.Devices, want)
	}
	for _, d := range spec.Devices {
		n := d.ContainerEdits.DeviceNodes
		if len(n) != 1 || n[0].Path != want[d.Name] || n[0].Major != 508 || n[0].HostPath != filepath.Join(root, want[d.Name]) {
			t.Errorf("device %s: %+v", d.Name, n)
		}
	}
	if got := Names(spec); len(got) != 3 || got[0] != "nvidia.com/imex-channel=0" {
		t.Errorf("names %v", got)
	}
}
