package cdispec

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
	sigsyaml "sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from the current output")

const hookPath = "/usr/bin/gantry-cdi-hook"

// devRootMarker replaces the temporary device root in golden output.
const devRootMarker = "/DEVROOT"

func generate(t *testing.T, opts Options) (*specs.Spec, string) {
	t.Helper()
	sys := testSystem()
	devRoot := makeDevRoot(t, sys)
	if opts.DevRoot == "" {
		opts.DevRoot = devRoot
	}
	if opts.HookPath == "" {
		opts.HookPath = hookPath
	}
	spec, err := Generate(sys, testInventory(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return spec, devRoot
}

func TestGenerateGolden(t *testing.T) {
	spec, devRoot := generate(t, Options{})
	got, err := Marshal(spec, FormatYAML)
	if err != nil {
		t.Fatal(err)
	}
	got = bytes.ReplaceAll(got, []byte(devRoot), []byte(devRootMarker))
	golden := filepath.Join("testdata", "2gpu-mig.golden.yaml")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("Generate output differs from %s (run go test -update if intended):\n%s", golden, got)
	}
}

func TestGenerateContents(t *testing.T) {
	spec, _ := generate(t, Options{})
	wantNames := []string{
		"nvidia.com/gpu=0", "nvidia.com/gpu=GPU-0aaaaaaa-1111-2222-3333-444444444444",
		"nvidia.com/gpu=1:0", "nvidia.com/gpu=MIG-10000000-aaaa-bbbb-cccc-dddddddddddd",
		"nvidia.com/gpu=1:1", "nvidia.com/gpu=MIG-11111111-aaaa-bbbb-cccc-dddddddddddd",
		"nvidia.com/gpu=all",
	}
	if got := Names(spec); !slices.Equal(got, wantNames) {
		t.Errorf("names:\n got %v\nwant %v", got, wantNames)
	}
	nodes := func(name string) []string {
		for _, d := range spec.Devices {
			if d.Name == name {
				var out []string
				for _, n := range d.ContainerEdits.DeviceNodes {
					out = append(out, n.Path)
				}
				return out
			}
		}
		t.Fatalf("no device %q", name)
		return nil
	}
	if got, want := nodes("1:1"), []string{"/dev/nvidia-caps/nvidia-cap156", "/dev/nvidia-caps/nvidia-cap157", "/dev/nvidia1"}; !slices.Equal(got, want) {
		t.Errorf("1:1 nodes %v, want %v", got, want)
	}
	if got, want := nodes("all"), []string{"/dev/nvidia-caps/nvidia-cap147", "/dev/nvidia-caps/nvidia-cap148",
		"/dev/nvidia-caps/nvidia-cap156", "/dev/nvidia-caps/nvidia-cap157", "/dev/nvidia0", "/dev/nvidia1"}; !slices.Equal(got, want) {
		t.Errorf("all nodes %v, want %v", got, want)
	}
	if !slices.Contains(spec.ContainerEdits.Env, "NVIDIA_VISIBLE_DEVICES=void") {
		t.Errorf("spec env %v lacks NVIDIA_VISIBLE_DEVICES=void", spec.ContainerEdits.Env)
	}
	if len(spec.ContainerEdits.Hooks) != 2 {
		t.Errorf("spec hooks %+v, want create-symlinks and update-ldcache", spec.ContainerEdits.Hooks)
	}
	min, err := specs.MinimumRequiredVersion(spec)
	if err != nil || spec.Version != min {
		t.Errorf("cdiVersion %q, minimum %q (%v)", spec.Version, min, err)
	}
}

func TestGenerateOptions(t *testing.T) {
	tests := []struct {
		name       string
		opts       Options
		wantKind   string
		wantMount  string // a mount that must be present ("" = skip)
		wantAbsent string // a mount that must be absent ("" = skip)
		wantErr    error
	}{
		{name: "default kind", wantKind: "nvidia.com/gpu", wantMount: "/usr/lib/x86_64-linux-gnu/libEGL_nvidia.so.550.54.15"},
		{name: "kind override", opts: Options{Kind: "example.com/accel"}, wantKind: "example.com/accel"},
		{name: "caps narrow the files", opts: Options{Capabilities: []driver.Capability{driver.Utility}},
			wantKind: "nvidia.com/gpu", wantMount: "/usr/bin/nvidia-smi", wantAbsent: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"},
		{name: "bad kind", opts: Options{Kind: "gpu"}, wantErr: ErrInvalidSpec},
		{name: "bad class", opts: Options{Kind: "nvidia.com/g!pu"}, wantErr: ErrInvalidSpec},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sys := testSystem()
			tt.opts.DevRoot = makeDevRoot(t, sys)
			tt.opts.HookPath = hookPath
			spec, err := Generate(sys, testInventory(), tt.opts)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if spec.Kind != tt.wantKind {
				t.Errorf("kind %q, want %q", spec.Kind, tt.wantKind)
			}
			var mounts []string
			for _, m := range spec.ContainerEdits.Mounts {
				mounts = append(mounts, m.ContainerPath)
			}
			if tt.wantMount != "" && !slices.Contains(mounts, tt.wantMount) {
				t.Errorf("mounts %v lack %s", mounts, tt.wantMount)
			}
			if tt.wantAbsent != "" && slices.Contains(mounts, tt.wantAbsent) {
				t.Errorf("mounts %v have %s", mounts, tt.wantAbsent)
			}
		})
	}
}

