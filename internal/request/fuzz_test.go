package request

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/driver"
)

// FuzzParse feeds arbitrary env, annotation and mount text to Parse: it
// must never panic, must fail only with ErrInvalid or ErrNotPrivileged, and
// what it returns must keep the Request invariants.
// fuzzSeed is one seed of FuzzParse (and of the fast path's agreement
// fuzz target, which reads them through fuzzInput).
type fuzzSeed struct {
	env, annotations, mounts string
	privileged               bool
	flags                    uint8
}

func fuzzParseSeeds() []fuzzSeed {
	return []fuzzSeed{
		{strings.Join(cuda124Env(), "\n"), "cdi.k8s.io/a=nvidia.com/gpu=0", "/var/run/nvidia-container-devices/0", true, 0},
		{"CUDA_VERSION=9.0.176", "", "", false, 1},
		{"NVIDIA_VISIBLE_DEVICES=0,,1:0,GPU-x,all\nNVIDIA_DRIVER_CAPABILITIES=all,video", "", "", false, 2},
		{"NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0\nNVIDIA_MIG_CONFIG_DEVICES=all\nNVIDIA_REQUIRE_X=arch>=8.0", "", "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/1", true, 3},
	}
}

// fuzzInput turns FuzzParse's arguments into Parse's: env and mounts one
// per line, annotations KEY=VALUE per line, flags the option bits.
func fuzzInput(env, annotations, mounts string, privileged bool, flags uint8) (Input, Options) {
	in := Input{Privileged: privileged, Annotations: map[string]string{}}
	if env != "" {
		in.Env = strings.Split(env, "\n")
	}
	for _, line := range strings.Split(annotations, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			in.Annotations[k] = v
		}
	}
	if mounts != "" {
		in.MountDestinations = strings.Split(mounts, "\n")
	}
	opts := DefaultOptions()
	opts.AcceptEnvWhenUnprivileged = flags&1 == 0
	opts.AcceptVolumeMounts = flags&2 != 0
	opts.LenientCapabilities = flags&4 != 0
	opts.DisableRequire = flags&8 != 0
	if flags&16 != 0 {
		opts.SwarmResource = []string{"DOCKER_RESOURCE_GPU"}
	}
	return in, opts
}

func FuzzParse(f *testing.F) {
	for _, s := range fuzzParseSeeds() {
		f.Add(s.env, s.annotations, s.mounts, s.privileged, s.flags)
	}
	f.Fuzz(func(t *testing.T, env, annotations, mounts string, privileged bool, flags uint8) {
		in, opts := fuzzInput(env, annotations, mounts, privileged, flags)
		req, err := Parse(in, opts)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrNotPrivileged) {
				t.Fatalf("error without a sentinel: %v", err)
			}
			if req != nil {
				t.Fatalf("request with an error: %+v", req)
			}
			return
		}
		if req.Devices.Mode == List && len(req.Devices.IDs) == 0 || req.Devices.Mode != List && req.Devices.IDs != nil {
			t.Fatalf("devices = %+v", req.Devices)
		}
		for _, id := range req.Devices.IDs {
			if !IsDeviceID(id) {
				t.Fatalf("invalid ID %q kept", id)
			}
		}
		if len(slices.Compact(slices.Clone(req.Devices.IDs))) != len(req.Devices.IDs) {
			t.Fatalf("duplicate IDs %q", req.Devices.IDs)
		}
		if !req.Wants() && (req.Source != SourceNone || req.Capabilities != nil || req.Requirements != nil) {
			t.Fatalf("void request carries data: %+v", req)
		}
		// Capabilities are strictly in AllCapabilities order.
		last := -1
		for _, c := range req.Capabilities {
			i := slices.Index(driver.AllCapabilities, c)
			if i <= last {
				t.Fatalf("capabilities out of order: %v", req.Capabilities)
			}
			last = i
		}
		if req.Wants() && len(req.Capabilities) == 0 {
			t.Fatal("no capabilities")
		}
		for _, r := range req.Requirements {
			if r.Alternatives == nil {
				t.Fatalf("%s unparsed", r.Var)
			}
			err := Check([]Requirement{r}, host550, []GPU{h100})
			if err != nil && !errors.Is(err, ErrUnsatisfied) {
				t.Fatalf("parsed requirement %q fails to evaluate: %v", r.Expr, err)
			}
		}
	})
}

