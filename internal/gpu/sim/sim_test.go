package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func TestProfilesLoadAndValidate(t *testing.T) {
	want := []string{"a100x2-mig", "h100x1", "h100x8", "h200x8", "l40sx8"}
	if got := Profiles(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("Profiles() = %v, want %v", got, want)
	}
	uuid := regexp.MustCompile(`^(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	for _, p := range Profiles() {
		t.Run(p, func(t *testing.T) {
			sys, err := Load(p)
			if err != nil {
				t.Fatal(err)
			}
			if sys.Backend != "sim:"+p {
				t.Errorf("Backend = %q", sys.Backend)
			}
			if len(sys.Devices) == 0 {
				t.Fatal("no devices")
			}
			for i, d := range sys.Devices {
				if d.Index != i || d.Minor != i {
					t.Errorf("device %d: index %d minor %d", i, d.Index, d.Minor)
				}
				if !uuid.MatchString(d.UUID) || !strings.HasPrefix(d.UUID, "GPU-") {
					t.Errorf("device %d: UUID %q", i, d.UUID)
				}
				if _, err := gpu.ParsePCIAddress(d.PCIBusID); err != nil || len(d.PCIBusID) != 16 {
					t.Errorf("device %d: PCI bus id %q (%v)", i, d.PCIBusID, err)
				}
				if d.Brand != "nvidia" || d.Architecture == "" || d.MemoryMiB == 0 || d.NUMANode < 0 {
					t.Errorf("device %d: %+v", i, d)
				}
				for j, m := range d.MIGDevices {
					if !uuid.MatchString(m.UUID) || !strings.HasPrefix(m.UUID, "MIG-") || m.Parent != i || m.Index != j {
						t.Errorf("device %d MIG %d: %+v", i, j, m)
					}
				}
			}
			// A profile is also an example: it must parse the same from its text.
			text, err := ProfileYAML(p)
			if err != nil {
				t.Fatal(err)
			}
			again, err := Parse(text, p)
			if err != nil {
				t.Fatal(err)
			}
			again.Backend = sys.Backend
			a, _ := json.Marshal(sys)
			b, _ := json.Marshal(again)
			if !bytes.Equal(a, b) {
				t.Error("Parse(ProfileYAML) differs from Load")
			}
		})
	}
}

func TestProfileFacts(t *testing.T) {
	h100, err := Load("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	if h100.DriverVersion != "580.159.04" || h100.CUDADriverVersion != "13.0" || len(h100.Devices) != 8 {
		t.Fatalf("h100x8: %s %s %d devices", h100.DriverVersion, h100.CUDADriverVersion, len(h100.Devices))
	}
	for i, d := range h100.Devices {
		wantNUMA := 0
		if i >= 4 {
			wantNUMA = 1
		}
		if d.Name != "NVIDIA H100 80GB HBM3" || d.MemoryMiB != 81559 || d.ComputeCapability != "9.0" ||
			d.Architecture != "Hopper" || d.NUMANode != wantNUMA ||
			len(d.NVLinks) != 1 || d.NVLinks[0] != (gpu.NVLink{Switch: true, Links: 18}) {
			t.Errorf("h100x8 device %d: %+v", i, d)
		}
	}
	h200, err := Load("h200x8")
	if err != nil {
		t.Fatal(err)
	}
	if d := h200.Devices[7]; d.Name != "NVIDIA H200" || d.MemoryMiB != 143771 || len(h200.Devices) != 8 {
		t.Errorf("h200x8: %+v", d)
	}
	a100, err := Load("a100x2-mig")
	if err != nil {
		t.Fatal(err)
	}
	if a100.DriverVersion != "550.54.15" || a100.CUDADriverVersion != "12.4" {
		t.Errorf("a100x2-mig versions %s %s", a100.DriverVersion, a100.CUDADriverVersion)
	}
	g0, g1 := a100.Devices[0], a100.Devices[1]
	if !g0.MIGEnabled || len(g0.MIGDevices) != 3 || len(g1.MIGDevices) != 7 || g0.ComputeCapability != "8.0" || g0.Architecture != "Ampere" {
		t.Fatalf("a100x2-mig: %+v", a100)
	}
	if g0.NVLinks[0].PeerUUID != g1.UUID || g1.NVLinks[0].PeerUUID != g0.UUID || g0.NVLinks[0].Links != 12 {
		t.Errorf("a100x2-mig NVLinks: %+v %+v", g0.NVLinks, g1.NVLinks)
	}
	// gpu0/gi2/access is minor 3 + 2*9 = 21 and its ci0 22; gpu1/gi7 is
	// 3 + 135 + 63 = 201 (the driver's static table: 15 GIs x (1 + 8 CIs) per GPU).
	if m := g0.MIGDevices[0]; m.Profile != "3g.20gb" || m.GPUInstance != 2 || m.GICapMinor != 21 || m.CICapMinor != 22 || m.Name() != "0:0" {
		t.Errorf("a100x2-mig 0:0 = %+v", m)
	}
	if m := g1.MIGDevices[0]; m.GICapMinor != 201 || m.CICapMinor != 202 || m.MemoryMiB != 5*1024 {
		t.Errorf("a100x2-mig 1:0 = %+v", m)
	}
}

// TestGolden pins every generated value of h100x8 (UUIDs included): a change
// here changes what users' CDI specs and clusters see. Run with -update to
// accept a deliberate change.
func TestGolden(t *testing.T) {
	sys, err := Load("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.MarshalIndent(sys, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	golden := filepath.Join("testdata", "h100x8.golden.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("h100x8 differs from %s (run go test -update if the change is deliberate):\n%s", golden, got)
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := Load("x"); !errors.Is(err, ErrUnknownProfile) ||
		err.Error() != `unknown simulated GPU profile "x": use one of a100x2-mig, h100x1, h100x8, h200x8, l40sx8 or a path to a YAML file` {
		t.Errorf("Load(x) = %v", err)
	}
	if _, err := Load("../profiles/h100x8"); err == nil || errors.Is(err, ErrUnknownProfile) {
		t.Errorf("a path must be read as a file, got %v", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "lab.yml")
	body := `driverVersion: 535.129.03
cudaDriverVersion: 12.2
devices:
- {name: Tesla T4, memoryMiB: 15360, computeCapability: 7.5, brand: tesla, pciBusID: "0000:3b:00.0"}
- {name: Tesla T4, memoryMiB: 15360, computeCapability: "7.5", minor: 4, uuid: GPU-00000000-1111-2222-3333-444444444444}
`
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	sys, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	d0, d1 := sys.Devices[0], sys.Devices[1]
	if sys.Backend != "sim:"+p || sys.CUDADriverVersion != "12.2" || d0.Architecture != "Turing" || d0.PCIBusID != "00000000:3B:00.0" ||
		d0.NUMANode != -1 || d1.Minor != 4 || d1.UUID != "GPU-00000000-1111-2222-3333-444444444444" || d1.Brand != "unknown" ||
		d1.PCIBusID != "00000000:02:00.0" {
		t.Errorf("%+v", sys)
	}
	// The seed is the file name: the same file elsewhere gives the same UUIDs,
	// another name gives others.
	again, err := Parse([]byte(body), "lab")
	if err != nil || again.Devices[0].UUID != d0.UUID {
		t.Errorf("seed from file name: %v %s", err, again.Devices[0].UUID)
	}
	other, _ := Parse([]byte(body), "lab2")
	if other.Devices[0].UUID == d0.UUID {
		t.Error("different seeds gave the same UUID")
	}
	withSeed, _ := Parse([]byte("seed: lab\n"+body), "ignored")
	if withSeed.Devices[0].UUID != d0.UUID {
		t.Error("seed key not used")
	}
}

func TestParseErrors(t *testing.T) {
	const head = "driverVersion: \"550.54.15\"\ncudaDriverVersion: \"12.4\"\ndevices:\n"
	const dev = "- name: GPU\n  memoryMiB: 1024\n  computeCapability: \"8.0\"\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown key", head + dev + "  colour: green\n", `unknown key "colour"`},
		{"unknown top key", "driverVersoin: 1\n" + head, `unknown key "driverVersoin"`},
		{"not yaml", "devices: [", "did not find expected node content"},
		{"wrong type", head + "- name: GPU\n  memoryMiB: lots\n", "memoryMiB"},
		{"wrong type in a flow mapping", head + dev + "  migEnabled: true\n  migDevices: [{profile: 1g.5gb, gpuInstance: x}]\n", "line 8: gpuInstance: cannot unmarshal"},
		{"duplicate key", head + dev + "  name: other\n", `mapping key "name" already defined`},
		{"no driver", "cudaDriverVersion: \"12.4\"\n", `driverVersion: ""`},
		{"bad cuda", "driverVersion: \"550.54.15\"\ncudaDriverVersion: twelve\n", `cudaDriverVersion: "twelve"`},
		{"no name", head + "- memoryMiB: 1\n  computeCapability: \"8.0\"\n", "devices[0].name: missing"},
		{"no memory", head + "- name: GPU\n  computeCapability: \"8.0\"\n", "devices[0].memoryMiB: missing"},
		{"bad cc", head + dev + "- name: GPU\n  memoryMiB: 1\n  computeCapability: 8.x\n", `devices[1].computeCapability: "8.x"`},
		{"bad cc 3 parts", head + "- name: GPU\n  memoryMiB: 1\n  computeCapability: 8.0.1\n", `devices[0].computeCapability: "8.0.1"`},
		{"missing cc", head + "- name: GPU\n  memoryMiB: 1\n", `devices[0].computeCapability: ""`},
		{"bad brand", head + dev + "  brand: Tesla\n", `devices[0].brand: "Tesla"`},
		{"bad uuid", head + dev + "  uuid: GPU-1234\n", `devices[0].uuid: "GPU-1234"`},
		{"bad bus", head + dev + "  pciBusID: 18:00\n", "devices[0].pciBusID"},
		{"bad minor", head + dev + "  minor: -1\n", "devices[0].minor: -1"},
		{"bad numa", head + dev + "  numaNode: -2\n", "devices[0].numaNode: -2"},
		{"dup minor", head + dev + dev + "  minor: 0\n", "devices[1]: minor 0 is also used by devices[0]"},
		{"dup uuid", head + dev + "  uuid: GPU-00000000-1111-2222-3333-444444444444\n" + dev + "  uuid: GPU-00000000-1111-2222-3333-444444444444\n", "devices[1]: uuid GPU-00000000-1111-2222-3333-444444444444 is also used by devices[0]"},
		{"dup bus", head + dev + "  pciBusID: 0000:18:00.0\n" + dev + "  pciBusID: 00000000:18:00.0\n", "devices[1]: pciBusID 00000000:18:00.0 is also used"},
		{"mig disabled", head + dev + "  migDevices: [{profile: 1g.5gb}]\n", "devices[0].migDevices: 1 MIG devices on a GPU with migEnabled false"},
		{"bad mig profile", head + dev + "  migEnabled: true\n  migDevices: [{profile: big}]\n", `devices[0].migDevices[0].profile: "big"`},
		{"bad mig uuid", head + dev + "  migEnabled: true\n  migDevices: [{profile: 1g.5gb, uuid: GPU-00000000-1111-2222-3333-444444444444}]\n", "devices[0].migDevices[0].uuid"},
		{"mig gi range", head + dev + "  migEnabled: true\n  migDevices: [{profile: 1g.5gb, gpuInstance: 15}]\n", "devices[0].migDevices[0].gpuInstance"},
		{"mig ci range", head + dev + "  migEnabled: true\n  migDevices: [{profile: 1g.5gb, computeInstance: 8}]\n", "devices[0].migDevices[0].gpuInstance"},
		{"mig on minor 32", head + dev + "  minor: 32\n  migEnabled: true\n  migDevices: [{profile: 1g.5gb}]\n", "GPU minors 0-31"},
		{"dup gi", head + dev + "  migEnabled: true\n  migDevices: [{profile: 1g.5gb, gpuInstance: 7}, {profile: 1g.5gb, gpuInstance: 7}]\n", "devices[0].migDevices[1]: gpuInstance/computeInstance 0/7/0 is also used by devices[0].migDevices[0]"},
		{"peer missing", head + dev + "  nvlinks: [{peer: 3, links: 4}]\n", `devices[0].nvlinks[0].peer: "3": no GPU has that index or UUID`},
		{"peer uuid missing", head + dev + "  nvlinks: [{peer: GPU-x, links: 4}]\n", `devices[0].nvlinks[0].peer: "GPU-x"`},
		{"peer self", head + dev + "  nvlinks: [{peer: 0, links: 4}]\n", "cannot link to itself"},
		{"peer empty", head + dev + "  nvlinks: [{links: 4}]\n", "devices[0].nvlinks[0].peer: missing"},
		{"peer and switch", head + dev + dev + "  nvlinks: [{peer: 0, switch: true, links: 4}]\n", "devices[1].nvlinks[0].peer"},
		{"links", head + dev + dev + "  nvlinks: [{peer: 0}]\n", "devices[1].nvlinks[0].links: 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml), "t")
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is not one line", err)
			}
		})
	}
}

func TestParseDefaults(t *testing.T) {
	sys, err := Parse([]byte(`driverVersion: "550.54.15"
cudaDriverVersion: 12.0
devices:
- name: A
  memoryMiB: 40960
  computeCapability: 8.0
  migEnabled: true
  migDevices:
  - profile: MIG 1g.10gb
  - {profile: 1c.3g.20gb+me, computeInstance: 1, memoryMiB: 19968, uuid: MIG-00000000-1111-2222-3333-444444444444}
- name: B
  memoryMiB: 1
  computeCapability: "12.10"
  nvlinks: [{peer: 0, links: 2}]
`), "seed")
	if err != nil {
		t.Fatal(err)
	}
	if sys.CUDADriverVersion != "12.0" || sys.Backend != "" {
		t.Errorf("system: %+v", sys)
	}
	a, b := sys.Devices[0], sys.Devices[1]
	if a.ComputeCapability != "8.0" || a.Architecture != "Ampere" || a.PCIBusID != "00000000:01:00.0" {
		t.Errorf("device A: %+v", a)
	}
	m0, m1 := a.MIGDevices[0], a.MIGDevices[1]
	if m0.Profile != "1g.10gb" || m0.GPUInstance != 1 || m0.ComputeInstance != 0 || m0.MemoryMiB != 10240 || m0.GICapMinor != 12 || m0.CICapMinor != 13 {
		t.Errorf("MIG 0: %+v", m0)
	}
	if m1.GPUInstance != 2 || m1.ComputeInstance != 1 || m1.MemoryMiB != 19968 || m1.CICapMinor != 3+2*9+1+1 || m1.Name() != "0:1" {
		t.Errorf("MIG 1: %+v", m1)
	}
	if b.ComputeCapability != "12.10" || b.Architecture != "Blackwell" || b.NVLinks[0] != (gpu.NVLink{PeerUUID: a.UUID, Links: 2}) || b.MIGEnabled {
		t.Errorf("device B: %+v", b)
	}
	// An empty host is a valid host: a node without GPUs.
	empty, err := Parse([]byte(`{"driverVersion": "550.54.15", "cudaDriverVersion": "12.4"}`), "")
	if err != nil || len(empty.Devices) != 0 {
		t.Errorf("empty host: %v %+v", err, empty)
	}
}

// FuzzLoadYAML feeds arbitrary text to Parse: it must return a system or an
// error, never panic, and a returned system must satisfy the invariants that
// consumers rely on.
func FuzzLoadYAML(f *testing.F) {
	for _, p := range Profiles() {
		b, _ := ProfileYAML(p)
		f.Add(b)
	}
	f.Add([]byte("devices: [{name: x, nvlinks: [{peer: '-1'}]}]"))
	f.Add([]byte(`{"driverVersion":"1.2","cudaDriverVersion":"1.0","devices":[{"name":"x","memoryMiB":1,"computeCapability":"1.0","minor":255}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		sys, err := Parse(data, "fuzz")
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		uuids := map[string]bool{}
		for i, d := range sys.Devices {
			if d.Index != i || uuids[d.UUID] {
				t.Fatalf("device %d: %+v", i, d)
			}
			uuids[d.UUID] = true
			for _, m := range d.MIGDevices {
				if uuids[m.UUID] || m.GICapMinor < 3 || m.CICapMinor <= m.GICapMinor {
					t.Fatalf("MIG device: %+v", m)
				}
				uuids[m.UUID] = true
			}
		}
	})
}

// Bare scalars keep their text in string fields, YAML 1.1's yes/no fill
// bool fields, and JSON is read as well.
func TestParseScalars(t *testing.T) {
	sys, err := Parse([]byte("driverVersion: 550.54.15\ncudaDriverVersion: 13.0\ndevices:\n- name: GPU\n  memoryMiB: 1024\n  computeCapability: 9.0\n  migEnabled: yes\n"), "t")
	if err != nil {
		t.Fatal(err)
	}
	if d := sys.Devices[0]; sys.CUDADriverVersion != "13.0" || d.ComputeCapability != "9.0" || !d.MIGEnabled {
		t.Errorf("parsed %+v", sys)
	}
	js, err := Parse([]byte(`{"driverVersion": "550.54.15", "cudaDriverVersion": "13.0", "devices": [{"name": "GPU", "memoryMiB": 1024, "computeCapability": "9.0", "migEnabled": true}]}`), "t")
	if err != nil || !reflect.DeepEqual(js, sys) {
		t.Errorf("the same as JSON: %+v, %v", js, err)
	}
}