func TestGenerateErrors(t *testing.T) {
	if _, err := Generate(&gpu.System{}, testInventory(), Options{}); !errors.Is(err, ErrNoDevices) {
		t.Errorf("no GPUs: err = %v", err)
	}
	migOnly := &gpu.System{Devices: []gpu.Device{{Index: 0, UUID: "GPU-x", MIGEnabled: true}}}
	if _, err := Generate(migOnly, testInventory(), Options{}); !errors.Is(err, ErrNoDevices) {
		t.Errorf("MIG mode without instances: err = %v", err)
	}
	// Device nodes missing under the dev root: no spec with guessed numbers.
	if _, err := Generate(testSystem(), testInventory(), Options{DevRoot: t.TempDir()}); err == nil {
		t.Error("missing device nodes: no error")
	}
}

func TestValidateRejects(t *testing.T) {
	good, _ := generate(t, Options{})
	tests := []struct {
		name   string
		mutate func(*specs.Spec)
	}{
		{"bad version", func(s *specs.Spec) { s.Version = "9.9.9" }},
		{"duplicate name", func(s *specs.Spec) { s.Devices = append(s.Devices, s.Devices[0]) }},
		{"bad device name", func(s *specs.Spec) { s.Devices[0].Name = "a/b" }},
		{"empty device", func(s *specs.Spec) { s.Devices[0].ContainerEdits = specs.ContainerEdits{} }},
		{"no devices", func(s *specs.Spec) { s.Devices = nil }},
		{"bad env", func(s *specs.Spec) { s.ContainerEdits.Env = []string{"NOEQUALS"} }},
		{"bad permissions", func(s *specs.Spec) { s.Devices[0].ContainerEdits.DeviceNodes[0].Permissions = "rwx" }},
		{"bad hook", func(s *specs.Spec) { s.ContainerEdits.Hooks[0].HookName = "whenever" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, err := Marshal(good, FormatJSON)
			if err != nil {
				t.Fatal(err)
			}
			s, err := cdi.ParseSpec(data)
			if err != nil {
				t.Fatal(err)
			}
			tt.mutate(s)
			if err := Validate(s); !errors.Is(err, ErrInvalidSpec) {
				t.Errorf("err = %v, want ErrInvalidSpec", err)
			}
		})
	}
	if err := Validate(good); err != nil {
		t.Errorf("generated spec: %v", err)
	}
}

