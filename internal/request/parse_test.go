package request

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/driver"
)

var (
	defaultCaps = []driver.Capability{driver.Compute, driver.Utility}
	allCaps     = driver.AllCapabilities
)

func sel(m Mode, ids ...string) Selection { return Selection{Mode: m, IDs: ids} }

// Env of nvidia/cuda:12.4.1-base-ubuntu22.04 (no NVIDIA_VISIBLE_DEVICES
// override) plus whatever the test adds.
func cuda124Env(extra ...string) []string {
	return append([]string{
		"PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"NVARCH=x86_64",
		"NVIDIA_REQUIRE_CUDA=" + requireCUDA124,
		"NV_CUDA_CUDART_VERSION=12.4.127-1",
		"NV_CUDA_COMPAT_PACKAGE=cuda-compat-12-4",
		"CUDA_VERSION=12.4.1",
		"LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
		"NVIDIA_VISIBLE_DEVICES=all",
		"NVIDIA_DRIVER_CAPABILITIES=compute,utility",
	}, extra...)
}

// parseCase is one row of TestParse's table.
type parseCase struct {
	name    string
	in      Input
	opts    Options
	source  Source
	devices Selection
	cdi     []string
	caps    []driver.Capability
	reqVars []string // Var of each requirement
	legacy  bool
	warn    string // substring of a warning
}

