package labels

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func load(t *testing.T, profile string) *gpu.System {
	t.Helper()
	sys, err := sim.Load(profile)
	if err != nil {
		t.Fatal(err)
	}
	return sys
}

// TestGenerate checks the whole label set of each case against a golden
// file (reviewed by hand against GFD's rules) and the labels that matter
// most against values written out here.
func TestGenerate(t *testing.T) {
	tests := []struct {
		name    string
		profile string
		cfg     Config
		want    map[string]string // a subset, checked on top of the golden file
		absent  []string
	}{
		{
			name: "h100x1", profile: "h100x1",
			cfg: Config{Machine: "PowerEdge XE9680"},
			want: map[string]string{
				"nvidia.com/gpu.present":                  "true",
				"nvidia.com/gpu.product":                  "NVIDIA-H100-80GB-HBM3",
				"nvidia.com/gpu.count":                    "1",
				"nvidia.com/gpu.memory":                   "81559",
				"nvidia.com/gpu.family":                   "hopper",
				"nvidia.com/gpu.compute.major":            "9",
				"nvidia.com/gpu.compute.minor":            "0",
				"nvidia.com/gpu.replicas":                 "1",
				"nvidia.com/gpu.sharing-strategy":         "none",
				"nvidia.com/gpu.machine":                  "PowerEdge-XE9680",
				"nvidia.com/gpu.mode":                     "compute",
				"nvidia.com/cuda.driver.major":            "580",
				"nvidia.com/cuda.driver.minor":            "159",
				"nvidia.com/cuda.driver.rev":              "04",
				"nvidia.com/cuda.driver-version.full":     "580.159.04",
				"nvidia.com/cuda.driver-version.revision": "04",
				"nvidia.com/cuda.runtime.major":           "13",
				"nvidia.com/cuda.runtime.minor":           "0",
				"nvidia.com/cuda.runtime-version.full":    "13.0",
				"nvidia.com/mig.capable":                  "true",
				"nvidia.com/mps.capable":                  "false",
				"nvidia.com/vgpu.present":                 "false",
			},
			absent: []string{"nvidia.com/mig.strategy", "nvidia.com/gfd.timestamp"},
		},
		{
			name: "h100x8-time-slicing", profile: "h100x8",
			cfg: Config{SharingStrategy: SharingTimeSlicing, Replicas: 4},
			want: map[string]string{
				"nvidia.com/gpu.product":          "NVIDIA-H100-80GB-HBM3-SHARED",
				"nvidia.com/gpu.count":            "8",
				"nvidia.com/gpu.replicas":         "4",
				"nvidia.com/gpu.sharing-strategy": "time-slicing",
				"nvidia.com/gpu.machine":          "unknown",
			},
		},
		{
			name: "h100x8-mps-renamed", profile: "h100x8",
			cfg: Config{SharingStrategy: SharingMPS, Replicas: 2, Renamed: true},
			want: map[string]string{
				"nvidia.com/gpu.product":          "NVIDIA-H100-80GB-HBM3",
				"nvidia.com/gpu.replicas":         "2",
				"nvidia.com/gpu.sharing-strategy": "mps",
				"nvidia.com/mps.capable":          "true",
			},
		},
		{
			name: "a100x2-mig-none", profile: "a100x2-mig",
			want: map[string]string{
				"nvidia.com/gpu.product":          "NVIDIA-A100-SXM4-40GB",
				"nvidia.com/gpu.count":            "2",
				"nvidia.com/gpu.replicas":         "0", // MIG-enabled GPUs are never shared
				"nvidia.com/gpu.sharing-strategy": "none",
				"nvidia.com/gpu.memory":           "40960",
				"nvidia.com/gpu.family":           "ampere",
				"nvidia.com/mig.capable":          "true",
			},
			absent: []string{"nvidia.com/mig.strategy", "nvidia.com/mig-1g.5gb.count"},
		},
		{
			// GPU 0 has three profiles: the single strategy cannot use it.
			name: "a100x2-mig-single", profile: "a100x2-mig",
			cfg: Config{MIGStrategy: MIGSingle},
			want: map[string]string{
				"nvidia.com/mig.strategy":         "single",
				"nvidia.com/gpu.product":          "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
				"nvidia.com/gpu.count":            "0",
				"nvidia.com/gpu.replicas":         "0",
				"nvidia.com/gpu.sharing-strategy": "",
				"nvidia.com/gpu.memory":           "0",
				"nvidia.com/gpu.family":           "ampere",
			},
			absent: []string{"nvidia.com/gpu.multiprocessors"},
		},
		{
			name: "a100x2-mig-mixed", profile: "a100x2-mig",
			cfg: Config{MIGStrategy: MIGMixed, SharingStrategy: SharingTimeSlicing, Replicas: 2,
				SharedResources: []string{"nvidia.com/mig-1g.5gb"}},
			want: map[string]string{
				"nvidia.com/mig.strategy":                 "mixed",
				"nvidia.com/gpu.count":                    "2",
				"nvidia.com/gpu.replicas":                 "0",
				"nvidia.com/mig-1g.5gb.product":           "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
				"nvidia.com/mig-1g.5gb.count":             "8",
				"nvidia.com/mig-1g.5gb.replicas":          "2",
				"nvidia.com/mig-1g.5gb.sharing-strategy":  "time-slicing",
				"nvidia.com/mig-1g.5gb.memory":            "4864", // the first 1g.5gb device's
				"nvidia.com/mig-1g.5gb.multiprocessors":   "14",
				"nvidia.com/mig-1g.5gb.slices.gi":         "1",
				"nvidia.com/mig-1g.5gb.slices.ci":         "1",
				"nvidia.com/mig-1g.5gb.engines.copy":      "1",
				"nvidia.com/mig-1g.5gb.engines.decoder":   "0",
				"nvidia.com/mig-3g.20gb.product":          "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
				"nvidia.com/mig-3g.20gb.count":            "1",
				"nvidia.com/mig-3g.20gb.replicas":         "1",
				"nvidia.com/mig-3g.20gb.sharing-strategy": "none",
				"nvidia.com/mig-3g.20gb.memory":           "19968",
				"nvidia.com/mig-3g.20gb.multiprocessors":  "42",
				"nvidia.com/mig-3g.20gb.engines.decoder":  "2",
				"nvidia.com/mig-2g.10gb.count":            "1",
				"nvidia.com/mig-2g.10gb.slices.gi":        "2",
				"nvidia.com/mig-2g.10gb.engines.copy":     "2",
				"nvidia.com/mig-2g.10gb.engines.ofa":      "0",
				"nvidia.com/mig-2g.10gb.engines.jpeg":     "0",
				"nvidia.com/mig-2g.10gb.engines.encoder":  "0",
				"nvidia.com/mig-2g.10gb.multiprocessors":  "28",
				"nvidia.com/mig-2g.10gb.sharing-strategy": "none",
				"nvidia.com/mig-2g.10gb.product":          "NVIDIA-A100-SXM4-40GB-MIG-2g.10gb",
				"nvidia.com/mig-2g.10gb.memory":           "9856",
				"nvidia.com/mig-2g.10gb.replicas":         "1",
				"nvidia.com/mig-2g.10gb.slices.ci":        "2",
				"nvidia.com/mig-2g.10gb.engines.decoder":  "1",
				"nvidia.com/mig-3g.20gb.slices.gi":        "3",
				"nvidia.com/gpu.product":                  "NVIDIA-A100-SXM4-40GB",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sys := load(t, tc.profile)
			got, err := Generate(sys, tc.cfg, ForSystem(sys, ""))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if g, ok := got[k]; !ok || g != v {
					t.Errorf("%s = %q (present %v), want %q", k, g, ok, v)
				}
			}
			for _, k := range tc.absent {
				if _, ok := got[k]; ok {
					t.Errorf("%s = %q, want no such label", k, got[k])
				}
			}
			golden(t, filepath.Join("testdata", tc.name+".labels"), FeatureFile(got))
		})
	}
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("labels differ from %s (go test -update rewrites it):\n got:\n%s\nwant:\n%s", path, got, want)
	}
}