// TestCDIRoundTrip writes the spec where the CDI library's cache reads specs,
// and injects devices with the library into an OCI spec, as Podman or
// containerd would.
func TestCDIRoundTrip(t *testing.T) {
	for _, format := range []string{FormatYAML, FormatJSON} {
		t.Run(format, func(t *testing.T) {
			spec, _ := generate(t, Options{})
			dir := t.TempDir()
			if err := Write(spec, filepath.Join(dir, "nvidia."+format), ""); err != nil {
				t.Fatal(err)
			}
			cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			if errs := cache.GetErrors(); len(errs) > 0 {
				t.Fatalf("CDI library rejected the spec: %v", errs)
			}
			listed := cache.ListDevices()
			want := Names(spec)
			slices.Sort(want)
			slices.Sort(listed)
			if !slices.Equal(listed, want) {
				t.Errorf("cache lists %v, want %v", listed, want)
			}

			oci := &ocispecs.Spec{Process: &ocispecs.Process{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, Linux: &ocispecs.Linux{}}
			if unresolved, err := cache.InjectDevices(oci, "nvidia.com/gpu=0"); err != nil {
				t.Fatalf("inject =0: %v (unresolved %v)", err, unresolved)
			}
			devPaths := func() []string {
				var out []string
				for _, d := range oci.Linux.Devices {
					out = append(out, d.Path)
				}
				slices.Sort(out)
				return out
			}
			if got, want := devPaths(), sorted("/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"); !slices.Equal(got, want) {
				t.Errorf("=0 injected devices %v, want %v", got, want)
			}
			if !slices.Contains(oci.Process.Env, "NVIDIA_VISIBLE_DEVICES=void") || slices.Contains(oci.Process.Env, "NVIDIA_VISIBLE_DEVICES=all") {
				t.Errorf("env after injection %v", oci.Process.Env)
			}
			var libcuda bool
			for _, m := range oci.Mounts {
				if m.Destination == "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" && m.Source == "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" {
					libcuda = true
				}
			}
			if !libcuda {
				t.Errorf("libcuda not mounted: %+v", oci.Mounts)
			}
			if oci.Hooks == nil || len(oci.Hooks.CreateContainer) != 2 || oci.Hooks.CreateContainer[0].Path != hookPath {
				t.Errorf("createContainer hooks %+v", oci.Hooks)
			}

			all := &ocispecs.Spec{Process: &ocispecs.Process{}, Linux: &ocispecs.Linux{}}
			if _, err := cache.InjectDevices(all, "nvidia.com/gpu=all"); err != nil {
				t.Fatalf("inject =all: %v", err)
			}
			var caps int
			for _, d := range all.Linux.Devices {
				if strings.HasPrefix(d.Path, "/dev/nvidia-caps/") {
					caps++
					if d.Major != majCaps {
						t.Errorf("%s major %d, want %d", d.Path, d.Major, majCaps)
					}
				}
			}
			if caps != 4 {
				t.Errorf("=all injected %d MIG capability nodes, want 4: %+v", caps, all.Linux.Devices)
			}
			if _, err := cache.InjectDevices(all, "nvidia.com/gpu=7"); err == nil {
				t.Error("inject of an unknown device succeeded")
			}
		})
	}
}

func sorted(s ...string) []string { slices.Sort(s); return s }

func TestMarshalFormats(t *testing.T) {
	spec, _ := generate(t, Options{})
	y, err := Marshal(spec, FormatYAML)
	if err != nil || !bytes.HasPrefix(y, []byte("---\ncdiVersion: ")) {
		t.Errorf("yaml: %v %.40q", err, y)
	}
	j, err := Marshal(spec, FormatJSON)
	if err != nil || !bytes.HasPrefix(j, []byte("{\n  \"cdiVersion\"")) || !bytes.HasSuffix(j, []byte("}\n")) {
		t.Errorf("json: %v %.40q", err, j)
	}
	for _, b := range [][]byte{y, j} {
		back, err := cdi.ParseSpec(b)
		if err != nil {
			t.Fatalf("CDI parser (strict fields) rejects our output: %v", err)
		}
		if err := Validate(back); err != nil || len(back.Devices) != len(spec.Devices) {
			t.Errorf("round trip: %v, %d devices", err, len(back.Devices))
		}
	}
	if _, err := Marshal(spec, "toml"); err == nil {
		t.Error("toml accepted")
	}
}

func TestWrite(t *testing.T) {
	spec, _ := generate(t, Options{})
	tests := []struct {
		file, format string
		wantPrefix   string
		wantErr      bool
	}{
		{"a.yaml", "", "---\n", false},
		{"a.yml", "", "---\n", false},
		{"a.json", "", "{", false},
		{"a.JSON", "", "{", false},
		{"a.spec", "json", "{", false},
		{"a.spec", "", "", true},
		{"a.yaml", "xml", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.file+"/"+tt.format, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, tt.file)
			err := Write(spec, p, tt.format)
			if tt.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				assertOnly(t, dir)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(p)
			if err != nil || !strings.HasPrefix(string(b), tt.wantPrefix) {
				t.Errorf("content %.20q, %v", b, err)
			}
			fi, _ := os.Stat(p)
			if fi.Mode().Perm() != 0o644 {
				t.Errorf("mode %v, want 0644", fi.Mode().Perm())
			}
			assertOnly(t, dir, tt.file)
		})
	}
}

