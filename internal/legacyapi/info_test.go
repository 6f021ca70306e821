package legacyapi

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/readings"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

// infoText splits /gpu/info's text into one map of rows per device (keys as
// statusText makes them) and the P2P Available lines of each device.
func infoText(t *testing.T, text string) ([]map[string]string, [][]string) {
	t.Helper()
	var rest []string
	var p2p [][]string
	inP2P := false
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "Device #"):
			p2p = append(p2p, nil)
			inP2P = false
		case line == "  P2P Available":
			inP2P = true
			continue
		case inP2P && strings.HasPrefix(line, "    "):
			p2p[len(p2p)-1] = append(p2p[len(p2p)-1], strings.TrimSpace(line))
			continue
		default:
			inP2P = false
		}
		rest = append(rest, line)
	}
	return statusText(t, strings.Join(rest, "\n")), p2p
}

// model is what the test knows of a GPU model from its data sheet, apart
// from the code under test: CUDA cores, the PCIe link, the memory bus width
// and the maximum memory clock.
type model struct {
	cores, pcieGen, pcieLanes, busBits, memMHz uint
}

var models = map[string]model{
	"NVIDIA H100 80GB HBM3": {16896, 5, 16, 5120, 2619},
	"NVIDIA H200":           {16896, 5, 16, 6016, 3201},
	"NVIDIA L40S":           {18176, 4, 16, 384, 9001},
	"NVIDIA A100-SXM4-40GB": {6912, 4, 16, 5120, 1215},
}

// Each fact /gpu/info now fills, field by field in JSON and in the text, on
// hosts of NVSwitch, PCIe-only and MIG-enabled GPUs.
func TestGPUInfoFacts(t *testing.T) {
	const ( // link numbers, as the original and NVIDIA's later bindings numbered them
		crossCPU, sameCPU, singleSwitch, eighteenNVLinks = 1, 2, 5, 24
	)
	for _, tc := range []struct {
		profile string
		// link between GPUs i and j, 0 for none
		link func(i, j int) LinkType
		// independent values for the first GPU: MB/s
		pciBW, memBW uint
	}{
		{"h100x8", func(i, j int) LinkType { return eighteenNVLinks }, 16 * 3938, 2 * 2619 * 640},
		{"h200x8", func(i, j int) LinkType { return eighteenNVLinks }, 16 * 3938, 2 * 3201 * 752},
		// Two sockets, two switches per socket, two GPUs per switch.
		{"l40sx8", func(i, j int) LinkType {
			switch {
			case i/2 == j/2:
				return singleSwitch
			case i/4 == j/4:
				return sameCPU
			}
			return crossCPU
		}, 16 * 1969, 2 * 9001 * 48},
		// MIG-enabled GPUs have no peer access, NVLink or not.
		{"a100x2-mig", func(i, j int) LinkType { return 0 }, 16 * 1969, 2 * 1215 * 640},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			f := newFixtureGPUs(t, fakedriver.LayoutStandard, "sim:"+tc.profile)
			var info Info
			getJSON(t, f.url+"/gpu/info/json", &info)
			_, text, _ := get(t, f.url+"/gpu/info")
			rows, p2p := infoText(t, text)
			if len(info.Devices) != len(f.sys.Devices) || len(rows) != len(f.sys.Devices) || len(p2p) != len(f.sys.Devices) {
				t.Fatalf("%d JSON and %d text devices, want %d:\n%s", len(info.Devices), len(rows), len(f.sys.Devices), text)
			}
			for i, d := range info.Devices {
				s := f.sys.Devices[i]
				m, ok := models[s.Name]
				if !ok {
					t.Fatalf("the test knows no model %q", s.Name)
				}
				// JSON.
				if d.Cores == nil || *d.Cores != m.cores {
					t.Errorf("GPU %d: Cores %v, want %d", i, show(d.Cores), m.cores)
				}
				if d.CPUAffinity == nil || int(*d.CPUAffinity) != s.NUMANode {
					t.Errorf("GPU %d: CPUAffinity %v, want %d", i, show(d.CPUAffinity), s.NUMANode)
				}
				if d.PCI.Bandwidth == nil || *d.PCI.Bandwidth != tc.pciBW {
					t.Errorf("GPU %d: PCI.Bandwidth %v, want %d", i, show(d.PCI.Bandwidth), tc.pciBW)
				}
				if d.Memory.ECC == nil || !*d.Memory.ECC {
					t.Errorf("GPU %d: Memory.ECC %v, want true", i, show(d.Memory.ECC))
				}
				if want := 2 * m.memMHz * m.busBits / 8; d.Memory.Bandwidth == nil || *d.Memory.Bandwidth != want || want != tc.memBW {
					t.Errorf("GPU %d: Memory.Bandwidth %v, want %d (%d)", i, show(d.Memory.Bandwidth), want, tc.memBW)
				}
				if d.Memory.Shared != nil || d.Memory.Constant != nil || d.Memory.L2Cache != nil {
					t.Errorf("GPU %d: CUDA-only facts not null: %+v", i, d.Memory)
				}
				var wantLinks []P2PLink
				for j, peer := range f.sys.Devices {
					if l := tc.link(i, j); j != i && l != 0 {
						wantLinks = append(wantLinks, P2PLink{BusID: peer.PCIBusID, Link: l})
					}
				}
				if fmt.Sprint(d.Topology) != fmt.Sprint(wantLinks) {
					t.Errorf("GPU %d: Topology %v, want %v", i, d.Topology, wantLinks)
				}

				// The text says the same, in the original's words and units.
				r := rows[i]
				for k, want := range map[string]string{
					"Cores":            fmt.Sprint(m.cores),
					"CPU Affinity":     fmt.Sprintf("NUMA node%d", s.NUMANode),
					"PCI/Bandwidth":    fmt.Sprintf("%d MB/s", tc.pciBW),
					"Memory/ECC":       "true",
					"Memory/Bandwidth": fmt.Sprintf("%d MB/s", tc.memBW),
					"Memory/Constant":  "N/A",
					"Memory/Shared":    "N/A",
					"Memory/L2 Cache":  "N/A",
				} {
					if r[k] != want {
						t.Errorf("GPU %d text: %s is %q, want %q", i, k, r[k], want)
					}
				}
				var wantText []string
				for _, l := range wantLinks {
					wantText = append(wantText, l.BusID+" - "+l.Link.String())
				}
				if strings.Join(p2p[i], "\n") != strings.Join(wantText, "\n") {
					t.Errorf("GPU %d text: P2P Available %q, want %q", i, p2p[i], wantText)
				}
				if _, none := r["P2P Available"]; none != (len(wantLinks) == 0) || none && r["P2P Available"] != "None" {
					t.Errorf("GPU %d text: P2P Available row %q with %d links", i, r["P2P Available"], len(wantLinks))
				}
			}
			checkAligned(t, text)
			_, raw, _ := get(t, f.url+"/v1.0/gpu/info/json")
			golden(t, "gpu-info-"+tc.profile+".json", raw)
			golden(t, "gpu-info-"+tc.profile+".txt", text)
		})
	}
}

