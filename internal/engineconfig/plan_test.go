package engineconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden files from the current output")

// gantryOpts is what `gantry runtime configure` passes by default.
var gantryOpts = Options{RuntimeName: "nvidia", ExtraNames: []string{"gantry"}, RuntimePath: "/usr/bin/gantry-runtime"}

func withDefault(o Options) Options { o.SetAsDefault = true; return o }

func readInput(t testing.TB, name string) []byte {
	t.Helper()
	if name == "" {
		return nil // file absent
	}
	b, err := os.ReadFile(filepath.Join("testdata", "in", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// golden compares got with testdata/golden/name, rewriting it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
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
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (go test -update rewrites it):\n%s", path, unifiedDiff("want", "got", want, got))
	}
}

func TestPlanGolden(t *testing.T) {
	cases := []struct {
		name   string
		engine Engine
		input  string
		opts   Options
	}{
		{"docker-absent", Docker, "", gantryOpts},
		{"docker-absent-default", Docker, "", withDefault(gantryOpts)},
		{"docker-mirrors", Docker, "docker-mirrors.json", gantryOpts},
		{"docker-mirrors-default", Docker, "docker-mirrors.json", withDefault(gantryOpts)},
		{"docker-nvidia-default", Docker, "docker-nvidia.json", withDefault(gantryOpts)},
		{"docker-tabs", Docker, "docker-tabs.json", Options{}},
		{"containerd-absent", Containerd, "", gantryOpts},
		{"containerd-absent-default", Containerd, "", withDefault(gantryOpts)},
		{"containerd-1.6-default", Containerd, "containerd-1.6-default.toml", withDefault(gantryOpts)},
		{"containerd-debian12", Containerd, "containerd-debian12.toml", gantryOpts},
		{"containerd-debian12-default", Containerd, "containerd-debian12.toml", withDefault(gantryOpts)},
		{"containerd-1.7-kubeadm", Containerd, "containerd-1.7-kubeadm.toml", gantryOpts},
		{"containerd-1.7-kubeadm-default", Containerd, "containerd-1.7-kubeadm.toml", withDefault(gantryOpts)},
		{"containerd-2.0-default", Containerd, "containerd-2.0-default.toml", withDefault(gantryOpts)},
		{"containerd-2.4-default", Containerd, "containerd-2.4-default.toml", gantryOpts},
		{"containerd-nvidia", Containerd, "containerd-nvidia.toml", withDefault(gantryOpts)},
		{"containerd-dotted", Containerd, "containerd-dotted.toml", withDefault(gantryOpts)},
		{"containerd-comments", Containerd, "containerd-comments.toml", Options{}},
		{"containerd-crlf", Containerd, "containerd-crlf.toml", withDefault(Options{})},
		{"crio-absent", CRIO, "", gantryOpts},
		{"crio-absent-default", CRIO, "", withDefault(gantryOpts)},
		{"crio-existing-default", CRIO, "crio-existing.toml", withDefault(gantryOpts)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := readInput(t, tc.input)
			out, changes, err := Plan(tc.engine, in, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(changes) == 0 {
				t.Fatal("expected changes")
			}
			var g bytes.Buffer
			for _, c := range changes {
				g.WriteString("# " + c + "\n")
			}
			g.WriteString(unifiedDiff("before", "after", in, out))
			golden(t, tc.name+".diff", g.Bytes())

			// Idempotence: planning the output again is a byte-exact no-op.
			again, changes2, err := Plan(tc.engine, out, tc.opts)
			if err != nil {
				t.Fatalf("second Plan: %v", err)
			}
			if len(changes2) != 0 || !bytes.Equal(again, out) {
				t.Fatalf("second Plan not a no-op: changes %q", changes2)
			}
			// Without SetAsDefault, a configured file stays configured.
			noDefault := tc.opts
			noDefault.SetAsDefault = false
			if _, ch, err := Plan(tc.engine, out, noDefault); err != nil || len(ch) != 0 {
				t.Fatalf("Plan without default on output: %q, %v", ch, err)
			}
		})
	}
}

// TestDockerPreservesUserKeys checks semantics and key order independently
// of the golden files.
func TestDockerPreservesUserKeys(t *testing.T) {
	in := readInput(t, "docker-mirrors.json")
	out, changes, err := Plan(Docker, in, withDefault(gantryOpts))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"add runtimes.nvidia (path /usr/bin/gantry-runtime)",
		"add runtimes.gantry (path /usr/bin/gantry-runtime)",
		"set default-runtime = nvidia (was unset, Docker uses runc)",
	}
	if !reflect.DeepEqual(changes, want) {
		t.Errorf("changes = %q, want %q", changes, want)
	}
	var before, after map[string]any
	dec := func(b []byte, v *map[string]any) {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber() // the big integer must survive exactly
		if err := d.Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	dec(in, &before)
	dec(out, &after)
	runtimes := after["runtimes"].(map[string]any)
	if p := runtimes["nvidia"].(map[string]any)["path"]; p != "/usr/bin/gantry-runtime" {
		t.Errorf("nvidia path = %v", p)
	}
	if !reflect.DeepEqual(runtimes["kata"], before["runtimes"].(map[string]any)["kata"]) {
		t.Errorf("kata runtime changed: %v", runtimes["kata"])
	}
	delete(after, "default-runtime")
	delete(after, "runtimes")
	delete(before, "runtimes")
	if !reflect.DeepEqual(before, after) {
		t.Errorf("user keys changed:\nbefore %v\nafter  %v", before, after)
	}
	if !bytes.Contains(out, []byte("12345678901234567890")) || !bytes.Contains(out, []byte(`"a<b&c>d"`)) {
		t.Errorf("values were re-encoded:\n%s", out)
	}
	// Original key order, new keys appended.
	order := []string{`"registry-mirrors"`, `"log-driver"`, `"log-opts"`, `"max-size"`, `"max-file"`, `"runtimes"`, `"kata"`, `"nvidia"`, `"gantry"`, `"storage-driver"`, `"labels"`, `"default-runtime"`}
	last := -1
	for _, k := range order {
		i := bytes.Index(out, []byte(k))
		if i <= last {
			t.Errorf("key %s out of order in:\n%s", k, out)
		}
		last = i
	}
}

func TestDockerConflictKeepsOtherFields(t *testing.T) {
	out, changes, err := Plan(Docker, readInput(t, "docker-nvidia.json"), withDefault(Options{}))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`set runtimes.nvidia.path = /usr/bin/gantry-runtime (was "/usr/bin/nvidia-container-runtime")`,
		`set default-runtime = nvidia (was "runc")`,
	}
	if !reflect.DeepEqual(changes, want) {
		t.Errorf("changes = %q, want %q", changes, want)
	}
	if !strings.Contains(string(out), "\n  \"data-root\"") {
		t.Errorf("two-space indentation not kept:\n%s", out)
	}
	if !strings.Contains(string(out), `"args": []`) {
		t.Errorf("existing args dropped:\n%s", out)
	}
}