func TestWriteReplacesAtomically(t *testing.T) {
	spec, _ := generate(t, Options{})
	dir := t.TempDir()
	p := filepath.Join(dir, "nvidia.yaml")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(spec, p, ""); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if !bytes.HasPrefix(b, []byte("---\ncdiVersion")) {
		t.Errorf("old content not replaced: %.20q", b)
	}
	assertOnly(t, dir, "nvidia.yaml")
}

func TestWriteFailureLeavesNothing(t *testing.T) {
	spec, _ := generate(t, Options{})
	t.Run("missing directory is created", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "run", "cdi", "nvidia.yaml")
		if err := Write(spec, p, ""); err != nil {
			t.Fatalf("Write into a missing directory: %v", err)
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("parent is a file", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "nope"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		err := Write(spec, filepath.Join(dir, "nope", "nvidia.yaml"), "")
		if err == nil || !strings.Contains(err.Error(), "nope") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("target is a directory", func(t *testing.T) {
		// The rename fails after the temporary file is complete: it must be
		// cleaned up, and the directory left as it was.
		dir := t.TempDir()
		if err := os.Mkdir(filepath.Join(dir, "nvidia.yaml"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml", "x"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := Write(spec, filepath.Join(dir, "nvidia.yaml"), ""); err == nil {
			t.Fatal("no error")
		}
		assertOnly(t, dir, "nvidia.yaml")
	})
	t.Run("unwritable directory", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root ignores directory permissions; the rename-failure case covers cleanup")
		}
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(dir, 0o755)
		if err := Write(spec, filepath.Join(dir, "nvidia.yaml"), ""); err == nil {
			t.Fatal("no error")
		}
		assertOnly(t, dir)
	})
}

// assertOnly fails unless dir holds exactly the named entries.
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	slices.Sort(names)
	if !slices.Equal(got, names) {
		t.Errorf("%s holds %v, want %v", dir, got, names)
	}
}

// eightGPUs is an H100x8-like host for the benchmark.
func eightGPUs() *gpu.System {
	sys := &gpu.System{DriverVersion: "550.54.15", CUDADriverVersion: "12.4"}
	for i := range 8 {
		sys.Devices = append(sys.Devices, gpu.Device{
			Index: i, Minor: i, UUID: fmt.Sprintf("GPU-%08d-1111-2222-3333-444444444444", i),
			PCIBusID: fmt.Sprintf("00000000:%02x:00.0", 0x18+i), Brand: "nvidia", ComputeCapability: "9.0",
		})
	}
	return sys
}

