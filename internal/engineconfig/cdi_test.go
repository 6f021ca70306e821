package engineconfig

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

// EnableCDI turns the engine's CDI switch on where it has one, keeps what
// the file had, and is idempotent: a second plan of its own output changes
// nothing.
func TestPlanEnableCDI(t *testing.T) {
	opts := gantryOpts
	opts.EnableCDI = true
	for _, tc := range []struct {
		name   string
		engine Engine
		in     string
		check  func(t *testing.T, out []byte)
	}{
		{"docker new", Docker, "", func(t *testing.T, out []byte) {
			var d struct{ Features map[string]bool }
			if err := json.Unmarshal(out, &d); err != nil || !d.Features["cdi"] {
				t.Errorf("features %v, %v\n%s", d.Features, err, out)
			}
		}},
		{"docker other features kept, cdi false flipped", Docker, `{"features": {"buildkit": true, "cdi": false}, "debug": true}`, func(t *testing.T, out []byte) {
			var d struct {
				Features map[string]bool
				Debug    bool
			}
			if err := json.Unmarshal(out, &d); err != nil || !d.Features["cdi"] || !d.Features["buildkit"] || !d.Debug {
				t.Errorf("%+v, %v\n%s", d, err, out)
			}
		}},
		{"containerd v2", Containerd, "version = 2\n", func(t *testing.T, out []byte) {
			var d map[string]any
			if err := toml.Unmarshal(out, &d); err != nil {
				t.Fatal(err)
			}
			p := d["plugins"].(map[string]any)["io.containerd.grpc.v1.cri"].(map[string]any)
			if p["enable_cdi"] != true {
				t.Errorf("enable_cdi %v\n%s", p["enable_cdi"], out)
			}
		}},
		{"containerd v3", Containerd, "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_cdi = false\n", func(t *testing.T, out []byte) {
			var d map[string]any
			if err := toml.Unmarshal(out, &d); err != nil {
				t.Fatal(err)
			}
			p := d["plugins"].(map[string]any)["io.containerd.cri.v1.runtime"].(map[string]any)
			if p["enable_cdi"] != true || strings.Count(string(out), "enable_cdi") != 1 {
				t.Errorf("enable_cdi %v\n%s", p["enable_cdi"], out)
			}
		}},
		{"crio: always on", CRIO, "", func(t *testing.T, out []byte) {
			if strings.Contains(string(out), "cdi") {
				t.Errorf("CRI-O drop-in mentions cdi:\n%s", out)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, changes, err := Plan(tc.engine, []byte(tc.in), opts)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, out)
			if tc.engine != CRIO && !strings.Contains(strings.Join(changes, "\n"), "cdi") {
				t.Errorf("changes do not mention CDI: %q", changes)
			}
			again, changes, err := Plan(tc.engine, out, opts)
			if err != nil || len(changes) != 0 || string(again) != string(out) {
				t.Errorf("second plan: %q, %v", changes, err)
			}
		})
	}
}