// parseTable is TestParse's table (also read by the fast path's agreement test).
func parseTable() []parseCase {
	def := DefaultOptions()
	strict := DefaultOptions()
	strict.AcceptEnvWhenUnprivileged = false
	strict.AcceptVolumeMounts = true
	mounts := DefaultOptions()
	mounts.AcceptVolumeMounts = true
	swarm := DefaultOptions()
	swarm.SwarmResource = []string{"DOCKER_RESOURCE_GPU"}
	lenient := DefaultOptions()
	lenient.LenientCapabilities = true
	noreq := DefaultOptions()
	noreq.DisableRequire = true

	return []parseCase{
		{name: "cuda 12.4 image", in: Input{Env: cuda124Env()}, opts: def,
			source: SourceEnv, devices: sel(All), caps: defaultCaps, reqVars: []string{"NVIDIA_REQUIRE_CUDA"}},
		{name: "no env at all", in: Input{}, opts: def, devices: sel(Void)},
		{name: "plain image, unset", in: Input{Env: []string{"PATH=/bin"}}, opts: def, devices: sel(Void)},
		{name: "empty", in: Input{Env: []string{"NVIDIA_VISIBLE_DEVICES="}}, opts: def, devices: sel(Void)},
		{name: "void", in: Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}}, opts: def, devices: sel(Void)},
		{name: "void wins in a list", in: Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0,void,1"}}, opts: def, devices: sel(Void)},
		{name: "only commas", in: Input{Env: []string{"NVIDIA_VISIBLE_DEVICES= , ,"}}, opts: def, devices: sel(Void)},
		{name: "none", in: Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=none"}}, opts: def,
			source: SourceEnv, devices: sel(None), caps: defaultCaps},
		{name: "all upper case", in: Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=ALL"}}, opts: def,
			source: SourceEnv, devices: sel(All), caps: defaultCaps},
		{name: "all in a list", in: Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0,all"}}, opts: def,
			source: SourceEnv, devices: sel(All), caps: defaultCaps},
		{name: "first of none/all wins", in: Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=none,all"}}, opts: def,
			source: SourceEnv, devices: sel(None), caps: defaultCaps},
		{name: "mixed list with spaces and duplicates",
			in:   Input{Env: []string{"NVIDIA_VISIBLE_DEVICES= 0, GPU-9d1d48bf-04bc-2c4f-d59d-2ead2773c340 ,,1:0,MIG-5c89852c-d268-c3f3-8ca5-c3e1d1af1a8a,MIG-GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5/1/0,00000000:3B:00.0,0"}},
			opts: def, source: SourceEnv,
			devices: sel(List, "0", "GPU-9d1d48bf-04bc-2c4f-d59d-2ead2773c340", "1:0", "MIG-5c89852c-d268-c3f3-8ca5-c3e1d1af1a8a", "MIG-GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5/1/0", "00000000:3B:00.0"),
			caps:    defaultCaps},
		{name: "duplicate env key: last wins",
			in:   Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=1"}},
			opts: def, source: SourceEnv, devices: sel(List, "1"), caps: defaultCaps},
		{name: "CDI names in the env",
			in:   Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0,nvidia.com/gpu=all"}},
			opts: def, source: SourceEnv, devices: sel(Void), cdi: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=all"}, caps: defaultCaps},
		{name: "legacy image: unset means all, every capability, cuda>=9.0",
			in:   Input{Env: []string{"CUDA_VERSION=9.0.176"}},
			opts: def, source: SourceEnv, devices: sel(All), caps: allCaps, reqVars: []string{"CUDA_VERSION"}, legacy: true},
		{name: "legacy image with empty NVIDIA_REQUIRE_CUDA",
			in:   Input{Env: []string{"CUDA_VERSION=8.0.61", "NVIDIA_REQUIRE_CUDA="}},
			opts: def, source: SourceEnv, devices: sel(All), caps: allCaps, reqVars: []string{"CUDA_VERSION"}, legacy: true},
		{name: "legacy image: set but empty is void",
			in:   Input{Env: []string{"CUDA_VERSION=9.0.176", "NVIDIA_VISIBLE_DEVICES="}},
			opts: def, devices: sel(Void), legacy: true},
		{name: "legacy image: empty capabilities are the default",
			in:   Input{Env: []string{"CUDA_VERSION=9.0.176", "NVIDIA_DRIVER_CAPABILITIES="}},
			opts: def, source: SourceEnv, devices: sel(All), caps: defaultCaps, reqVars: []string{"CUDA_VERSION"}, legacy: true},
		{name: "not legacy when NVIDIA_REQUIRE_CUDA is set",
			in:   Input{Env: []string{"CUDA_VERSION=12.4.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"}},
			opts: def, devices: sel(Void)},
		{name: "capabilities: all beside others, spaces, duplicates",
			in:   Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES= video, all ,video"}},
			opts: def, source: SourceEnv, devices: sel(List, "0"), caps: allCaps},
		{name: "capabilities: ordered",
			in:   Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=ngx,graphics,,compute,graphics"}},
			opts: def, source: SourceEnv, devices: sel(List, "0"), caps: []driver.Capability{driver.Compute, driver.Graphics, driver.NGX}},
		{name: "capabilities: unknown dropped when lenient",
			in:   Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,opengl"}},
			opts: lenient, source: SourceEnv, devices: sel(List, "0"), caps: []driver.Capability{driver.Compute}, warn: `"opengl"`},
		{name: "all NVIDIA_REQUIRE_*, sorted, jetpack and empty skipped",
			in: Input{Env: cuda124Env("NVIDIA_REQUIRE_DRIVER=driver>=450", "NVIDIA_REQUIRE_ARCH=arch>=7.0",
				"NVIDIA_REQUIRE_JETPACK=csv-mounts=all", "NVIDIA_REQUIRE_EMPTY=")},
			opts: def, source: SourceEnv, devices: sel(All), caps: defaultCaps,
			reqVars: []string{"NVIDIA_REQUIRE_ARCH", "NVIDIA_REQUIRE_CUDA", "NVIDIA_REQUIRE_DRIVER"}},
		{name: "NVIDIA_DISABLE_REQUIRE=true", in: Input{Env: cuda124Env("NVIDIA_DISABLE_REQUIRE=true")}, opts: def,
			source: SourceEnv, devices: sel(All), caps: defaultCaps},
		{name: "NVIDIA_DISABLE_REQUIRE=1", in: Input{Env: cuda124Env("NVIDIA_DISABLE_REQUIRE=1")}, opts: def,
			source: SourceEnv, devices: sel(All), caps: defaultCaps},
		{name: "NVIDIA_DISABLE_REQUIRE=TRUE", in: Input{Env: cuda124Env("NVIDIA_DISABLE_REQUIRE=TRUE")}, opts: def,
			source: SourceEnv, devices: sel(All), caps: defaultCaps},
		{name: "NVIDIA_DISABLE_REQUIRE=yes is not true", in: Input{Env: cuda124Env("NVIDIA_DISABLE_REQUIRE=yes")}, opts: def,
			source: SourceEnv, devices: sel(All), caps: defaultCaps, reqVars: []string{"NVIDIA_REQUIRE_CUDA"}},
		{name: "NVIDIA_DISABLE_REQUIRE=false", in: Input{Env: cuda124Env("NVIDIA_DISABLE_REQUIRE=false")}, opts: def,
			source: SourceEnv, devices: sel(All), caps: defaultCaps, reqVars: []string{"NVIDIA_REQUIRE_CUDA"}},
		{name: "host disable-require", in: Input{Env: cuda124Env("NVIDIA_REQUIRE_BAD=foo")}, opts: noreq,
			source: SourceEnv, devices: sel(All), caps: defaultCaps},
		{name: "a void request ignores bad requirements and MIG vars",
			in:   Input{Env: []string{"NVIDIA_REQUIRE_X=nonsense", "NVIDIA_DRIVER_CAPABILITIES=bogus", "NVIDIA_MIG_CONFIG_DEVICES=all"}},
			opts: def, devices: sel(Void)},
		{name: "unprivileged env ignored when not accepted",
			in:   Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}},
			opts: strict, devices: sel(Void), warn: "unprivileged"},
		{name: "privileged env honoured when unprivileged is not accepted",
			in:   Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Privileged: true},
			opts: strict, source: SourceEnv, devices: sel(All), caps: defaultCaps},
		{name: "volume mounts win over the env",
			in: Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, MountDestinations: []string{
				"/var/run/nvidia-container-devices/GPU-abc", "/var/run/nvidia-container-devices/1/", "/var/run/nvidia-container-devices//GPU-abc",
				"/var/run/nvidia-container-devices/imex/0", "/var/run/nvidia-container-devices", "/var/run/nvidia-container-devicesX/2", "/data"}},
			opts: strict, source: SourceMounts, devices: sel(List, "GPU-abc", "1"), caps: defaultCaps},
		{name: "volume mount all", in: Input{MountDestinations: []string{"/var/run/nvidia-container-devices/all"}},
			opts: mounts, source: SourceMounts, devices: sel(All), caps: defaultCaps},
		{name: "volume mount CDI names",
			in: Input{MountDestinations: []string{"/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/0",
				"/var/run/nvidia-container-devices/cdi/nvidia.com/gpu=1"}},
			opts: mounts, source: SourceMounts, devices: sel(Void), cdi: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}, caps: defaultCaps},
		{name: "volume mounts ignored unless accepted",
			in:   Input{MountDestinations: []string{"/var/run/nvidia-container-devices/0"}},
			opts: def, devices: sel(Void)},
		{name: "no mount request falls back to the env",
			in:   Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=2"}, MountDestinations: []string{"/var/run/nvidia-container-devices/imex/1"}},
			opts: mounts, source: SourceEnv, devices: sel(List, "2"), caps: defaultCaps},
		{name: "CDI annotations win, keys sorted, values trimmed and deduplicated",
			in: Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Annotations: map[string]string{
				"cdi.k8s.io/b":         "nvidia.com/gpu=1, nvidia.com/gpu=0",
				"cdi.k8s.io/a":         "nvidia.com/gpu=0,,",
				"io.kubernetes.pod/ns": "x"},
				MountDestinations: []string{"/var/run/nvidia-container-devices/3"}},
			opts: mounts, source: SourceCDIAnnotations, devices: sel(Void), cdi: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}, caps: defaultCaps},
		{name: "empty CDI annotation falls through",
			in:   Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, Annotations: map[string]string{"cdi.k8s.io/x": " "}},
			opts: def, source: SourceEnv, devices: sel(List, "0"), caps: defaultCaps},
		{name: "swarm resource replaces NVIDIA_VISIBLE_DEVICES",
			in:   Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "DOCKER_RESOURCE_GPU=GPU-a,GPU-b"}},
			opts: swarm, source: SourceEnv, devices: sel(List, "GPU-a", "GPU-b"), caps: defaultCaps},
		{name: "swarm resource unset: NVIDIA_VISIBLE_DEVICES",
			in:   Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=3"}},
			opts: swarm, source: SourceEnv, devices: sel(List, "3"), caps: defaultCaps},
	}
}

