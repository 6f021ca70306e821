//go:build cgo

package shim

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/fastpath"
	"github.com/gantry-gpu/gantry/internal/request"
)

// specFor is config.json as an engine writes it (encoding/json) for a
// process env, annotations and mounts of /dev/null at dsts.
func specFor(t testing.TB, env []string, annotations map[string]string, dsts []string, privileged bool) []byte {
	s := ocispecs.Spec{
		Version:     "1.0.2",
		Process:     &ocispecs.Process{Args: []string{"/bin/true"}, Env: env, Cwd: "/"},
		Root:        &ocispecs.Root{Path: "rootfs"},
		Annotations: annotations,
	}
	if privileged {
		s.Process.Capabilities = &ocispecs.LinuxCapabilities{Bounding: []string{"CAP_SYS_ADMIN"}}
	}
	for _, d := range dsts {
		s.Mounts = append(s.Mounts, ocispecs.Mount{Destination: d, Type: "bind", Source: "/dev/null", Options: []string{"bind", "ro"}})
	}
	b, err := json.MarshalIndent(&s, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkAgreement: when the C fast path says a spec holds no request, the
// Go path (request.Parse under the default configuration, volume mounts
// accepted too) must not find one: the fast path may only ever be
// conservative. The one Go error it may skip is an env entry without '=',
// which runc refuses as well.
func checkAgreement(t testing.TB, spec []byte) {
	if !fastpath.NoRequest(spec) {
		return
	}
	var s ocispecs.Spec
	if err := json.Unmarshal(spec, &s); err != nil {
		return // runc refuses it as well
	}
	for _, accept := range []bool{false, true} {
		cfg := config.Default()
		cfg.Runtime.AcceptVolumeMounts = accept
		req, err := request.Parse(request.InputFromSpec(&s), discover.RequestOptions(cfg))
		if err != nil {
			if errors.Is(err, request.ErrInvalid) && strings.Contains(err.Error(), "has no '='") {
				continue
			}
			t.Fatalf("the fast path passes a spec on which the Go path fails (%v):\n%s", err, spec)
		}
		if req.Wants() {
			t.Fatalf("the fast path passes a spec that asks for %v (source %s):\n%s", req.Devices, req.Source, spec)
		}
	}
}

var fastCases = []struct {
	name        string
	env         []string
	annotations map[string]string
	mounts      []string
	fast        bool // the fast path takes it
}{
	{"plain", []string{"PATH=/bin", "HOME=/root"}, nil, nil, true},
	{"other NVIDIA variables only", []string{"NVIDIA_DRIVER_CAPABILITIES=all", "NVIDIA_REQUIRE_CUDA=cuda=12.4"}, nil, nil, true},
	{"visible devices", []string{"NVIDIA_VISIBLE_DEVICES=all"}, nil, nil, false},
	{"visible devices void", []string{"NVIDIA_VISIBLE_DEVICES=void"}, nil, nil, false},
	{"legacy CUDA image", []string{"CUDA_VERSION=9.0.176"}, nil, nil, false},
	{"CDI annotation", nil, map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=0"}, nil, false},
	{"other vendor CDI annotation", nil, map[string]string{"cdi.k8s.io/y": "vendor.com/dev=1"}, nil, false},
	{"other annotations", nil, map[string]string{"io.kubernetes.pod.name": "p"}, nil, true},
	{"volume-mount list", nil, nil, []string{"/var/run/nvidia-container-devices/0"}, false},
	{"volume-mount list under /run", nil, nil, []string{"/run/nvidia-container-devices/all"}, false},
	{"other mounts", nil, nil, []string{"/dev/shm/x"}, true},
	{"escaped text", []string{"PS1=\\u@\\h"}, nil, nil, false},
	{"html escape", []string{"X=<a>"}, nil, nil, false},
	{"swarm variable, default config", []string{"DOCKER_RESOURCE_GPU=0"}, nil, nil, true},
	{"entry without =", []string{"JUSTAKEY"}, nil, nil, true},
}

// The runc flag lists fastpath.c copies from args.go.
func TestFastPathFlagLists(t *testing.T) {
	c := fastpath.CConstants()
	for _, l := range []struct {
		name string
		c    []string
		goes map[string]bool
	}{{"global", c.GlobalValueFlags, globalValueFlags}, {"create", c.CreateValueFlags, createValueFlags}} {
		var want []string
		for f := range l.goes {
			want = append(want, f)
		}
		got := slices.Clone(l.c)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s value flags: fastpath.c %q, args.go %q", l.name, got, want)
		}
	}
}

func TestFastCreateDecision(t *testing.T) {
	for _, tc := range fastCases {
		t.Run(tc.name, func(t *testing.T) {
			spec := specFor(t, tc.env, tc.annotations, tc.mounts, false)
			if got := fastpath.NoRequest(spec); got != tc.fast {
				t.Errorf("fast path takes it = %v, want %v", got, tc.fast)
			}
			checkAgreement(t, spec)
			checkAgreement(t, specFor(t, tc.env, tc.annotations, tc.mounts, true))
		})
	}
	// A request spelt with JSON escapes decodes to the same request in Go;
	// the fast path must not be fooled by it.
	for _, raw := range []string{
		`{"process":{"env":["NVIDIA\u005fVISIBLE_DEVICES=all"]}}`,
		`{"annotations":{"cdi.k8s.io\/x":"nvidia.com/gpu=0"}}`,
		`{"process":{"env":["\u004eVIDIA_VISIBLE_DEVICES=0"]}}`,
	} {
		if fastpath.NoRequest([]byte(raw)) {
			t.Errorf("fast path takes %s", raw)
		}
		checkAgreement(t, []byte(raw))
	}
}

// The two decisions held against each other on fuzzed env, annotations and
// mounts, seeded with the request package's fuzz seeds and the table above.
func FuzzFastCreateDecision(f *testing.F) {
	f.Add("NVIDIA_VISIBLE_DEVICES=0,,1:0,GPU-x,all\nNVIDIA_DRIVER_CAPABILITIES=all,video", "", "", false)
	f.Add("CUDA_VERSION=9.0.176", "", "", false)
	f.Add("NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0\nNVIDIA_MIG_CONFIG_DEVICES=all\nNVIDIA_REQUIRE_X=arch>=8.0", "", "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/1", true)
	f.Add("PATH=/bin", "cdi.k8s.io/a=nvidia.com/gpu=0", "", false)
	for _, tc := range fastCases {
		var ann []string
		for k, v := range tc.annotations {
			ann = append(ann, k+"="+v)
		}
		f.Add(strings.Join(tc.env, "\n"), strings.Join(ann, "\n"), strings.Join(tc.mounts, "\n"), false)
	}
	f.Fuzz(func(t *testing.T, env, annotations, mounts string, privileged bool) {
		var e, m []string
		if env != "" {
			e = strings.Split(env, "\n")
		}
		if mounts != "" {
			m = strings.Split(mounts, "\n")
		}
		a := map[string]string{}
		for _, line := range strings.Split(annotations, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				a[k] = v
			}
		}
		checkAgreement(t, specFor(t, e, a, m, privileged))
	})
}

// Through the real binary: a create without a request is handed to the
// low-level runtime by the C constructor (no Go runtime start: GODEBUG's
// inittrace prints nothing), with runc's arguments unchanged; with a possible
// request, an unusual command line or a configuration that changes what a
// request is, Go decides (and, with no request, execs the same way).
func TestFastCreatePath(t *testing.T) {
	_, rt := buildGantry(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "argv")
	script := filepath.Join(dir, "fake-runc")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > "+out+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		env   []string
		extra string // configuration lines
		args  []string
		fast  bool
	}{
		{"no request", []string{"PATH=/bin"}, "", []string{"create", "--bundle", bundle, "c1"}, true},
		{"no request, run, -b=", []string{"PATH=/bin"}, "", []string{"--root", "/r", "run", "-d", "-b=" + bundle, "c1"}, true},
		{"void request", []string{"NVIDIA_VISIBLE_DEVICES=void"}, "", []string{"create", "--bundle", bundle, "c1"}, false},
		{"custom annotation prefixes", []string{"PATH=/bin"}, "[cdi]\nannotation-prefixes = [\"x/\"]\n", []string{"create", "--bundle", bundle, "c1"}, false},
		{"swarm resource", []string{"PATH=/bin"}, "swarm-resource = [\"DOCKER_RESOURCE_GPU\"]\n", []string{"create", "--bundle", bundle, "c1"}, false},
		{"TOML the fast path does not read (quoted key)", []string{"PATH=/bin"}, "\"cache-dir\" = \"\"\n", []string{"create", "--bundle", bundle, "c1"}, false},
		{"neutral keys only", []string{"PATH=/bin"}, "accept-volume-mounts = true\nkubernetes-env = \"any\"\n[cdi]\nspec-dirs = [\"/etc/cdi\"]\n", []string{"create", "--bundle", bundle, "c1"}, true},
		{"unknown flag", []string{"PATH=/bin"}, "", []string{"create", "--future-flag", "--bundle", bundle, "c1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(bundle, "config.json"), specFor(t, tc.env, nil, nil, false), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := filepath.Join(dir, "c.toml")
			cache := "cache-dir = '" + filepath.Join(dir, "cache") + "'\n"
			if strings.Contains(tc.extra, "cache-dir") {
				cache = "" // the case's own (a second would be a duplicate key)
			}
			if err := os.WriteFile(cfg, []byte("[runtime]\nlow-level = '"+script+"'\n"+cache+tc.extra), 0o644); err != nil {
				t.Fatal(err)
			}
			os.Remove(out)
			cmd := exec.Command(rt, tc.args...)
			cmd.Env = []string{"PATH=/usr/bin:/bin", "GANTRY_CONFIG=" + cfg, "GODEBUG=inittrace=1"}
			stderr, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("the low-level runtime did not run: %v\n%s", err, stderr)
			}
			if want := strings.Join(append([]string{script}, tc.args...), "\n") + "\n"; string(got) != want {
				t.Errorf("low-level runtime got argv\n%s\nwant\n%s", got, want)
			}
			if ranGo := strings.Contains(string(stderr), "init runtime"); ranGo == tc.fast {
				t.Errorf("fast path taken = %v, want %v", !ranGo, tc.fast)
			}
		})
	}
}