func BenchmarkGenerate(b *testing.B) {
	sys := eightGPUs()
	devRoot := makeDevRoot(b, sys)
	inv := testInventory()
	opts := Options{HookPath: hookPath, DevRoot: devRoot}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Generate(sys, inv, opts); err != nil {
			b.Fatal(err)
		}
	}
}

// Every hook of every spec form carries the fixed environment, also through
// the CDI library's injection into an OCI spec: a createContainer hook
// without one runs with the container's process.env.
func TestHooksHaveEnv(t *testing.T) {
	for _, hp := range []string{hookPath, "/usr/bin/gantry", "/usr/bin/nvidia-cdi-hook"} {
		spec, _ := generate(t, Options{HookPath: hp})
		var hooks []*specs.Hook
		hooks = append(hooks, spec.ContainerEdits.Hooks...)
		for _, d := range spec.Devices {
			hooks = append(hooks, d.ContainerEdits.Hooks...)
		}
		if len(hooks) == 0 {
			t.Fatalf("%s: no hooks", hp)
		}
		for _, h := range hooks {
			if !slices.Equal(h.Env, edits.HookEnv()) {
				t.Errorf("%s: hook %q has env %q, want %q", hp, h.Args, h.Env, edits.HookEnv())
			}
		}
		dir := t.TempDir()
		if err := Write(spec, filepath.Join(dir, "gpu.yaml"), ""); err != nil {
			t.Fatal(err)
		}
		cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
		if err != nil {
			t.Fatal(err)
		}
		oci := &ocispecs.Spec{Process: &ocispecs.Process{Env: []string{"LD_PRELOAD=/proc/self/cwd/evil.so"}}, Linux: &ocispecs.Linux{}}
		if _, err := cache.InjectDevices(oci, "nvidia.com/gpu=0"); err != nil {
			t.Fatalf("%s: %v", hp, err)
		}
		if oci.Hooks == nil || len(oci.Hooks.CreateContainer) < 2 {
			t.Fatalf("%s: injected hooks %+v", hp, oci.Hooks)
		}
		for _, h := range oci.Hooks.CreateContainer {
			if !slices.Equal(h.Env, edits.HookEnv()) {
				t.Errorf("%s: injected hook %q has env %q", hp, h.Args, h.Env)
			}
		}
	}
}

// Forward compatibility in the common edits: gantry's update-ldcache hook
// gets the host driver version; with NVIDIA's nvidia-cdi-hook (whose
// update-ldcache lacks the flag) an enable-cuda-compat hook runs first.
func TestForwardCompatHooks(t *testing.T) {
	version := testInventory().Version
	spec, _ := generate(t, Options{})
	var args []string
	for _, h := range spec.ContainerEdits.Hooks {
		if strings.Contains(strings.Join(h.Args, " "), "update-ldcache") {
			args = h.Args
		}
	}
	if n := len(args); n < 2 || args[n-2] != "--host-driver-version" || args[n-1] != version {
		t.Errorf("gantry update-ldcache hook args %q: want --host-driver-version %s at the end", args, version)
	}

	spec, _ = generate(t, Options{HookPath: "/usr/bin/nvidia-cdi-hook"})
	var names []string
	for _, h := range spec.ContainerEdits.Hooks {
		names = append(names, strings.Join(h.Args[1:], " "))
	}
	want := "enable-cuda-compat --host-driver-version=" + version
	i := slices.Index(names, want)
	j := slices.IndexFunc(names, func(s string) bool { return strings.HasPrefix(s, "update-ldcache") })
	if i < 0 || j < 0 || i > j || strings.Contains(names[j], "host-driver-version") {
		t.Errorf("nvidia-cdi-hook hooks %q: want %q before a plain update-ldcache", names, want)
	}
}