func show[T any](p *T) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

// directHost has direct NVLinks (one of them listed on one side only, as a
// hand-written file may), GPUs without NVLink between them, NUMA nodes
// known and unknown, and a model the simulator has no data sheet for.
const directHost = `
driverVersion: "535.104.05"
cudaDriverVersion: "12.2"
devices:
- {name: "Tesla V100-SXM2-16GB", pciBusID: "00000000:06:00.0", memoryMiB: 16160, computeCapability: "7.0",
   nvlinks: [{peer: 1, links: 2}, {peer: 2, links: 1}]}
- {name: "Tesla V100-SXM2-16GB", pciBusID: "00000000:07:00.0", memoryMiB: 16160, computeCapability: "7.0",
   nvlinks: [{peer: 0, links: 2}]}
- {name: "Tesla V100-SXM2-16GB", pciBusID: "00000000:0A:00.0", memoryMiB: 16160, computeCapability: "7.0", numaNode: 0}
- {name: "Tesla V100-SXM2-16GB", pciBusID: "00000000:85:00.0", memoryMiB: 16160, computeCapability: "7.0", numaNode: 1}
`

// Direct NVLinks count per pair and come before the PCIe level; pairs
// without NVLink get the level where their PCIe paths meet; properties of
// an unknown model are null / N/A, and an unknown NUMA node is node 0, as
// in the original.
func TestGPUInfoDirectNVLinks(t *testing.T) {
	sys, err := sim.Parse([]byte(directHost), "direct")
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(New(Options{System: sys, Reader: readings.NewSim(sys)}))
	defer ts.Close()
	var info Info
	getJSON(t, ts.URL+"/gpu/info/json", &info)
	bus := func(i int) string { return sys.Devices[i].PCIBusID }
	want := [][]P2PLink{
		{{bus(1), 8}, {bus(2), 7}, {bus(3), 2}}, // Two NVLinks, Single NVLink, Same CPU socket
		{{bus(0), 8}, {bus(2), 5}, {bus(3), 2}}, // behind one switch with GPU 2 (buses 07, 0A)
		{{bus(0), 7}, {bus(1), 5}, {bus(3), 1}}, // GPU 3 is on the other socket
		{{bus(0), 2}, {bus(1), 2}, {bus(2), 1}},
	}
	for i, d := range info.Devices {
		if fmt.Sprint(d.Topology) != fmt.Sprint(want[i]) {
			t.Errorf("GPU %d: Topology %v, want %v", i, d.Topology, want[i])
		}
		if d.Cores != nil || d.PCI.Bandwidth != nil || d.Memory.ECC != nil || d.Memory.Bandwidth != nil {
			t.Errorf("GPU %d: an unknown model has facts: %+v", i, d)
		}
		if wantNode := max(sys.Devices[i].NUMANode, 0); d.CPUAffinity == nil || int(*d.CPUAffinity) != wantNode {
			t.Errorf("GPU %d: CPUAffinity %v, want %d", i, show(d.CPUAffinity), wantNode)
		}
	}
	_, text, _ := get(t, ts.URL+"/gpu/info")
	rows, p2p := infoText(t, text)
	wantP2P := []string{bus(1) + " - Two NVLinks", bus(2) + " - Single NVLink", bus(3) + " - Same CPU socket"}
	if strings.Join(p2p[0], "\n") != strings.Join(wantP2P, "\n") {
		t.Errorf("GPU 0 text: P2P Available %q, want %q", p2p[0], wantP2P)
	}
	if p2p[2][1] != bus(1)+" - Single PCI switch" || p2p[3][2] != bus(2)+" - Cross CPU socket" {
		t.Errorf("text: P2P Available %q", p2p)
	}
	for k, want := range map[string]string{"Cores": "N/A", "PCI/Bandwidth": "N/A", "Memory/ECC": "N/A", "Memory/Bandwidth": "N/A", "CPU Affinity": "NUMA node0"} {
		if rows[0][k] != want {
			t.Errorf("GPU 0 text: %s is %q, want %q", k, rows[0][k], want)
		}
	}
}