func TestParse(t *testing.T) {
	for _, tt := range parseTable() {
		t.Run(tt.name, func(t *testing.T) {
			req, err := Parse(tt.in, tt.opts)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if req.Source != tt.source || !reflect.DeepEqual(req.Devices, tt.devices) || !slices.Equal(req.CDIDevices, tt.cdi) {
				t.Errorf("source, devices, cdi = %q, %+v, %q; want %q, %+v, %q", req.Source, req.Devices, req.CDIDevices, tt.source, tt.devices, tt.cdi)
			}
			if !slices.Equal(req.Capabilities, tt.caps) {
				t.Errorf("capabilities = %v, want %v", req.Capabilities, tt.caps)
			}
			var vars []string
			for _, r := range req.Requirements {
				vars = append(vars, r.Var)
				if r.Alternatives == nil {
					t.Errorf("%s not parsed", r.Var)
				}
			}
			if !slices.Equal(vars, tt.reqVars) {
				t.Errorf("requirements = %v, want %v", vars, tt.reqVars)
			}
			if req.Legacy != tt.legacy {
				t.Errorf("legacy = %v", req.Legacy)
			}
			if tt.warn != "" && !strings.Contains(strings.Join(req.Warnings, "\n"), tt.warn) {
				t.Errorf("warnings = %q, want one containing %q", req.Warnings, tt.warn)
			}
			if req.Wants() != (tt.devices.Mode != Void || len(tt.cdi) > 0) {
				t.Errorf("Wants = %v", req.Wants())
			}
		})
	}
}