// marshalYAML writes what sigs.k8s.io/yaml.Marshal writes, byte for byte,
// for generated specs and for values with every JSON type and strings the
// YAML writer must quote.
func TestMarshalYAMLMatchesLibrary(t *testing.T) {
	spec, _ := generate(t, Options{})
	sys := eightGPUs()
	big, err := Generate(sys, testInventory(), Options{HookPath: hookPath, DevRoot: makeDevRoot(t, sys)})
	if err != nil {
		t.Fatal(err)
	}
	oddStrings := []string{"0", "1.5", "yes", "no", "on", "null", "~", "true", "", " lead", "trail ", "a: b", "#c", "x #y", "line\nbreak", "tab\t", "quote\"", "'", "é ü", "\u2028", "-", "- x", "0x1F", "1e3", "2001-12-14", "*a", "&a", "!t", "%p", "@", "`", "{", "[", "|", ">", "?", "yEs", "Off", "a:", "a::b", "/x/y.so.1", "_", "x=y", "a#b", "é", "\x01", strings.Repeat("ab ", 40),
		"--link", "--a-b", "--x:y", "---", "---x", "--1", "--", "-x", "580.159.04", "1.2.3", "1.2", "1.2.", "0:1", "0:60", "1:59:30", "0:5:9", "08", "007",
		"99999999999999999999", "0:1.5", "1_000", "0b101", ".5", "+1", "-1", "1:", ":1", strings.Repeat("1", 65)}
	odd := map[string]any{
		"strings": []string{"0", "1.5", "yes", "no", "on", "null", "~", "true", "", " lead", "trail ", "a: b", "#c", "x #y", "line\nbreak", "tab\t", "quote\"", "'", "é ü", "\u2028", "-", "- x", "0x1F", "1e3", "2001-12-14", "*a", "&a", "!t", "%p", "@", "`", "{", "[", "|", ">", "?"},
		"numbers": []any{0, -1, 1 << 40, uint64(1) << 63, 1.5, 1e300, -0.0, uint32(4294967295)},
		"bools":   []bool{true, false},
		"empty":   map[string]any{"m": map[string]any{}, "s": []any{}, "n": nil},
	}
	// The generated specs take the direct writer, not yaml.v2.
	for _, sp := range []*specs.Spec{spec, big} {
		j, _ := json.Marshal(sp)
		dec := json.NewDecoder(bytes.NewReader(j))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		if err := (&yamlWriter{}).mapping(m, 0, false); err != nil {
			t.Errorf("spec %s: the direct YAML writer gives up: %v", sp.Kind, err)
		}
	}
	var deep []any
	for _, s := range oddStrings {
		deep = append(deep, map[string]any{"name": s, "list": []string{s, "x"}, "map": map[string]any{"key": s}})
	}
	for name, v := range map[string]any{"2-GPU spec": spec, "8-GPU spec": big, "odd values": odd,
		"odd strings": map[string]any{"strings": oddStrings, "deep": deep, "empty": map[string]any{}, "none": []string{}}} {
		got, err := marshalYAML(v)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, err := sigsyaml.Marshal(v)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: marshalYAML differs from sigs.k8s.io/yaml:\n%s\nwant\n%s", name, got, want)
		}
	}
}

