package legacyapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/readings"
)

// fixture is a real server over a fake driver root and eight simulated H100s.
type fixture struct {
	url string
	sys *gpu.System
	inv *driver.Inventory
	res *fakedriver.Result
}

func newFixture(t *testing.T, layout string) *fixture {
	t.Helper()
	return newFixtureGPUs(t, layout, "sim:h100x8")
}

// newFixtureGPUs is newFixture with other GPUs (a --gpus value).
func newFixtureGPUs(t *testing.T, layout, gpus string) *fixture {
	t.Helper()
	if _, err := os.Stat("/usr/bin/gcc"); err != nil {
		t.Skip("gcc is needed to build the fake driver (scripts/deps.sh --test installs it)")
	}
	res, err := fakedriver.Build(t.TempDir(), fakedriver.Options{Layout: layout})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.GPUs = gpus
	cfg.DriverRoot = res.Root
	sys, err := discover.GPUs(cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := discover.Driver(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(Options{System: sys, Driver: inv, Reader: readings.NewSim(sys), DevRoot: cfg.EffectiveDevRoot()})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return &fixture{url: ts.URL, sys: sys, inv: inv, res: res}
}

func get(t *testing.T, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	code, body, h := get(t, url)
	if code != 200 {
		t.Fatalf("GET %s: %d %s", url, code, body)
	}
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET %s: Content-Type %q", url, ct)
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("GET %s: %v\n%s", url, err, body)
	}
}

// underRoot rewrites "--device=/dev/X" words to the HOST:CONTAINER form
// used for nodes under a dev root.
func underRoot(root, words string) string {
	var out []string
	for _, w := range strings.Fields(words) {
		if n, ok := strings.CutPrefix(w, "--device="); ok {
			w = "--device=" + filepath.Join(root, n) + ":" + n
		}
		out = append(out, w)
	}
	return strings.Join(out, " ")
}

func TestDockerCLI(t *testing.T) {
	f := newFixture(t, fakedriver.LayoutStandard)
	uvmTools := "--device=/dev/nvidia-uvm-tools "
	if _, err := os.Stat(filepath.Join(f.res.Root, "dev/nvidia-uvm-tools")); err != nil {
		uvmTools = ""
	}
	ctl := "--device=/dev/nvidiactl --device=/dev/nvidia-uvm " + uvmTools
	for _, tc := range []struct {
		query string
		code  int
		devs  string // the GPU --device words expected, or the error text
	}{
		{"", 200, "--device=/dev/nvidia0 --device=/dev/nvidia1 --device=/dev/nvidia2 --device=/dev/nvidia3 --device=/dev/nvidia4 --device=/dev/nvidia5 --device=/dev/nvidia6 --device=/dev/nvidia7"},
		{"?dev=*", 200, "--device=/dev/nvidia0 --device=/dev/nvidia1 --device=/dev/nvidia2 --device=/dev/nvidia3 --device=/dev/nvidia4 --device=/dev/nvidia5 --device=/dev/nvidia6 --device=/dev/nvidia7"},
		{"?dev=0+1", 200, "--device=/dev/nvidia0 --device=/dev/nvidia1"},
		{"?dev=5,2,5", 200, "--device=/dev/nvidia2 --device=/dev/nvidia5"},
		{"?dev=8", 400, "invalid device: 8"},
		{"?dev=x", 400, "invalid device: x"},
		{"?dev=GPU-ffffffff", 400, "invalid device: GPU-ffffffff"},
		{"?vol=nvidia_driver&dev=3", 200, "--device=/dev/nvidia3"},
		{"?vol=nvidia_driver+cuda", 400, "invalid volume: cuda"},
	} {
		t.Run(tc.query, func(t *testing.T) {
			for _, prefix := range []string{"", "/v1.0"} {
				code, body, _ := get(t, f.url+prefix+"/docker/cli"+tc.query)
				if code != tc.code {
					t.Fatalf("%s: code %d, want %d: %s", prefix, code, tc.code, body)
				}
				if code != 200 {
					if !strings.Contains(body, tc.devs) {
						t.Errorf("error %q does not name %q", body, tc.devs)
					}
					continue
				}
				if strings.HasSuffix(body, "\n") || strings.Contains(body, "  ") {
					t.Errorf("body is not single-space separated words without newline: %q", body)
				}
				want := underRoot(f.res.Root, ctl+tc.devs)
				if !strings.HasSuffix(body, " "+want) {
					t.Errorf("body %q\nwant devices %q", body, want)
				}
				if strings.Contains(body, "--volume-driver") {
					t.Errorf("body names a volume driver: %q", body)
				}
			}
		})
	}

	// By UUID, as the original accepted (a prefix is enough).
	uuid := f.sys.Devices[6].UUID
	_, body, _ := get(t, f.url+"/docker/cli?dev="+uuid[:12])
	if !strings.HasSuffix(body, underRoot(f.res.Root, " --device=/dev/nvidia6")) {
		t.Errorf("dev=%s: %q", uuid[:12], body)
	}

	// Standard layout: every program and library is bound read-only at the
	// original volume's place, libraries under their SONAME.
	var a DockerArgs
	getJSON(t, f.url+"/docker/cli/json?dev=0+1", &a)
	if a.VolumeDriver != "" {
		t.Errorf("VolumeDriver %q", a.VolumeDriver)
	}
	wantDevs := strings.Fields(strings.ReplaceAll(underRoot(f.res.Root, ctl+"--device=/dev/nvidia0 --device=/dev/nvidia1"), "--device=", ""))
	if strings.Join(a.Devices, " ") != strings.Join(wantDevs, " ") {
		t.Errorf("Devices %v, want %v", a.Devices, wantDevs)
	}
	binds := map[string]string{}
	for _, v := range a.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) != 3 || parts[2] != "ro" {
			t.Fatalf("volume %q is not HOST:CONTAINER:ro", v)
		}
		if _, err := os.Stat(parts[0]); err != nil {
			t.Errorf("volume %q: host file: %v", v, err)
		}
		binds[parts[1]] = parts[0]
	}
	for ctr, host := range map[string]string{
		"/usr/local/nvidia/lib64/libcuda.so.1":      filepath.Join(f.res.Root, "usr/lib/x86_64-linux-gnu/libcuda.so."+f.inv.Version),
		"/usr/local/nvidia/lib64/libnvidia-ml.so.1": filepath.Join(f.res.Root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so."+f.inv.Version),
		"/usr/local/nvidia/bin/nvidia-smi":          filepath.Join(f.res.Root, "usr/bin/nvidia-smi"),
	} {
		if got := binds[ctr]; got != host {
			t.Errorf("bind for %s: %q, want %q", ctr, got, host)
		}
	}
	if len(binds) != len(f.inv.Libraries)+len(f.inv.Binaries) {
		t.Errorf("%d binds for %d libraries and %d programs", len(binds), len(f.inv.Libraries), len(f.inv.Binaries))
	}
	// The text form says the same as the JSON form.
	_, text, _ := get(t, f.url+"/docker/cli?dev=0+1")
	if want := strings.Join(a.Words(), " "); text != want {
		t.Errorf("text %q\njson %q", text, want)
	}
}