// FuzzRequirement checks that a parsed expression always evaluates, that
// its canonical form parses to the same thing, and that evaluation agrees
// with a straightforward model of the OR-of-ANDs rule.
func FuzzRequirement(f *testing.F) {
	for _, s := range []string{requireCUDA118, requireCUDA122, requireCUDA124, "cuda>=12.4", "arch>=8.0,brand!=geforce", "driver<4 70", "  ,, ", "cuda==1", "x>=1"} {
		f.Add(s, "12.4", "550.54.15", "9.0", "nvidia")
	}
	f.Fuzz(func(t *testing.T, expr, cuda, drv, arch, brand string) {
		r, err := ParseRequirement("NVIDIA_REQUIRE_F", expr)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error without ErrInvalid: %v", err)
			}
			return
		}
		var terms []string
		for _, alt := range r.Alternatives {
			var cs []string
			for _, c := range alt {
				cs = append(cs, c.String())
			}
			terms = append(terms, strings.Join(cs, ","))
		}
		again, err := ParseRequirement("NVIDIA_REQUIRE_F", strings.Join(terms, " "))
		if err != nil || len(again.Alternatives) != len(r.Alternatives) {
			t.Fatalf("canonical form %q: %v", strings.Join(terms, " "), err)
		}

		host := Host{CUDA: cuda, Driver: drv}
		gpu := GPU{ID: "0", Arch: arch, Brand: brand}
		err = Check([]Requirement{r}, host, []GPU{gpu})
		want, modelErr := model(r, host, gpu)
		switch {
		case errors.Is(modelErr, errOverflow):
			// Beyond the model's uint64; the package compares any length.
		case modelErr != nil:
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Check(%q, %+v, %+v) = %v, model says a value cannot be compared", expr, host, gpu, err)
			}
		case want && err != nil:
			t.Fatalf("Check(%q) = %v, model says it holds", expr, err)
		case !want && !errors.Is(err, ErrUnsatisfied):
			t.Fatalf("Check(%q) = %v, model says it fails", expr, err)
		}
	})
}

var errOverflow = errors.New("overflow")

// model evaluates r independently of the package's evaluator: versions as
// integer slices padded with zeros.
func model(r Requirement, host Host, gpu GPU) (bool, error) {
	if len(r.Alternatives) == 0 {
		return true, nil
	}
	for _, alt := range r.Alternatives {
		all := true
	constraints:
		for _, c := range alt {
			var have string
			switch c.Key {
			case KeyCUDA:
				have = host.CUDA
			case KeyDriver:
				have = host.Driver
			case KeyArch:
				have = gpu.Arch
			case KeyBrand:
				if gpu.Brand != "" && strings.EqualFold(gpu.Brand, c.Value) != (c.Op == OpEqual) {
					all = false
				}
				if !all {
					break constraints
				}
				continue
			}
			if have == "" {
				continue
			}
			cmp, err := modelCompare(have, c.Value)
			if err != nil {
				return false, err
			}
			ok := map[Op]bool{OpEqual: cmp == 0, OpNotEqual: cmp != 0, OpLess: cmp < 0, OpLessEqual: cmp <= 0, OpGreater: cmp > 0, OpGreaterEqual: cmp >= 0}[c.Op]
			if !ok {
				all = false
				break
			}
		}
		if all {
			return true, nil
		}
	}
	return false, nil
}

func modelCompare(a, b string) (int, error) {
	parse := func(s string) ([]uint64, error) {
		if s == "" || s[0] == '.' {
			return nil, errors.New("bad")
		}
		var out []uint64
		for _, p := range strings.FieldsFunc(s, func(r rune) bool { return r == '.' }) {
			if strings.Trim(p, "0123456789") != "" {
				return nil, errors.New("bad")
			}
			n, err := strconv.ParseUint(p, 10, 64)
			if err != nil {
				return nil, errOverflow
			}
			out = append(out, n)
		}
		return out, nil
	}
	x, err := parse(a)
	if err != nil {
		return 0, err
	}
	y, err := parse(b)
	if err != nil {
		return 0, err
	}
	for len(x) < len(y) {
		x = append(x, 0)
	}
	for len(y) < len(x) {
		y = append(y, 0)
	}
	for i := range x {
		if x[i] != y[i] {
			if x[i] < y[i] {
				return -1, nil
			}
			return 1, nil
		}
	}
	return 0, nil
}
