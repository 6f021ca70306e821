package nvml

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// Real content from an H100 host (driver 580.159.04).
const (
	realVersion = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n"
	realInfo    = "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 41\nGPU UUID: \t GPU-39e35f32-4837-44d0-7a6b-e06d373ae8e9\nVideo BIOS: \t 96.00.da.00.0c\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t 0000:00:06.0\nDevice Minor: \t 0\nGPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n"
)

// info makes the information file of another GPU from the real one.
func info(uuid, bus string, minor int, excluded bool) string {
	s := strings.Replace(realInfo, "GPU-39e35f32-4837-44d0-7a6b-e06d373ae8e9", uuid, 1)
	s = strings.Replace(s, "0000:00:06.0", bus, 1)
	s = strings.Replace(s, "Device Minor: \t 0", fmt.Sprintf("Device Minor: \t %d", minor), 1)
	if excluded {
		s = strings.Replace(s, "GPU Excluded:\t No", "GPU Excluded:\t Yes", 1)
	}
	return s
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeHost builds root/proc and root/sys with three GPUs whose directory
// order is not their bus order, and one excluded GPU.
func fakeHost(t *testing.T) (root string) {
	root = t.TempDir()
	proc := filepath.Join(root, "proc", "driver", "nvidia")
	write(t, filepath.Join(proc, "version"), realVersion)
	gpus := []struct {
		uuid, bus string
		minor     int
		excluded  bool
	}{
		{"GPU-cccccccc-4837-44d0-7a6b-e06d373ae8e9", "0000:9d:00.0", 2, false},
		{"GPU-39e35f32-4837-44d0-7a6b-e06d373ae8e9", "0000:1b:00.0", 0, false},
		{"GPU-dddddddd-4837-44d0-7a6b-e06d373ae8e9", "0000:43:00.0", 3, true},
		{"GPU-bbbbbbbb-4837-44d0-7a6b-e06d373ae8e9", "0000:43:00.0", 1, false},
	}
	for _, g := range gpus {
		dir := g.bus
		if g.excluded {
			dir = "0000:44:00.0"
		}
		write(t, filepath.Join(proc, "gpus", dir, "information"), info(g.uuid, g.bus, g.minor, g.excluded))
	}
	write(t, filepath.Join(root, "sys/bus/pci/devices/0000:1b:00.0/numa_node"), "0\n")
	write(t, filepath.Join(root, "sys/bus/pci/devices/0000:9d:00.0/numa_node"), "1\n")
	write(t, filepath.Join(root, "sys/bus/pci/devices/0000:43:00.0/numa_node"), "-1\n")
	return root
}

func TestDiscoverProcfs(t *testing.T) {
	root := fakeHost(t)
	sys, err := DiscoverProcfs(filepath.Join(root, "proc"))
	if err != nil {
		t.Fatal(err)
	}
	if sys.Backend != "procfs" || sys.DriverVersion != "580.159.04" || sys.CUDADriverVersion != "" {
		t.Errorf("system %+v", sys)
	}
	want := []gpu.Device{
		{Index: 0, Minor: 0, UUID: "GPU-39e35f32-4837-44d0-7a6b-e06d373ae8e9", PCIBusID: "00000000:1B:00.0", Name: "NVIDIA H100 80GB HBM3", NUMANode: 0},
		{Index: 1, Minor: 1, UUID: "GPU-bbbbbbbb-4837-44d0-7a6b-e06d373ae8e9", PCIBusID: "00000000:43:00.0", Name: "NVIDIA H100 80GB HBM3", NUMANode: -1},
		{Index: 2, Minor: 2, UUID: "GPU-cccccccc-4837-44d0-7a6b-e06d373ae8e9", PCIBusID: "00000000:9D:00.0", Name: "NVIDIA H100 80GB HBM3", NUMANode: 1},
	}
	if len(sys.Devices) != len(want) {
		t.Fatalf("%d devices, want %d: %+v", len(sys.Devices), len(want), sys.Devices)
	}
	for i := range want {
		if fmt.Sprint(sys.Devices[i]) != fmt.Sprint(want[i]) {
			t.Errorf("device %d = %+v, want %+v", i, sys.Devices[i], want[i])
		}
	}
}

func TestDiscoverProcfsMIG(t *testing.T) {
	root := fakeHost(t)
	// MIG mode with instances: the driver adds capabilities/gpu<minor>/mig/gi<N>.
	write(t, filepath.Join(root, "proc/driver/nvidia/capabilities/gpu2/mig/gi3/access"), "DeviceFileMinor: 30\n")
	_, err := DiscoverProcfs(filepath.Join(root, "proc"))
	if !errors.Is(err, ErrMIGNeedsNVML) || !strings.Contains(err.Error(), "GPU-cccccccc") {
		t.Errorf("err = %v, want ErrMIGNeedsNVML naming the GPU", err)
	}
	// MIG capabilities of a GPU without instances (mig/config, monitor) do not count.
	root = fakeHost(t)
	write(t, filepath.Join(root, "proc/driver/nvidia/capabilities/mig/config"), "DeviceFileMinor: 1\n")
	if _, err := DiscoverProcfs(filepath.Join(root, "proc")); err != nil {
		t.Error(err)
	}
}

func TestDiscoverProcfsErrors(t *testing.T) {
	if _, err := DiscoverProcfs(t.TempDir()); !errors.Is(err, ErrDriverNotLoaded) {
		t.Errorf("no driver: %v", err)
	}
	root := t.TempDir()
	write(t, filepath.Join(root, "driver/nvidia/version"), realVersion)
	sys, err := DiscoverProcfs(root)
	if err != nil || len(sys.Devices) != 0 {
		t.Errorf("driver without GPUs: %v %+v", err, sys)
	}
	write(t, filepath.Join(root, "driver/nvidia/gpus/0000:01:00.0/information"), "Model: x\n")
	if _, err := DiscoverProcfs(root); err == nil || !strings.Contains(err.Error(), "information: GPU UUID") {
		t.Errorf("bad information: %v", err)
	}
	write(t, filepath.Join(root, "driver/nvidia/version"), "garbage\n")
	if _, err := DiscoverProcfs(root); err == nil || !strings.Contains(err.Error(), "NVRM version") {
		t.Errorf("bad version: %v", err)
	}
}

func TestParseInformation(t *testing.T) {
	tests := []struct {
		name, in string
		want     information
		err      string
	}{
		{"real", realInfo, information{Model: "NVIDIA H100 80GB HBM3", UUID: "GPU-39e35f32-4837-44d0-7a6b-e06d373ae8e9", BusLocation: "0000:00:06.0"}, ""},
		{"excluded", info("GPU-1", "0000:01:00.0", 7, true), information{Model: "NVIDIA H100 80GB HBM3", UUID: "GPU-1", BusLocation: "0000:01:00.0", Minor: 7, Excluded: true}, ""},
		{"spaces only, no model", "GPU UUID: GPU-2\nBus Location: 0000:02:00.0\nDevice Minor: 1", information{UUID: "GPU-2", BusLocation: "0000:02:00.0", Minor: 1}, ""},
		{"crlf", "GPU UUID: GPU-2\r\nBus Location: 0000:02:00.0\r\nDevice Minor: 1\r\n", information{UUID: "GPU-2", BusLocation: "0000:02:00.0", Minor: 1}, ""},
		{"empty", "", information{}, "GPU UUID"},
		{"no uuid", "Device Minor: 0\nBus Location: 0000:00:06.0\n", information{}, "GPU UUID"},
		{"no minor", "GPU UUID: GPU-1\nBus Location: 0000:00:06.0\n", information{}, "Device Minor"},
		{"bad minor", "GPU UUID: GPU-1\nDevice Minor: x\nBus Location: 0000:00:06.0\n", information{}, "Device Minor"},
		{"minor range", "GPU UUID: GPU-1\nDevice Minor: 256\nBus Location: 0000:00:06.0\n", information{}, "Device Minor"},
		{"no bus", "GPU UUID: GPU-1\nDevice Minor: 0\n", information{}, "Bus Location"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseInformation([]byte(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("err = %v, want one about %s", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestParseNVRMVersion(t *testing.T) {
	tests := []struct{ in, want string }{
		{realVersion, "580.159.04"},
		{"NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.3.0\n", "550.54.15"},
		{"NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.104.05  Sat Aug 19 01:13:00 UTC 2023\n", "535.104.05"},
		{"NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  575.51  Release Build\n", "575.51"},
		{"NVRM version: NVIDIA UNIX Kernel Module\n", ""},
		{"GCC version: 12.3.0\n", ""},
		{"", ""},
	}
	for _, tt := range tests {
		got, err := ParseNVRMVersion([]byte(tt.in))
		if got != tt.want || (err == nil) != (tt.want != "") {
			t.Errorf("ParseNVRMVersion(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestMIGMinors(t *testing.T) {
	// The head of a real /proc/driver/nvidia-caps/mig-minors.
	const head = "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\ngpu0/gi0/ci1/access 5\n"
	table, err := parseMIGMinors([]byte(head))
	if err != nil {
		t.Fatal(err)
	}
	if table["config"] != 1 || table["gpu0/gi0/ci1/access"] != 5 {
		t.Errorf("table %v", table)
	}
	// The whole table as the driver prints it, generated from its layout,
	// must agree with the formula everywhere.
	var b strings.Builder
	b.WriteString("config 1\nmonitor 2\n")
	minor := 3
	for g := range gpu.MaxMIGGPUs {
		for i := range gpu.MaxGPUInstances {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", g, i, minor)
			minor++
			for c := range gpu.MaxComputeInstances {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", g, i, c, minor)
				minor++
			}
		}
	}
	full, err := parseMIGMinors([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range [][3]int{{0, 0, 0}, {0, 1, 0}, {1, 0, 0}, {3, 7, 2}, {31, 14, 7}} {
		gi, ci, err := migCapMinors(full, c[0], c[1], c[2])
		fgi, fci, ferr := gpu.MIGCapMinors(c[0], c[1], c[2])
		if err != nil || ferr != nil || gi != fgi || ci != fci {
			t.Errorf("%v: table %d/%d, formula %d/%d (%v %v)", c, gi, ci, fgi, fci, err, ferr)
		}
	}
	// A table entry wins over the formula (it is what the driver says).
	if gi, ci, _ := migCapMinors(map[string]int{"gpu0/gi1/access": 100, "gpu0/gi1/ci0/access": 101}, 0, 1, 0); gi != 100 || ci != 101 {
		t.Errorf("table not used: %d %d", gi, ci)
	}
	if gi, ci, _ := migCapMinors(nil, 0, 1, 0); gi != 12 || ci != 13 {
		t.Errorf("formula without table: %d %d", gi, ci)
	}
	for _, bad := range []string{"config\n", "config x\n", "a b 3\n", "gpu0 -1\n"} {
		if _, err := parseMIGMinors([]byte(bad)); err == nil {
			t.Errorf("parseMIGMinors(%q) accepted", bad)
		}
	}
}

func TestSmallParsers(t *testing.T) {
	for in, want := range map[int]string{13000: "13.0", 12040: "12.4", 12020: "12.2", 11080: "11.8", 10010: "10.1"} {
		if got := cudaVersion(in); got != want {
			t.Errorf("cudaVersion(%d) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"NVIDIA H100 80GB HBM3 MIG 1g.10gb":    "1g.10gb",
		"NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb": "1c.3g.20gb",
		"NVIDIA H100 NVL MIG 1g.12gb+me":       "1g.12gb+me",
		"A100 3g.20gb":                         "3g.20gb",
	} {
		if got := migProfile(in); got != want {
			t.Errorf("migProfile(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzInformation(f *testing.F) {
	f.Add([]byte(realInfo))
	f.Add([]byte(info("GPU-1", "0000:01:00.0", 7, true)))
	f.Add([]byte("GPU UUID: GPU-2\r\nBus Location: 1:2\r\nDevice Minor: 1\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		info, err := parseInformation(data)
		if err != nil {
			return
		}
		if !strings.HasPrefix(info.UUID, "GPU-") || info.Minor < 0 || info.Minor > 255 || info.BusLocation == "" {
			t.Fatalf("accepted %+v", info)
		}
	})
}

func FuzzNVRMVersion(f *testing.F) {
	f.Add([]byte(realVersion))
	f.Add([]byte("NVRM version: 1.2 x"))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := ParseNVRMVersion(data)
		if err == nil && !versionRE().MatchString(v) {
			t.Fatalf("version %q", v)
		}
	})
}

func FuzzMIGMinors(f *testing.F) {
	f.Add([]byte("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		table, err := parseMIGMinors(data)
		if err != nil {
			return
		}
		for k, v := range table {
			if v < 0 || k == "" {
				t.Fatalf("entry %q %d", k, v)
			}
		}
	})
}
