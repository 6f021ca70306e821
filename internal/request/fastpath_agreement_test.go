//go:build cgo

package request_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/fastpath"
	"github.com/gantry-gpu/gantry/internal/request"
)

// specJSON is config.json as an engine writes it (encoding/json) for in.
func specJSON(t testing.TB, in request.Input) []byte {
	s := ocispecs.Spec{
		Version:     "1.0.2",
		Process:     &ocispecs.Process{Args: []string{"/bin/true"}, Env: in.Env, Cwd: "/"},
		Root:        &ocispecs.Root{Path: "rootfs"},
		Annotations: in.Annotations,
	}
	if in.Privileged {
		s.Process.Capabilities = &ocispecs.LinuxCapabilities{Bounding: []string{"CAP_SYS_ADMIN"}}
	}
	for _, d := range in.MountDestinations {
		s.Mounts = append(s.Mounts, ocispecs.Mount{Destination: d, Type: "bind", Source: "/dev/null", Options: []string{"bind", "ro"}})
	}
	b, err := json.MarshalIndent(&s, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// configTOML is a configuration file whose request options are opts'.
func configTOML(t testing.TB, opts request.Options) string {
	quote := func(l []string) string {
		var q []string
		for _, s := range l {
			q = append(q, fmt.Sprintf("%q", s))
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	k8s := config.KubernetesEnvAny
	if opts.Allocated != nil {
		k8s = config.KubernetesEnvAllocated
	}
	text := fmt.Sprintf("[runtime]\naccept-env-unprivileged = %v\naccept-volume-mounts = %v\ndisable-require = %v\nkubernetes-env = %q\n",
		opts.AcceptEnvWhenUnprivileged, opts.AcceptVolumeMounts, opts.DisableRequire, k8s)
	if len(opts.SwarmResource) > 0 {
		text += "swarm-resource = " + quote(opts.SwarmResource) + "\n"
	}
	text += fmt.Sprintf("[cdi]\nkind = %q\n", opts.DefaultKind)
	if !slices.Equal(opts.AnnotationPrefixes, request.DefaultOptions().AnnotationPrefixes) {
		text += "annotation-prefixes = " + quote(opts.AnnotationPrefixes) + "\n"
	}
	// The file says what opts says, as Go reads it.
	cfg, err := config.Parse([]byte(text))
	if err != nil {
		t.Fatalf("%s: %v", text, err)
	}
	got := discover.RequestOptions(cfg)
	if got.AcceptEnvWhenUnprivileged != opts.AcceptEnvWhenUnprivileged || got.AcceptVolumeMounts != opts.AcceptVolumeMounts ||
		got.DisableRequire != opts.DisableRequire || !slices.Equal(got.SwarmResource, opts.SwarmResource) ||
		!slices.Equal(got.AnnotationPrefixes, opts.AnnotationPrefixes) || got.DefaultKind != opts.DefaultKind {
		t.Fatalf("configuration\n%s\nreads as %+v, want %+v", text, got, opts)
	}
	return text
}

// agree feeds one case to both decisions: the C fast path (the
// configuration file's text, then config.json's) may say "no request"
// only when request.Parse finds none. The one Go error it may pass is an
// env entry without '=', which runc refuses as well. It reports whether C
// took the fast path.
func agree(t testing.TB, name string, in request.Input, opts request.Options) bool {
	_, ok, create := fastpath.ParseConfig([]byte(configTOML(t, opts)))
	spec := specJSON(t, in)
	if !ok || !create || !fastpath.NoRequest(spec) {
		return false
	}
	req, err := request.Parse(in, opts)
	if err != nil {
		if errors.Is(err, request.ErrInvalid) && strings.Contains(err.Error(), "has no '='") {
			return true
		}
		t.Errorf("%s: the C fast path passes a container on which the Go path fails (%v):\n%s", name, err, spec)
		return true
	}
	if req.Wants() {
		t.Errorf("%s: the C fast path passes a container that asks for devices %+v, CDI %q (source %s):\n%s", name, req.Devices, req.CDIDevices, req.Source, spec)
	}
	return true
}

// TestFastPathAgreement holds the C fast path's decision against
// request.Parse on every case of this package's tables and fuzz seeds,
// each under its own options and under the defaults, unprivileged and
// privileged.
func TestFastPathAgreement(t *testing.T) {
	fast, total := 0, 0
	for _, c := range request.AgreementCases() {
		for _, opts := range []request.Options{c.Opts, request.DefaultOptions()} {
			for _, priv := range []bool{c.In.Privileged, !c.In.Privileged} {
				in := c.In
				in.Privileged = priv
				total++
				if agree(t, c.Name, in, opts) {
					fast++
				}
			}
		}
	}
	// The test means something only if C says "no" somewhere and "maybe"
	// elsewhere.
	if fast == 0 || fast == total {
		t.Errorf("the C fast path took %d of %d cases", fast, total)
	}
	t.Logf("the C fast path took %d of %d cases", fast, total)
}

// FuzzFastPathAgreement is TestFastPathAgreement on FuzzParse's inputs,
// seeded with its seeds and the tables.
func FuzzFastPathAgreement(f *testing.F) {
	for _, s := range request.AgreementSeeds() {
		f.Add(s.Env, s.Annotations, s.Mounts, s.Privileged, s.Flags)
	}
	f.Fuzz(func(t *testing.T, env, annotations, mounts string, privileged bool, flags uint8) {
		in, opts := request.AgreementInput(request.FuzzArgs{Env: env, Annotations: annotations, Mounts: mounts, Privileged: privileged, Flags: flags})
		agree(t, "fuzz", in, opts)
	})
}