// The specs cdi generate writes, MIG devices included, need no yaml.v2:
// the lean nvidia-ctk (gantry-runtime, which links none) writes them
// itself instead of handing the command line to gantry.
func TestGeneratedSpecsNeedNoYAMLv2(t *testing.T) {
	saved := yamlV2
	t.Cleanup(func() { yamlV2 = saved })
	yamlV2 = func(v any) ([]byte, error) { return nil, fmt.Errorf("yaml.v2 asked for %#v", v) }
	spec, _ := generate(t, Options{})
	sys := eightGPUs()
	big, err := Generate(sys, testInventory(), Options{HookPath: hookPath, DevRoot: makeDevRoot(t, sys)})
	if err != nil {
		t.Fatal(err)
	}
	// The 2-GPU system has MIG devices (names "1:0"; see 2gpu-mig.golden.yaml).
	for name, sp := range map[string]*specs.Spec{"2 GPUs with MIG": spec, "8 GPUs": big} {
		if _, err := marshalYAML(sp); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzMarshalYAML: any string, as a value, in a list and in a nested
// mapping, comes out as sigs.k8s.io/yaml writes it.
func FuzzMarshalYAML(f *testing.F) {
	for _, s := range []string{"0", "nvidia.com/gpu", "a: b", "yes", "/dev/nvidia0", "libcuda.so.1::/usr/lib/x"} {
		f.Add(s, int64(1))
	}
	f.Fuzz(func(t *testing.T, s string, n int64) {
		v := map[string]any{"value": s, "list": []any{s, n, map[string]any{"name": s, "n": n}}, "nested": map[string]any{"key": s}}
		got, err := marshalYAML(v)
		if err != nil {
			t.Fatal(err)
		}
		want, err := sigsyaml.Marshal(v)
		if err != nil {
			// The library's YAML parser refuses control characters in the
			// JSON it re-reads; marshalYAML writes them escaped.
			return
		}
		if !bytes.Equal(got, want) {
			t.Errorf("marshalYAML differs from sigs.k8s.io/yaml for %q:\n%s\nwant\n%s", s, got, want)
		}
	})
}

func BenchmarkMarshalYAML(b *testing.B) {
	sys := eightGPUs()
	spec, err := Generate(sys, testInventory(), Options{HookPath: hookPath, DevRoot: makeDevRoot(b, sys)})
	if err != nil {
		b.Fatal(err)
	}
	for name, marshal := range map[string]func(any) ([]byte, error){"marshalYAML": marshalYAML, "sigs.k8s.io-yaml": sigsyaml.Marshal} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := marshal(spec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzSpecYAML: any string in the places a generated spec has strings (a
// device name, an env entry, a hook's path and arguments, a mount's paths
// and options, a node's path) comes out of the spec writer (specTree, the
// writer gantry-runtime uses without yaml.v2) as sigs.k8s.io/yaml writes it.
func FuzzSpecYAML(f *testing.F) {
	for _, s := range []string{"0", "0:1", "--link", "580.159.04", "1.2", "-1", "yes", "a: b", "1e3", "0x1F", "~"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.ContainsAny(s, "\u0085\u2028\u2029") {
			// The library re-reads its own JSON with a YAML 1.1 parser,
			// which takes these for line breaks and writes a blank: yaml.v2
			// (our fallback) keeps the character ("\N"), the better answer.
			return
		}
		spec := &specs.Spec{
			Version: "0.5.0",
			Kind:    "nvidia.com/gpu",
			Devices: []specs.Device{{
				Name: s,
				ContainerEdits: specs.ContainerEdits{
					Env:         []string{s, "NVIDIA_VISIBLE_DEVICES=void"},
					DeviceNodes: []*specs.DeviceNode{{Path: s, HostPath: "/dev/nvidia0"}},
				},
			}},
			ContainerEdits: specs.ContainerEdits{
				Hooks:  []*specs.Hook{{HookName: "createContainer", Path: s, Args: []string{"nvidia-cdi-hook", s, "--folder", s}, Env: []string{s}}},
				Mounts: []*specs.Mount{{HostPath: s, ContainerPath: "/x", Options: []string{"ro", s}}},
			},
		}
		got, err := marshalYAML(spec)
		if err != nil {
			t.Fatal(err)
		}
		want, err := sigsyaml.Marshal(spec)
		if err != nil {
			return // the library's YAML parser refuses some control characters
		}
		if !bytes.Equal(got, want) {
			t.Errorf("the spec writer differs from sigs.k8s.io/yaml for %q:\n%s\nwant\n%s", s, got, want)
		}
	})
}