// TestMIGSingleValid: both GPUs split into seven 1g.5gb devices.
func TestMIGSingleValid(t *testing.T) {
	sys := load(t, "a100x2-mig")
	sys.Devices[0].MIGDevices = append([]gpu.MIGDevice(nil), sys.Devices[1].MIGDevices...)
	for i := range sys.Devices[0].MIGDevices {
		sys.Devices[0].MIGDevices[i].MemoryMiB = 4864
	}
	got, err := Generate(sys, Config{MIGStrategy: MIGSingle, SharingStrategy: SharingTimeSlicing, Replicas: 3}, ForSystem(sys, ""))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"nvidia.com/mig.strategy":         "single",
		"nvidia.com/gpu.product":          "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
		"nvidia.com/gpu.count":            "14",
		"nvidia.com/gpu.replicas":         "3",
		"nvidia.com/gpu.sharing-strategy": "time-slicing",
		"nvidia.com/gpu.memory":           "4864",
		"nvidia.com/gpu.multiprocessors":  "14",
		"nvidia.com/gpu.slices.gi":        "1",
		"nvidia.com/gpu.slices.ci":        "1",
		"nvidia.com/gpu.engines.copy":     "1",
		"nvidia.com/gpu.engines.decoder":  "0",
		"nvidia.com/gpu.engines.encoder":  "0",
		"nvidia.com/gpu.engines.jpeg":     "0",
		"nvidia.com/gpu.engines.ofa":      "0",
		"nvidia.com/gpu.family":           "ampere",
		"nvidia.com/gpu.compute.major":    "8",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if _, ok := got["nvidia.com/mig-1g.5gb.count"]; ok {
		t.Error("single strategy wrote mixed-strategy labels")
	}
}