func TestParseLegacyRequirementValue(t *testing.T) {
	req, err := Parse(Input{Env: []string{"CUDA_VERSION=9.0.176"}}, DefaultOptions())
	if err != nil || len(req.Requirements) != 1 || req.Requirements[0].Expr != "cuda>=9.0" {
		t.Fatalf("Parse = %+v, %v", req, err)
	}
	if err := Check(req.Requirements, Host{CUDA: "8.0", Driver: "375.26"}, nil); !errors.Is(err, ErrUnsatisfied) ||
		!strings.HasPrefix(err.Error(), `CUDA_VERSION "cuda>=9.0": host CUDA driver supports 8.0`) {
		t.Errorf("Check = %v", err)
	}
	if err := Check(req.Requirements, host550, nil); err != nil {
		t.Errorf("Check = %v", err)
	}
}

func TestParseMIG(t *testing.T) {
	env := []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_MIG_CONFIG_DEVICES=all", "NVIDIA_MIG_MONITOR_DEVICES=none"}
	req, err := Parse(Input{Env: env, Privileged: true}, DefaultOptions())
	if err != nil || req.MIGConfig.Mode != All || req.MIGMonitor.Mode != Void {
		t.Fatalf("Parse = %+v, %v", req, err)
	}
	_, err = Parse(Input{Env: env}, DefaultOptions())
	if !errors.Is(err, ErrNotPrivileged) || !strings.Contains(err.Error(), "NVIDIA_MIG_CONFIG_DEVICES") {
		t.Errorf("unprivileged: %v", err)
	}
	_, err = Parse(Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_MIG_MONITOR_DEVICES=0"}, Privileged: true}, DefaultOptions())
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `only "all"`) {
		t.Errorf("list: %v", err)
	}
}

// parseErrorCase is one row of TestParseErrors's table.
type parseErrorCase struct {
	name string
	in   Input
	opts Options
	want []string // substrings: the variable, the value, the fix
}

