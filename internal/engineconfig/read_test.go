package engineconfig

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestReadWhatPlanWrote: the reader doctor uses reads back, from every
// input file, exactly what configure registered.
func TestReadWhatPlanWrote(t *testing.T) {
	inputs, err := os.ReadDir(filepath.Join("testdata", "in"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range Engines() {
		for _, in := range append([]os.DirEntry{nil}, inputs...) {
			name := "absent"
			var current []byte
			if in != nil {
				name = in.Name()
				current = readInput(t, name)
			}
			if (e == Docker) != (filepath.Ext(name) == ".json") && in != nil {
				continue
			}
			opts := withDefault(gantryOpts)
			opts.EnableCDI = true
			updated, _, err := Plan(e, current, opts)
			if err != nil {
				continue // an input configure refuses (version 1, malformed)
			}
			got, err := Parse(e, updated)
			if err != nil {
				t.Fatalf("%s %s: Parse of Plan's output: %v", e, name, err)
			}
			for _, n := range []string{"nvidia", "gantry"} {
				if rt, ok := got.Runtime(n); !ok || rt.Program != "/usr/bin/gantry-runtime" {
					t.Errorf("%s %s: runtime %s read back as %+v, %v", e, name, n, rt, ok)
				}
			}
			if got.DefaultRuntime != "nvidia" || !got.CDI {
				t.Errorf("%s %s: default %q, CDI %v", e, name, got.DefaultRuntime, got.CDI)
			}
		}
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		engine Engine
		in     string
		want   Registered
	}{
		{Docker, ``, Registered{Runtimes: []Runtime{}}},
		{Docker, `{"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}, "crun": {"path": "crun"}}, "default-runtime": "nvidia", "features": {"cdi": true}}`,
			Registered{Runtimes: []Runtime{{"crun", "crun"}, {"nvidia", "/usr/bin/nvidia-container-runtime"}}, DefaultRuntime: "nvidia", CDI: true}},
		{Containerd, "version = 2\nroot = \"/data/containerd\"\ndisabled_plugins = [\"cri\"]\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = \"nvidia\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\nBinaryName = \"/usr/bin/gantry-runtime\"\n",
			Registered{Runtimes: []Runtime{{"nvidia", "/usr/bin/gantry-runtime"}, {"runc", "runc"}}, DefaultRuntime: "nvidia", CDI: true, CRIDisabled: `"cri"`, Root: "/data/containerd"}},
		// Version 3 reads its own plugin only: version 2's table is not containerd 2's.
		{Containerd, "version = 3\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.old.options]\nBinaryName = \"/x\"\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia.options]\nBinaryName = \"/usr/bin/gantry-runtime\"\n",
			Registered{Runtimes: []Runtime{{"nvidia", "/usr/bin/gantry-runtime"}}}},
		{Containerd, "[plugins.cri.containerd.runtimes.nvidia.options]\nBinaryName = \"nvidia-container-runtime\"\n",
			Registered{Runtimes: []Runtime{{"nvidia", "nvidia-container-runtime"}}}},
		{CRIO, "[crio.runtime]\ndefault_runtime = \"nvidia\"\n[crio.runtime.runtimes.nvidia]\nruntime_path = \"/usr/bin/gantry-runtime\"\n[crio.runtime.runtimes.crun]\n",
			Registered{Runtimes: []Runtime{{"crun", "crun"}, {"nvidia", "/usr/bin/gantry-runtime"}}, DefaultRuntime: "nvidia", CDI: true}},
	} {
		got, err := Parse(tc.engine, []byte(tc.in))
		if err != nil {
			t.Errorf("%s %q: %v", tc.engine, tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s %q:\n got %+v\nwant %+v", tc.engine, tc.in, got, tc.want)
		}
	}
	for _, tc := range []struct {
		engine Engine
		in     string
	}{{Docker, `{"runtimes": `}, {Containerd, "version = 2\n[plugins\n"}, {Containerd, "version = \"2\"\n"}, {CRIO, "[crio"}} {
		if _, err := Parse(tc.engine, []byte(tc.in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s %q: err %v, want ErrMalformed", tc.engine, tc.in, err)
		}
	}
}

func TestReadCRIOMergesDropins(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "crio.conf")
	drop := filepath.Join(dir, "crio.conf.d")
	if _, _, err := ReadCRIO(main, drop); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("no files: %v", err)
	}
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(main, "[crio.runtime]\ndefault_runtime = \"crun\"\n[crio.runtime.runtimes.nvidia]\nruntime_path = \"/old\"\n")
	write(filepath.Join(drop, "99-nvidia.toml"), "[crio.runtime]\ndefault_runtime = \"nvidia\"\n[crio.runtime.runtimes.nvidia]\nruntime_path = \"/usr/bin/gantry-runtime\"\n")
	write(filepath.Join(drop, "10-crun.toml"), "[crio.runtime.runtimes.crun]\n")
	got, files, err := ReadCRIO(main, drop)
	if err != nil {
		t.Fatal(err)
	}
	want := Registered{Runtimes: []Runtime{{"crun", "crun"}, {"nvidia", "/usr/bin/gantry-runtime"}}, DefaultRuntime: "nvidia", CDI: true}
	if !reflect.DeepEqual(got, want) || len(files) != 3 || files[1] != filepath.Join(drop, "10-crun.toml") {
		t.Errorf("got %+v from %v, want %+v", got, files, want)
	}
	write(filepath.Join(drop, "50-bad.toml"), "[crio")
	if _, _, err := ReadCRIO(main, drop); !errors.Is(err, ErrMalformed) {
		t.Errorf("bad drop-in: %v", err)
	}
}

func TestParseContainerdStatus(t *testing.T) {
	got, err := ParseContainerdStatus([]byte(`{"containerd": {"defaultRuntimeName": "nvidia", "runtimes": {"runc": {"options": {}}, "nvidia": {"options": {"BinaryName": "/usr/bin/gantry-runtime"}}}}, "enableCDI": true, "containerdRootDir": "/srv/containerd"}`))
	want := Registered{Runtimes: []Runtime{{"nvidia", "/usr/bin/gantry-runtime"}, {"runc", "runc"}}, DefaultRuntime: "nvidia", CDI: true, Root: "/srv/containerd"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, %v", got, err)
	}
	if _, err := ParseContainerdStatus([]byte(`{"runtimes": {}}`)); err == nil {
		t.Error("CRI-O's status read as containerd's")
	}
}

func TestDefaultPaths(t *testing.T) {
	if CRIODropinDir() != "/etc/crio/crio.conf.d" || filepath.Dir(CRIODropinDir()) != filepath.Dir(CRIOMainConfig) {
		t.Errorf("CRI-O paths %s, %s", CRIODropinDir(), CRIOMainConfig)
	}
}

// TestReadContainerdImports: the files config.toml imports are read as
// containerd resolves them (relative to its directory, patterns expanded in
// name order, a missing file skipped), an imported runtime of the same name
// wins (so does an imported root), and an import that does not parse is an *ImportError naming it.
func TestReadContainerdImports(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	main := write("config.toml", "version = 2\nimports = [\"conf.d/*.toml\", \"/nonexistent/x.toml\", \"site.toml\"]\n"+
		"[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = \"runc\"\n"+
		"[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n"+
		"[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\nBinaryName = \"/old/nvidia-container-runtime\"\n")
	a := write("conf.d/10-a.toml", "version = 2\nroot = \"/srv/containerd\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\nBinaryName = \"/usr/bin/nvidia-container-runtime\"\n")
	b := write("conf.d/99-nvidia.toml", "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\nenable_cdi = true\n[plugins.\"io.containerd.cri.v1.runtime\".containerd]\ndefault_runtime_name = \"nvidia\"\n"+
		"[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia.options]\nBinaryName = \"/usr/bin/gantry-runtime\"\n")
	write("conf.d/notes.txt", "not toml {")
	got, files, err := ReadContainerd(main)
	if err != nil {
		t.Fatal(err)
	}
	want := Registered{Runtimes: []Runtime{{"nvidia", "/usr/bin/gantry-runtime"}, {"runc", "runc"}}, DefaultRuntime: "nvidia", CDI: true, Root: "/srv/containerd"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if !reflect.DeepEqual(files, []string{main, a, b}) {
		t.Errorf("files %v", files)
	}
	if r, err := Read(Containerd, main); err != nil || !reflect.DeepEqual(r, want) {
		t.Errorf("Read: %+v %v", r, err)
	}
	// Parse reads one file: no imports.
	if r, _ := Parse(Containerd, []byte(readT(t, main))); len(r.Runtimes) != 2 || r.Runtimes[0].Program != "/old/nvidia-container-runtime" {
		t.Errorf("Parse: %+v", r)
	}

	broken := write("site.toml", "version = \n")
	_, _, err = ReadContainerd(main)
	var ie *ImportError
	if !errors.As(err, &ie) || ie.File != broken || ie.ImportedBy != main || !errors.Is(err, ErrMalformed) {
		t.Fatalf("broken import: %v", err)
	}
	// The main file's own error is no ImportError.
	write("config.toml", "version = \n")
	if _, _, err := ReadContainerd(main); !errors.Is(err, ErrMalformed) || errors.As(err, &ie) {
		t.Errorf("broken main file: %v", err)
	}
	if _, files, err := ReadContainerd(filepath.Join(dir, "absent.toml")); !errors.Is(err, fs.ErrNotExist) || len(files) != 0 {
		t.Errorf("absent: %v %v", err, files)
	}
}