// On a host whose nodes are in /dev, the devices are plain paths, as the
// original gave them.
func TestDockerCLIHostDev(t *testing.T) {
	f := newFixture(t, fakedriver.LayoutStandard)
	srv := New(Options{System: f.sys, Driver: f.inv, DevRoot: "/"})
	a, err := srv.DockerCLI("1 GPU-"+f.sys.Devices[4].UUID[4:], "")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(a.Devices, " ")
	want := "/dev/nvidiactl /dev/nvidia-uvm /dev/nvidia1 /dev/nvidia4"
	if _, err := os.Stat("/dev/nvidia-uvm-tools"); err == nil {
		want = "/dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia1 /dev/nvidia4"
	}
	if got != want {
		t.Errorf("Devices %q, want %q", got, want)
	}
}

func TestDockerCLIOwnDirectory(t *testing.T) {
	f := newFixture(t, fakedriver.LayoutGKE)
	var a DockerArgs
	getJSON(t, f.url+"/docker/cli/json", &a)
	want := filepath.Join(f.res.Root, "usr/local/nvidia") + ":/usr/local/nvidia:ro"
	if len(a.Volumes) != 1 || a.Volumes[0] != want {
		t.Errorf("Volumes %v, want [%s]", a.Volumes, want)
	}
	if len(a.Devices) < 2+8 {
		t.Errorf("Devices %v", a.Devices)
	}
}

