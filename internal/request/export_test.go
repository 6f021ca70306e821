package request

import (
	"slices"
	"strings"
)

// For the fast path's agreement test (fastpath_agreement_test.go, package
// request_test, which can import the cgo fast path without a cycle).

// AgreementCase is one Parse input of this package's tests.
type AgreementCase struct {
	Name string
	In   Input
	Opts Options
}

// AgreementCases are the inputs of every table of this package's Parse
// tests (TestParse, TestParseErrors, TestFeaturesAndIMEX,
// TestKubernetesEnvAllocated) and FuzzParse's seeds.
func AgreementCases() []AgreementCase {
	var out []AgreementCase
	for _, c := range parseTable() {
		out = append(out, AgreementCase{"TestParse/" + c.name, c.in, c.opts})
	}
	for _, c := range parseErrorTable() {
		out = append(out, AgreementCase{"TestParseErrors/" + c.name, c.in, c.opts})
	}
	for _, c := range featureTable() {
		in, opts := c.input()
		out = append(out, AgreementCase{"TestFeaturesAndIMEX/" + c.name, in, opts})
	}
	kc, kopts := kubernetesTable()
	for _, c := range kc {
		out = append(out, AgreementCase{"TestKubernetesEnvAllocated/" + c.name, c.input(), kopts})
	}
	for i, s := range fuzzParseSeeds() {
		in, opts := fuzzInput(s.env, s.annotations, s.mounts, s.privileged, s.flags)
		out = append(out, AgreementCase{"FuzzParse/seed" + string(rune('0'+i)), in, opts})
	}
	return out
}

// FuzzArgs are FuzzParse's arguments.
type FuzzArgs struct {
	Env, Annotations, Mounts string
	Privileged               bool
	Flags                    uint8
}

// AgreementInput is fuzzInput: FuzzParse's arguments as Parse's.
func AgreementInput(a FuzzArgs) (Input, Options) {
	return fuzzInput(a.Env, a.Annotations, a.Mounts, a.Privileged, a.Flags)
}

// AgreementSeeds are FuzzParse's seeds, then every table case whose options
// FuzzParse's flag bits can express, as FuzzParse's arguments.
func AgreementSeeds() []FuzzArgs {
	var out []FuzzArgs
	for _, s := range fuzzParseSeeds() {
		out = append(out, FuzzArgs{s.env, s.annotations, s.mounts, s.privileged, s.flags})
	}
	for _, c := range AgreementCases() {
		var flags uint8
		o := c.Opts
		if !o.AcceptEnvWhenUnprivileged {
			flags |= 1
		}
		if o.AcceptVolumeMounts {
			flags |= 2
		}
		if o.LenientCapabilities {
			flags |= 4
		}
		if o.DisableRequire {
			flags |= 8
		}
		if len(o.SwarmResource) > 0 {
			flags |= 16
		}
		_, back := fuzzInput("", "", "", false, flags)
		if o.Allocated != nil || !slices.Equal(o.SwarmResource, back.SwarmResource) || !slices.Equal(o.AnnotationPrefixes, back.AnnotationPrefixes) || o.DefaultKind != back.DefaultKind {
			continue
		}
		var ann []string
		for k, v := range c.In.Annotations {
			ann = append(ann, k+"="+v)
		}
		slices.Sort(ann)
		out = append(out, FuzzArgs{strings.Join(c.In.Env, "\n"), strings.Join(ann, "\n"), strings.Join(c.In.MountDestinations, "\n"), c.In.Privileged, flags})
	}
	return out
}