func TestMIGSingleMixedWithFullGPU(t *testing.T) {
	sys := load(t, "a100x2-mig")
	sys.Devices[1].MIGEnabled = false
	sys.Devices[1].MIGDevices = nil
	got, err := Generate(sys, Config{MIGStrategy: MIGSingle}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got["nvidia.com/gpu.product"] != "NVIDIA-A100-SXM4-40GB-MIG-INVALID" {
		t.Errorf("product = %q, want MIG-INVALID", got["nvidia.com/gpu.product"])
	}
}

func TestNoGPUs(t *testing.T) {
	got, err := Generate(&gpu.System{DriverVersion: "550.54.15", CUDADriverVersion: "12.4"}, Config{Timestamp: time.Unix(1700000000, 0)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Set{"nvidia.com/vgpu.present": "false", "nvidia.com/gfd.timestamp": "1700000000"}
	if string(FeatureFile(got)) != string(FeatureFile(want)) {
		t.Errorf("labels without GPUs:\n%s\nwant:\n%s", FeatureFile(got), FeatureFile(want))
	}
}

func TestConfigErrors(t *testing.T) {
	sys := load(t, "h100x1")
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{MIGStrategy: "split"}, `migStrategy "split": use none, single or mixed`},
		{Config{SharingStrategy: "timeslicing"}, `sharing strategy "timeslicing": use none, time-slicing or mps`},
		{Config{SharingStrategy: SharingTimeSlicing, Replicas: -1}, "replicas -1"},
		{Config{Replicas: 4}, "replicas 4 with sharing strategy none"},
	} {
		_, err := Generate(sys, tc.cfg, nil)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one containing %q", tc.cfg, err, tc.want)
		}
	}
	mig := load(t, "a100x2-mig")
	if _, err := Generate(mig, Config{SharingStrategy: SharingMPS, Replicas: 2}, nil); err == nil || !strings.Contains(err.Error(), "MIG enabled") {
		t.Errorf("mps on MIG GPUs: error %v, want one about MIG", err)
	}
	bad := load(t, "h100x1")
	bad.DriverVersion = "580"
	if _, err := Generate(bad, Config{}, nil); err == nil || !strings.Contains(err.Error(), `driver version "580"`) {
		t.Errorf("bad driver version: error %v", err)
	}
}

