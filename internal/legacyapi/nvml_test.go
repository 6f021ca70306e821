package legacyapi

import (
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/gpu/readings"
	"github.com/gantry-gpu/gantry/internal/smitest"
)

// TestGPUInfoNVML runs on a GPU host: /gpu/info over the real driver has
// every fact NVML can give filled, null only where the original needed
// CUDA, the same in the text, and P2P Available lists exactly the GPUs
// nvidia-smi says may be read directly, with the NVLink count nvidia-smi
// shows (NV18 on an HGX H100/H200). Skipped without a driver.
//
// On a GPU host, from the repository root:
//
//	export CGO_CFLAGS=-Wno-deprecated-declarations
//	go test -v -run 'NVML' ./internal/gpu/readings ./internal/legacyapi
//
// or, where the host has no Go, build there and copy the two test binaries:
//
//	go test -c -o readings.test ./internal/gpu/readings
//	go test -c -o legacyapi.test ./internal/legacyapi
//	./readings.test -test.run NVML -test.v; ./legacyapi.test -test.run NVML -test.v
func TestGPUInfoNVML(t *testing.T) {
	cfg := config.Default()
	cfg.GPUs = "nvml"
	sys, err := discover.GPUs(cfg, false)
	if err != nil {
		t.Skipf("no NVIDIA driver here: %v", err)
	}
	r, unload, err := readings.NewNVML("")
	if err != nil {
		t.Fatal(err)
	}
	defer unload()
	ts := httptest.NewServer(New(Options{System: sys, Reader: r}))
	defer ts.Close()
	var info Info
	getJSON(t, ts.URL+"/gpu/info/json", &info)
	_, text, _ := get(t, ts.URL+"/gpu/info")
	t.Logf("/gpu/info:\n%s", text)
	rows, p2p := infoText(t, text)
	if len(info.Devices) != len(sys.Devices) || len(rows) != len(sys.Devices) {
		t.Fatalf("%d JSON and %d text devices, want %d", len(info.Devices), len(rows), len(sys.Devices))
	}
	access := smitest.Matrix(t, "topo", "-p2p", "r")
	paths := smitest.Matrix(t, "topo", "-m")
	nvRE := regexp.MustCompile(`^NV([0-9]+)$`)
	for i, d := range info.Devices {
		// Data centre GPUs of the last generations give all of these.
		for name, p := range map[string]*uint{"CPUAffinity": d.CPUAffinity, "Cores": d.Cores, "Power": d.Power,
			"PCI.Bandwidth": d.PCI.Bandwidth, "Memory.Global": d.Memory.Global, "Memory.Bandwidth": d.Memory.Bandwidth,
			"Clocks.Cores": d.Clocks.Cores, "Clocks.Memory": d.Clocks.Memory} {
			if p == nil || *p == 0 && name != "CPUAffinity" {
				t.Errorf("GPU %d: %s is %s", i, name, show(p))
			}
		}
		if d.Memory.ECC == nil || d.PCI.BAR1 == nil {
			t.Errorf("GPU %d: ECC %s, BAR1 %s", i, show(d.Memory.ECC), show(d.PCI.BAR1))
		}
		if d.Memory.Shared != nil || d.Memory.Constant != nil || d.Memory.L2Cache != nil {
			t.Errorf("GPU %d: CUDA-only facts not null: %+v", i, d.Memory)
		}
		if d.Memory.Bandwidth != nil && d.Clocks.Memory != nil && *d.Memory.Bandwidth%(2**d.Clocks.Memory) != 0 {
			t.Errorf("GPU %d: memory bandwidth %d is not 2 x %d MHz x the bus bytes", i, *d.Memory.Bandwidth, *d.Clocks.Memory)
		}
		for k, v := range map[string]string{"Cores": show(d.Cores), "CPU Affinity": "NUMA node" + show(d.CPUAffinity),
			"PCI/Bandwidth": show(d.PCI.Bandwidth) + " MB/s", "Memory/ECC": show(d.Memory.ECC), "Memory/Bandwidth": show(d.Memory.Bandwidth) + " MB/s"} {
			if rows[i][k] != v {
				t.Errorf("GPU %d text: %s is %q, JSON says %q", i, k, rows[i][k], v)
			}
		}
		if len(d.Topology) != len(p2p[i]) {
			t.Errorf("GPU %d: %d P2P links in JSON, %d in the text", i, len(d.Topology), len(p2p[i]))
		}
		if access == nil {
			continue
		}
		listed := map[string]LinkType{}
		for _, l := range d.Topology {
			listed[l.BusID] = l.Link
		}
		for j, peer := range sys.Devices {
			if j == i {
				continue
			}
			link, ok := listed[peer.PCIBusID]
			if ok != (smitest.At(access, i, j) == "OK") {
				t.Errorf("GPU %d: peer %d listed %v, nvidia-smi topo -p2p r says %s", i, j, ok, smitest.At(access, i, j))
			}
			if m := nvRE.FindStringSubmatch(smitest.At(paths, i, j)); m != nil && ok {
				if n, _ := strconv.Atoi(m[1]); link != NVLinks(n) {
					t.Errorf("GPU %d: peer %d over %s, nvidia-smi topo -m says %s", i, j, link, m[0])
				}
			}
		}
	}
}