// parseErrorTable is TestParseErrors's table (also read by the fast path's agreement test).
func parseErrorTable() []parseErrorCase {
	mounts := DefaultOptions()
	mounts.AcceptVolumeMounts = true
	return []parseErrorCase{
		{"semicolon list", Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0;1"}}, DefaultOptions(),
			[]string{"NVIDIA_VISIBLE_DEVICES=", `"0;1"`, "comma list"}},
		{"negative index", Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=-1"}}, DefaultOptions(),
			[]string{"NVIDIA_VISIBLE_DEVICES=", `"-1" is not a device`}},
		{"space inside an item", Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0 1"}}, DefaultOptions(),
			[]string{`"0 1" is not a device`}},
		{"bad CDI name", Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=gpu=0"}}, DefaultOptions(),
			[]string{`"gpu=0" is not a CDI device name`}},
		{"bad annotation", Input{Annotations: map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=0,gpu0"}}, DefaultOptions(),
			[]string{"annotation cdi.k8s.io/x=", `"gpu0"`, "vendor.com/class=name"}},
		{"bad mount", Input{MountDestinations: []string{"/var/run/nvidia-container-devices/0;1"}}, mounts,
			[]string{"volume-mount device list", `"0;1"`}},
		{"volume-mounts strategy without accept-volume-mounts", Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"},
			MountDestinations: []string{"/var/run/nvidia-container-devices/GPU-0b2c1a8e-3f4d-4e5f-8a9b-0c1d2e3f4a5b"}}, DefaultOptions(),
			[]string{"NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices", "runtime.accept-volume-mounts = true", "/etc/gantry/config.toml", "volume-mounts strategy"}},
		{"bad CDI mount", Input{MountDestinations: []string{"/var/run/nvidia-container-devices/cdi/gpu"}}, mounts,
			[]string{"mount /var/run/nvidia-container-devices/cdi/gpu"}},
		{"unknown capability", Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,opengl"}}, DefaultOptions(),
			[]string{"NVIDIA_DRIVER_CAPABILITIES=", `"opengl"`, "use one of"}},
		{"none is not a capability", Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=none"}}, DefaultOptions(),
			[]string{`"none"`}},
		{"bad requirement", Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=12.4 driver=>535"}}, DefaultOptions(),
			[]string{"NVIDIA_REQUIRE_CUDA=", "unknown operator", "NVIDIA_DISABLE_REQUIRE=true"}},
		{"bad legacy CUDA_VERSION", Input{Env: []string{"CUDA_VERSION=nine"}}, DefaultOptions(),
			[]string{"CUDA_VERSION=", `"nine"`}},
		{"env entry without =", Input{Env: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES"}}, DefaultOptions(),
			[]string{`"NVIDIA_VISIBLE_DEVICES" has no '='`}},
	}
}

func TestParseErrors(t *testing.T) {
	for _, tt := range parseErrorTable() {
		t.Run(tt.name, func(t *testing.T) {
			req, err := Parse(tt.in, tt.opts)
			if err == nil {
				t.Fatalf("Parse = %+v, want an error", req)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("err = %v, want ErrInvalid", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestIsDeviceID(t *testing.T) {
	good := []string{"0", "15", "GPU-9d1d48bf-04bc-2c4f-d59d-2ead2773c340", "gpu-abc", "MIG-5c89852c-d268-c3f3-8ca5-c3e1d1af1a8a",
		"MIG-GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5/1/0", "0:1", "12:0", "0000:3b:00.0", "00000000:3B:00.0"}
	bad := []string{"", "-1", "+1", "1.5", "GPU-", "MIG-", "GPU-a b", "0:", ":1", "0:1:2", "0;1", "all", "0000:3b:00", "1234567890", "../0"}
	for _, s := range good {
		if !IsDeviceID(s) {
			t.Errorf("IsDeviceID(%q) = false", s)
		}
	}
	for _, s := range bad {
		if IsDeviceID(s) {
			t.Errorf("IsDeviceID(%q) = true", s)
		}
	}
}

func TestCDINames(t *testing.T) {
	r := &Request{Kind: DefaultKind, Devices: sel(List, "0", "1:0"), CDIDevices: []string{"nvidia.com/gpu=0", "vendor.com/nic=1"}}
	want := []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1:0", "vendor.com/nic=1"}
	if got := r.CDINames(); !slices.Equal(got, want) {
		t.Errorf("CDINames = %q, want %q", got, want)
	}
	r = &Request{Kind: DefaultKind, Devices: sel(All)}
	if got := r.CDINames(); !slices.Equal(got, []string{"nvidia.com/gpu=all"}) {
		t.Errorf("CDINames = %q", got)
	}
}

func TestInputFromSpec(t *testing.T) {
	spec := &specs.Spec{
		Process: &specs.Process{
			Env:          []string{"NVIDIA_VISIBLE_DEVICES=all"},
			Capabilities: &specs.LinuxCapabilities{Bounding: []string{"CAP_CHOWN", "CAP_SYS_ADMIN"}, Effective: []string{"CAP_CHOWN"}},
		},
		Mounts: []specs.Mount{
			{Source: "/dev/null", Destination: "/var/run/nvidia-container-devices/0"},
			{Source: "/data/x", Destination: "/var/run/nvidia-container-devices/1"}, // an image VOLUME: not a request
		},
		Annotations: map[string]string{"cdi.k8s.io/a": "nvidia.com/gpu=0"},
	}
	in := InputFromSpec(spec)
	if !in.Privileged || !slices.Equal(in.MountDestinations, []string{"/var/run/nvidia-container-devices/0"}) || len(in.Env) != 1 || len(in.Annotations) != 1 {
		t.Errorf("InputFromSpec = %+v", in)
	}
	spec.Process.Capabilities.Bounding = []string{"CAP_CHOWN"}
	spec.Process.Capabilities.Effective = []string{"CAP_SYS_ADMIN"} // only the bounding set counts
	if IsPrivileged(spec) || IsPrivileged(nil) || IsPrivileged(&specs.Spec{}) {
		t.Error("IsPrivileged = true")
	}
	if in := InputFromSpec(nil); in.Env != nil {
		t.Errorf("InputFromSpec(nil) = %+v", in)
	}
}

func BenchmarkParseCUDAImage(b *testing.B) {
	in := Input{Env: cuda124Env("HOSTNAME=abc", "HOME=/root", "TERM=xterm")}
	opts := DefaultOptions()
	for b.Loop() {
		if _, err := Parse(in, opts); err != nil {
			b.Fatal(err)
		}
	}
}