func TestContainerdSemantics(t *testing.T) {
	cases := []struct {
		input, plugin string
		systemd       bool
	}{
		{"containerd-1.6-default.toml", "io.containerd.grpc.v1.cri", false},
		{"containerd-1.7-kubeadm.toml", "io.containerd.grpc.v1.cri", true},
		{"containerd-2.0-default.toml", "io.containerd.cri.v1.runtime", false},
		// containerd 2.4's `config default`: version 4, the CRI plugins of 3.
		{"containerd-2.4-default.toml", "io.containerd.cri.v1.runtime", false},
	}
	for _, tc := range cases {
		t.Run(tc.input, func(t *testing.T) {
			in := readInput(t, tc.input)
			out, _, err := Plan(Containerd, in, withDefault(gantryOpts))
			if err != nil {
				t.Fatal(err)
			}
			before, err := decodeTOML(in)
			if err != nil {
				t.Fatal(err)
			}
			after, err := decodeTOML(out)
			if err != nil {
				t.Fatal(err)
			}
			ctr := after["plugins"].(map[string]any)[tc.plugin].(map[string]any)["containerd"].(map[string]any)
			if ctr["default_runtime_name"] != "nvidia" {
				t.Errorf("default_runtime_name = %v", ctr["default_runtime_name"])
			}
			rts := ctr["runtimes"].(map[string]any)
			for _, name := range []string{"nvidia", "gantry"} {
				rt := rts[name].(map[string]any)
				opts := rt["options"].(map[string]any)
				if rt["runtime_type"] != runcShimType || opts["BinaryName"] != "/usr/bin/gantry-runtime" {
					t.Errorf("%s = %v", name, rt)
				}
				if opts["SystemdCgroup"] != tc.systemd {
					t.Errorf("%s SystemdCgroup = %v, want %v (copied from runc)", name, opts["SystemdCgroup"], tc.systemd)
				}
			}
			// Everything else is untouched.
			delete(rts, "nvidia")
			delete(rts, "gantry")
			delete(ctr, "default_runtime_name")
			delete(before["plugins"].(map[string]any)[tc.plugin].(map[string]any)["containerd"].(map[string]any), "default_runtime_name")
			if !sameTOML(before, after) {
				t.Error("other settings changed")
			}
			// Every comment line of the input survives.
			for _, line := range strings.Split(string(in), "\n") {
				if strings.Contains(line, "#") && !strings.Contains(string(out), line) {
					t.Errorf("lost line %q", line)
				}
			}
		})
	}
}