func TestGPUInfo(t *testing.T) {
	f := newFixture(t, fakedriver.LayoutStandard)
	var info Info
	getJSON(t, f.url+"/gpu/info/json", &info)
	if info.Version.Driver != f.sys.DriverVersion || info.Version.CUDA != f.sys.CUDADriverVersion || info.Version.Driver == "" {
		t.Errorf("Version %+v, want %s / %s", info.Version, f.sys.DriverVersion, f.sys.CUDADriverVersion)
	}
	if len(info.Devices) != 8 {
		t.Fatalf("%d devices", len(info.Devices))
	}
	for i, d := range info.Devices {
		s := f.sys.Devices[i]
		if d.UUID != s.UUID || d.Path != s.DevicePath() || d.PCI.BusID != s.PCIBusID || str(d.Model) != s.Name ||
			d.Memory.Global == nil || uint64(*d.Memory.Global) != s.MemoryMiB || str(d.Arch) != s.ComputeCapability {
			t.Errorf("device %d: %+v, from %+v", i, d, s)
		}
	}
	// The original's key names, nulls included.
	_, raw, _ := get(t, f.url+"/v1.0/gpu/info/json")
	for _, key := range []string{`"Version":{"Driver":`, `"CUDA":`, `"UUID":`, `"Path":"/dev/nvidia0"`, `"Model":"NVIDIA H100`,
		`"Power":700,"CPUAffinity":0,"PCI":{"BusID":`, `"BAR1":131072,"Bandwidth":63008}`, `"Clocks":{"Cores":1980,"Memory":2619}`,
		`"Topology":[{"BusID":"00000000:43:00.0","Link":24},`, `"Family":"Hopper","Arch":"9.0","Cores":16896,`,
		`"Memory":{"ECC":true,"Global":81559,"Shared":null,"Constant":null,"L2Cache":null,"Bandwidth":3352320}`} {
		if !strings.Contains(raw, key) {
			t.Errorf("/gpu/info/json lacks %s:\n%.400s", key, raw)
		}
	}

	code, text, h := get(t, f.url+"/gpu/info")
	if code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
		t.Fatalf("%d %s", code, h.Get("Content-Type"))
	}
	// As the original's tabwriter laid it out: a blank line first and last,
	// and the values of each run of rows two spaces after its longest label.
	if !strings.HasPrefix(text, "\nDriver version:") || !strings.HasSuffix(text, " - Eighteen NVLinks\n\n") {
		t.Errorf("/gpu/info does not start and end as the original's:\n%q", text)
	}
	checkAligned(t, text)
	for _, want := range []string{
		"\nDriver version:          " + f.sys.DriverVersion + "\n",
		"Supported CUDA version:  " + f.sys.CUDADriverVersion + "\n\n",
		"\nDevice #7\n",
		"  UUID:          " + f.sys.Devices[7].UUID + "\n",
		"  Power:         700 W\n",
		"    Bus ID:     " + f.sys.Devices[7].PCIBusID + "\n",
		"    BAR1:       131072 MiB\n",
		"    Global:     " + "81559 MiB\n",
		"    Cores:   1980 MHz\n", // the maximum
		"  CPU Affinity:  NUMA node1\n",
		"  Cores:         16896\n",
		"    Bandwidth:  63008 MB/s\n",
		"    ECC:        true\n",
		"    Bandwidth:  3352320 MB/s\n",
		"  P2P Available\n    00000000:1B:00.0 - Eighteen NVLinks\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/gpu/info lacks %q:\n%s", want, text)
		}
	}
}

func TestReadOnly(t *testing.T) {
	f := newFixture(t, fakedriver.LayoutStandard)
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		req, _ := http.NewRequest(method, f.url+"/docker/cli", strings.NewReader("dev=0"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: %d, Allow %q", method, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
	if code, _, _ := get(t, f.url+"/docker/volumes"); code != http.StatusNotFound {
		t.Errorf("unknown path: %d", code)
	}
}

func TestSelectDevices(t *testing.T) {
	sys := &gpu.System{Devices: []gpu.Device{{Index: 0, UUID: "GPU-aaaa"}, {Index: 1, UUID: "GPU-bbbb"}, {Index: 2, UUID: "GPU-cccc"}}}
	for spec, want := range map[string]string{
		"": "0 1 2", "*": "0 1 2", "2 0": "0 2", "GPU-bb": "1", "GPU-cccc,0": "0 2", " 1 , 1 ": "1",
		"3": "error", "-1": "error", "GPU-dd": "error", "1 x": "error",
	} {
		devs, err := SelectDevices(sys, spec)
		got := "error"
		if err == nil {
			var idx []string
			for _, d := range devs {
				idx = append(idx, string(rune('0'+d.Index)))
			}
			got = strings.Join(idx, " ")
		}
		if got != want {
			t.Errorf("SelectDevices(%q) = %s (%v), want %s", spec, got, err, want)
		}
	}
}
