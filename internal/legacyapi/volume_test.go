package legacyapi

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/gpu/readings"
)

// TestDockerCLIVolumePlugin: with the volume plugin, /docker/cli answers as
// nvidia-docker-plugin 1.0.1 did.
func TestDockerCLIVolumePlugin(t *testing.T) {
	f := newFixture(t, fakedriver.LayoutStandard)
	srv := New(Options{System: f.sys, Driver: f.inv, Reader: readings.NewSim(f.sys), VolumePlugin: true})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	root := f.res.Root
	dev := func(n string) string { return " --device=" + root + n + ":" + n }
	want := "--volume-driver=nvidia-docker --volume=nvidia_driver_" + f.inv.Version + ":/usr/local/nvidia:ro" +
		dev("/dev/nvidiactl") + dev("/dev/nvidia-uvm") + dev("/dev/nvidia-uvm-tools") + dev("/dev/nvidia0")
	for _, q := range []string{"/docker/cli?dev=0", "/v1.0/docker/cli?dev=0&vol=nvidia_driver", "/docker/cli?dev=0&vol=*"} {
		code, body, _ := get(t, ts.URL+q)
		if code != 200 || body != want {
			t.Errorf("%s: %d %q\nwant %q", q, code, body, want)
		}
	}
	var a DockerArgs
	getJSON(t, ts.URL+"/docker/cli/json?dev=1+2", &a)
	if a.VolumeDriver != "nvidia-docker" || len(a.Volumes) != 1 || a.Volumes[0] != "nvidia_driver_"+f.inv.Version+":/usr/local/nvidia:ro" ||
		len(a.Devices) != 5 || !strings.HasSuffix(a.Devices[3], ":/dev/nvidia1") || !strings.HasSuffix(a.Devices[4], ":/dev/nvidia2") {
		t.Errorf("/docker/cli/json: %+v", a)
	}
	// All GPUs by default.
	code, body, _ := get(t, ts.URL+"/docker/cli")
	if code != 200 || strings.Count(body, "--device=") != 3+len(f.sys.Devices) {
		t.Errorf("/docker/cli: %d %q", code, body)
	}
	if code, body, _ := get(t, ts.URL+"/docker/cli?vol=nvidia_other"); code != 400 || !strings.Contains(body, "invalid volume: nvidia_other") {
		t.Errorf("?vol=nvidia_other: %d %q", code, body)
	}
	if code, body, _ := get(t, ts.URL+"/docker/cli?dev=9"); code != 400 || !strings.Contains(body, "invalid device: 9") {
		t.Errorf("?dev=9: %d %q", code, body)
	}
}

// TestMesosCLI decodes /mesos/cli's attribute back to /gpu/info/json.
func TestMesosCLI(t *testing.T) {
	f := newFixture(t, fakedriver.LayoutStandard)
	code, body, _ := get(t, f.url+"/mesos/cli")
	m := regexp.MustCompile(`^--attributes=gpus:([A-Za-z0-9_-]+) --resources=gpus:\{([^}]*)\}$`).FindStringSubmatch(body)
	if code != 200 || m == nil {
		t.Fatalf("/mesos/cli: %d %q", code, body)
	}
	z, err := base64.RawURLEncoding.DecodeString(m[1])
	if err != nil {
		t.Fatal(err)
	}
	zr, err := zlib.NewReader(bytes.NewReader(z))
	if err != nil {
		t.Fatal(err)
	}
	js, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	var info Info
	if err := json.Unmarshal(js, &info); err != nil {
		t.Fatalf("attribute is not /gpu/info/json: %v: %s", err, js)
	}
	if info.Version.Driver != f.sys.DriverVersion || len(info.Devices) != len(f.sys.Devices) {
		t.Errorf("attribute: %+v", info.Version)
	}
	uuids := strings.Split(m[2], ",")
	if len(uuids) != len(f.sys.Devices) || uuids[0] != f.sys.Devices[0].UUID {
		t.Errorf("resources: %q", m[2])
	}
	if code, v1, _ := get(t, f.url+"/v1.0/mesos/cli"); code != 200 || !strings.HasPrefix(v1, "--attributes=gpus:") {
		t.Errorf("/v1.0/mesos/cli: %d %q", code, v1)
	}
}