func TestContainerdConflictEditsInPlace(t *testing.T) {
	in := readInput(t, "containerd-nvidia.toml")
	out, changes, err := Plan(Containerd, in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 2 || !strings.Contains(changes[0], `BinaryName = /usr/bin/gantry-runtime (was "/usr/bin/nvidia-container-runtime")`) || !strings.HasPrefix(changes[1], "note: this file imports") {
		t.Errorf("changes = %q", changes)
	}
	want := strings.Replace(string(in), `"/usr/bin/nvidia-container-runtime" # from`, `"/usr/bin/gantry-runtime" # from`, 1)
	if string(out) != want {
		t.Errorf("not a one-value edit:\n%s", unifiedDiff("want", "got", []byte(want), out))
	}
}

func TestContainerdDottedFallsBackToReencode(t *testing.T) {
	r, err := plan(Containerd, readInput(t, "containerd-dotted.toml"), withDefault(Options{}))
	if err != nil {
		t.Fatal(err)
	}
	if !r.lossy || !strings.Contains(r.changes[len(r.changes)-1], "comments and layout were not preserved") {
		t.Errorf("lossy = %v, changes %q", r.lossy, r.changes)
	}
	doc, err := decodeTOML(r.updated)
	if err != nil {
		t.Fatal(err)
	}
	v, ok, _ := lookup(doc, []string{"plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", "nvidia", "options", "SystemdCgroup"})
	if !ok || v != true {
		t.Errorf("SystemdCgroup not copied: %v", v)
	}
}

func TestPlanErrors(t *testing.T) {
	cases := []struct {
		name    string
		engine  Engine
		input   string
		opts    Options
		wantErr error
		wantMsg string
	}{
		{"json syntax", Docker, "{\n  \"debug\": true,\n  \"log-driver\" \"json-file\"\n}\n", Options{}, ErrMalformed, "line 3, column"},
		{"json trailing comma", Docker, "{\"a\": 1,}", Options{}, ErrMalformed, "line 1"},
		{"json array", Docker, "[1, 2]", Options{}, ErrMalformed, "must be a JSON object"},
		{"json runtimes list", Docker, `{"runtimes": []}`, Options{}, ErrMalformed, `"runtimes" must be a JSON object`},
		{"json duplicate", Docker, `{"runtimes": {}, "runtimes": {}}`, Options{}, ErrMalformed, "appears twice"},
		{"json trailing data", Docker, `{} {}`, Options{}, ErrMalformed, "line 1"},
		{"toml syntax", Containerd, "version = 2\n[plugins\n", Options{}, ErrMalformed, "line 2"},
		{"toml duplicate", Containerd, "version = 2\nversion = 3\n", Options{}, ErrMalformed, "line 2"},
		{"containerd v1", Containerd, string(readInput(t, "containerd-v1.toml")), Options{}, ErrUnsupportedVersion, "containerd config migrate"},
		{"containerd v9", Containerd, "version = 9\n", Options{}, ErrUnsupportedVersion, "version 9"},
		{"containerd version string", Containerd, "version = \"2\"\n", Options{}, ErrMalformed, "integer"},
		{"containerd runtimes not table", Containerd, "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nruntimes = 3\n", Options{}, ErrMalformed, "is not a table"},
		{"containerd options not table", Containerd, "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\noptions = 3\n", Options{}, ErrMalformed, "options is not a table"},
		{"crio runtime not table", CRIO, "[crio.runtime.runtimes]\nnvidia = \"x\"\n", Options{}, ErrMalformed, "is not a table"},
		{"relative path", Docker, "", Options{RuntimePath: "gantry-runtime"}, ErrInvalidOptions, "not absolute"},
		{"bad name", Containerd, "", Options{ExtraNames: []string{"a.b"}}, ErrInvalidOptions, `"a.b"`},
		{"docker runc", Docker, "", Options{RuntimeName: "runc"}, ErrInvalidOptions, "reserved"},
		{"unknown engine", Engine("podman"), "", Options{}, ErrUnknownEngine, "docker, containerd, crio"},
		{"unparsed engine", Engine("Docker"), "", Options{}, ErrUnknownEngine, `"Docker"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, changes, err := Plan(tc.engine, []byte(tc.input), tc.opts)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("err = %q, want it to mention %q", err, tc.wantMsg)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("multi-line error: %q", err)
			}
			if out != nil || changes != nil {
				t.Errorf("output on error: %q %q", out, changes)
			}
		})
	}
}

func TestNoDefaultLeavesDefaultAlone(t *testing.T) {
	in := []byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"nvidia\"\n")
	out, _, err := Plan(Containerd, in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte(`default_runtime_name = "nvidia"`)) {
		t.Errorf("default removed:\n%s", out)
	}
}

func TestParseEngine(t *testing.T) {
	for in, want := range map[string]Engine{"docker": Docker, "Containerd": Containerd, " crio ": CRIO, "cri-o": CRIO} {
		if got, err := ParseEngine(in); err != nil || got != want {
			t.Errorf("ParseEngine(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseEngine("podman"); !errors.Is(err, ErrUnknownEngine) || !strings.Contains(err.Error(), "docker, containerd, crio") {
		t.Errorf("ParseEngine(podman) = %v", err)
	}
	for _, e := range Engines() {
		if !filepath.IsAbs(DefaultPath(e)) {
			t.Errorf("DefaultPath(%s) = %q", e, DefaultPath(e))
		}
	}
}

func BenchmarkPlanContainerdDefault(b *testing.B) {
	in := readInput(b, "containerd-1.6-default.toml")
	for b.Loop() {
		if _, _, err := Plan(Containerd, in, withDefault(gantryOpts)); err != nil {
			b.Fatal(err)
		}
	}
}

// TestContainerdKeepsDefaultRuntime: whatever file configure starts from,
// the result defines the default runtime's entry, so containerd 1.x
// (whose go-toml v1 decoding replaces its built-in runtimes map with the
// file's) still has it and its CRI plugin loads. Debian 12's packaged
// config.toml (containerd 1.6.20) defines no runtime at all.
func TestContainerdKeepsDefaultRuntime(t *testing.T) {
	v3 := "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\".containerd]\n  default_runtime_name = \"runc\"\n"
	cases := []struct {
		name string
		in   []byte
		opts Options
	}{
		{"debian12", readInput(t, "containerd-debian12.toml"), gantryOpts},
		{"debian12 set-as-default", readInput(t, "containerd-debian12.toml"), withDefault(gantryOpts)},
		{"absent", nil, gantryOpts},
		{"1.6 default", readInput(t, "containerd-1.6-default.toml"), gantryOpts},
		{"2.0 default", readInput(t, "containerd-2.0-default.toml"), gantryOpts},
		{"2.4 default (version 4)", readInput(t, "containerd-2.4-default.toml"), gantryOpts},
		{"version 4, empty", []byte("version = 4\n"), gantryOpts},
		// What configure (and NVIDIA's 1.17) wrote before: run again, it
		// repairs the node.
		{"written before the fix", append(readInput(t, "containerd-debian12.toml"), []byte(`
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
BinaryName = "/usr/bin/gantry-runtime"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gantry]
runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gantry.options]
BinaryName = "/usr/bin/gantry-runtime"
`)...), gantryOpts},
		{"v3 default named", []byte(v3), gantryOpts},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, err := Parse(Containerd, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			out, _, err := Plan(Containerd, tc.in, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(Containerd, out)
			if err != nil {
				t.Fatal(err)
			}
			def := before.DefaultRuntime
			if def == "" {
				def = "runc"
			}
			if rt, ok := got.Runtime(def); !ok || rt.Program != "runc" {
				t.Errorf("the default runtime %q has no entry running runc after configure (runtimes %+v):\n%s", def, got.Runtimes, out)
			}
			if _, ok := got.Runtime("nvidia"); !ok {
				t.Errorf("nvidia not registered:\n%s", out)
			}
		})
	}
	// A default that names a runtime the file does not define is already
	// broken: refused, naming the fix.
	_, _, err := Plan(Containerd, []byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"crun\"\n"), gantryOpts)
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), `"crun"`) || !strings.Contains(err.Error(), "define that runtime") {
		t.Errorf("undefined default: err = %v", err)
	}
}