// Without a Reader, or for a GPU the Reader cannot read, the properties are
// null and the NVLink peers discovery saw are still listed; such facts are
// read again on the next request, complete ones only once.
func TestGPUInfoUnreadable(t *testing.T) {
	f := newFixture(t, fakedriver.LayoutStandard)
	partial := &gpu.System{Devices: f.sys.Devices[1:]} // knows nothing of GPU 0
	for name, reader := range map[string]Reader{"one GPU unreadable": readings.NewSim(partial), "no reader": nil, "all readable": readings.NewSim(f.sys)} {
		t.Run(name, func(t *testing.T) {
			srv := New(Options{System: f.sys, Driver: f.inv, Reader: reader})
			ts := httptest.NewServer(srv)
			defer ts.Close()
			var info Info
			getJSON(t, ts.URL+"/gpu/info/json", &info)
			for i, d := range info.Devices {
				known := reader != nil && (i > 0 || name == "all readable")
				if (d.Cores != nil) != known || (d.PCI.Bandwidth != nil) != known || (d.Memory.ECC != nil) != known || (d.Memory.Bandwidth != nil) != known {
					t.Errorf("GPU %d: facts %+v, want known %v", i, d, known)
				}
				if len(d.Topology) != 7 || d.Topology[0].Link != 24 {
					t.Errorf("GPU %d: Topology %v, want the 7 others over 18 NVLinks", i, d.Topology)
				}
			}
			srv.mu.Lock()
			cached := srv.fixed != nil
			srv.mu.Unlock()
			if cached != (name != "one GPU unreadable") {
				t.Errorf("facts cached: %v", cached)
			}
		})
	}
}

func TestLinkType(t *testing.T) {
	for l, want := range map[LinkType]string{
		0: "N/A", 1: "Cross CPU socket", 2: "Same CPU socket", 3: "Host PCI bridge", 4: "Multiple PCI switches",
		5: "Single PCI switch", 6: "Same board", 7: "Single NVLink", 8: "Two NVLinks", 18: "Twelve NVLinks",
		24: "Eighteen NVLinks", 25: "19 NVLinks", NVLinks(36): "36 NVLinks",
	} {
		if got := l.String(); got != want {
			t.Errorf("LinkType(%d) = %q, want %q", l, got, want)
		}
	}
	if NVLinks(1) != 7 || NVLinks(18) != 24 {
		t.Errorf("NVLinks(1), NVLinks(18) = %d, %d, want 7, 24", NVLinks(1), NVLinks(18))
	}
	// JSON has the number, as the original's encoder wrote its P2PLinkType.
	b, err := json.Marshal(P2PLink{BusID: "00000000:1B:00.0", Link: NVLinks(18)})
	if err != nil || string(b) != `{"BusID":"00000000:1B:00.0","Link":24}` {
		t.Errorf("JSON %s %v", b, err)
	}
}

// MIG-enabled GPUs have no peer access even where NVLink joins them; the
// rule holds without a Reader to say so.
func TestGPUInfoMIGNoPeers(t *testing.T) {
	sys, err := sim.Load("a100x2-mig")
	if err != nil {
		t.Fatal(err)
	}
	if nvlinksBetween(sys.Devices[0], sys.Devices[1]) != 12 {
		t.Fatalf("the profile's GPUs are not joined by 12 NVLinks: %+v", sys.Devices)
	}
	for _, d := range New(Options{System: sys}).GPUInfo().Devices {
		if d.Topology != nil {
			t.Errorf("%s: Topology %v, want none", d.UUID, d.Topology)
		}
	}
}