func TestSanitise(t *testing.T) {
	for in, want := range map[string]string{
		"NVIDIA H100 80GB HBM3":      "NVIDIA-H100-80GB-HBM3",
		"Tesla T4":                   "Tesla-T4",
		"  NVIDIA   A100-SXM4-40GB ": "NVIDIA-A100-SXM4-40GB",
		"NVIDIA RTX A6000 (rev/2)":   "NVIDIA-RTX-A6000-rev2",
		"DGX_H100.v1":                "DGX_H100.v1",
		"":                           "",
	} {
		if got := sanitise(in); got != want {
			t.Errorf("sanitise(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFamily(t *testing.T) {
	for _, tc := range []struct {
		major, minor int
		want         string
	}{
		{7, 0, "volta"}, {7, 5, "turing"}, {8, 0, "ampere"}, {8, 6, "ampere"}, {8, 9, "ada-lovelace"},
		{9, 0, "hopper"}, {10, 0, "blackwell"}, {12, 0, "blackwell"}, {11, 0, "undefined"}, {13, 0, "rubin"},
	} {
		if got := Family(tc.major, tc.minor); got != tc.want {
			t.Errorf("Family(%d, %d) = %q, want %q", tc.major, tc.minor, got, tc.want)
		}
	}
}

func TestPCIClassFromSysfs(t *testing.T) {
	root := t.TempDir()
	write := func(addr, class string) {
		dir := filepath.Join(root, "sys/bus/pci/devices", addr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "class"), []byte(class+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sys := load(t, "a100x2-mig")
	sys.Backend = "nvml"
	write("0000:07:00.0", "0x030200")
	write("0000:0f:00.0", "0x030000")
	hw := ForSystem(sys, root)
	got, err := Generate(sys, Config{}, hw)
	if err != nil {
		t.Fatal(err)
	}
	if got["nvidia.com/gpu.mode"] != "unknown" {
		t.Errorf("mixed classes: mode %q, want unknown", got["nvidia.com/gpu.mode"])
	}
	write("0000:0f:00.0", "0x030000")
	write("0000:07:00.0", "0x030000")
	got, _ = Generate(sys, Config{}, hw)
	if got["nvidia.com/gpu.mode"] != "graphics" {
		t.Errorf("VGA class: mode %q, want graphics", got["nvidia.com/gpu.mode"])
	}
	if err := os.MkdirAll(filepath.Join(root, "sys/class/dmi/id"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "sys/class/dmi/id/product_name"), []byte("DGX H100\n"), 0o644)
	if m := MachineType(root); m != "DGX H100" {
		t.Errorf("MachineType = %q", m)
	}
}

func TestParseProfile(t *testing.T) {
	for _, tc := range []struct {
		in     string
		gi, ci int
		base   string
	}{
		{"3g.20gb", 3, 3, "3g.20gb"}, {"1c.3g.20gb", 3, 1, "3g.20gb"}, {"1g.10gb+me", 1, 1, "1g.10gb.me"}, {"MIG 7g.80gb", 7, 7, "7g.80gb"},
	} {
		gi, ci, base, err := parseProfile(tc.in)
		if err != nil || gi != tc.gi || ci != tc.ci || base != tc.base {
			t.Errorf("parseProfile(%q) = %d, %d, %q, %v", tc.in, gi, ci, base, err)
		}
	}
	for _, bad := range []string{"", "3x.20gb", "g.20gb", "xc.3g.20gb"} {
		if _, _, _, err := parseProfile(bad); err == nil {
			t.Errorf("parseProfile(%q) succeeded", bad)
		}
	}
}

func TestFeatureFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gantry")
	s := Set{"nvidia.com/gpu.count": "8", "nvidia.com/cuda.driver.rev": ""}
	if err := WriteFeatureFile(path, s); err != nil {
		t.Fatal(err)
	}
	if err := WriteFeatureFile(path, Set{"nvidia.com/gpu.count": "4"}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != "nvidia.com/gpu.count=4\n" {
		t.Errorf("file = %q", data)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", fi.Mode())
	}
	err = WriteFeatureFile(filepath.Join(dir, "missing", "gantry"), s)
	if err == nil || !strings.Contains(err.Error(), "features.d directory mounted") {
		t.Errorf("missing directory: error %v", err)
	}
}
