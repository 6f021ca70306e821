package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/inject"
)

// errNoPatch says that patchSpec cannot edit this config.json in place and
// the whole spec must be decoded (fullSpec).
var errNoPatch = errors.New("config.json needs the full round trip")

// patchSpec applies plan to config.json (top, decodeObject) without decoding the whole spec:
// only the fields the edits touch are decoded (process.env and
// process.user, mounts, linux.devices, linux.resources.devices,
// annotations), the plan is applied to them (Plan.ApplyToSpec, the same
// code as for a whole spec) and the fields that changed are written back;
// everything else, fields this build does not know included, stays as the
// engine wrote it, numbers digit for digit. Decoding the whole runtime-spec
// type tree cost ~0.6 ms of a create in a fresh process.
//
// It returns errNoPatch when the plan holds other vendors' CDI devices
// (the CDI library edits a whole spec: hooks, rlimits, ...) or when a field
// it edits is also spelled another way in the same object ("Env" beside
// "env": encoding/json matches names without regard to case, so which one
// a runtime reads is not for a map lookup to guess).
func patchSpec(top *object, plan *inject.Plan) ([]byte, error) {
	if len(plan.CDI) > 0 {
		return nil, errNoPatch
	}
	var err error
	var spec ocispecs.Spec
	var d patchDoc
	if d.proc, err = top.object("process"); err != nil {
		return nil, err
	}
	if d.proc != nil {
		spec.Process = &ocispecs.Process{}
		if err := d.proc.decode("env", &spec.Process.Env); err != nil {
			return nil, err
		}
		if err := d.proc.decode("user", &spec.Process.User); err != nil {
			return nil, err
		}
		d.env = slices.Clone(spec.Process.Env)
	}
	if d.mounts, spec.Mounts, err = decodeArray[ocispecs.Mount](top, "mounts"); err != nil {
		return nil, err
	}
	if d.linux, err = top.object("linux"); err != nil {
		return nil, err
	}
	if d.linux != nil {
		spec.Linux = &ocispecs.Linux{}
		if d.devices, spec.Linux.Devices, err = decodeArray[ocispecs.LinuxDevice](d.linux, "devices"); err != nil {
			return nil, err
		}
		if d.res, err = d.linux.object("resources"); err != nil {
			return nil, err
		}
		if d.res != nil {
			spec.Linux.Resources = &ocispecs.LinuxResources{}
			if d.rules, spec.Linux.Resources.Devices, err = decodeArray[ocispecs.LinuxDeviceCgroup](d.res, "devices"); err != nil {
				return nil, err
			}
		}
	}
	if err := top.decode("annotations", &spec.Annotations); err != nil {
		return nil, err
	}
	annotations := maps.Clone(spec.Annotations)
	// The typed slices are copies: ApplyToSpec replaces elements in place,
	// and the originals tell which ones it replaced.
	origMounts, origDevices := slices.Clone(spec.Mounts), []ocispecs.LinuxDevice(nil)
	var origRules []ocispecs.LinuxDeviceCgroup
	if spec.Linux != nil {
		origDevices = slices.Clone(spec.Linux.Devices)
		if spec.Linux.Resources != nil {
			origRules = slices.Clone(spec.Linux.Resources.Devices)
		}
	}

	if err := plan.ApplyToSpec(&spec); err != nil {
		return nil, err
	}

	if spec.Process != nil && (d.proc == nil || !slices.Equal(spec.Process.Env, d.env)) {
		if d.proc == nil {
			d.proc = &object{}
		}
		d.proc.set("env", spec.Process.Env)
		top.set("process", d.proc)
	}
	if m, changed, err := mergeArray(d.mounts, origMounts, spec.Mounts); err != nil {
		return nil, err
	} else if changed {
		top.set("mounts", m)
	}
	if spec.Linux != nil {
		linuxChanged := d.linux == nil
		if d.linux == nil {
			d.linux = &object{}
		}
		devs, changed, err := mergeArray(d.devices, origDevices, spec.Linux.Devices)
		if err != nil {
			return nil, err
		}
		if changed {
			d.linux.set("devices", devs)
			linuxChanged = true
		}
		if r := spec.Linux.Resources; r != nil {
			rules, changed, err := mergeArray(d.rules, origRules, r.Devices)
			if err != nil {
				return nil, err
			}
			if changed || d.res == nil {
				if d.res == nil {
					d.res = &object{}
				}
				d.res.set("devices", rules)
				d.linux.set("resources", d.res)
				linuxChanged = true
			}
		}
		if linuxChanged {
			top.set("linux", d.linux)
		}
	}
	if !maps.Equal(annotations, spec.Annotations) {
		top.set("annotations", spec.Annotations)
	}
	return top.appendTo(make([]byte, 0, 4096))
}

// patchDoc holds the raw JSON of the parts patchSpec may rewrite.
type patchDoc struct {
	proc, linux, res       *object
	env                    []string
	mounts, devices, rules []json.RawMessage
}

// object is one JSON object of config.json, its values left undecoded.
type object struct {
	m map[string]json.RawMessage
	// err is the first error of set, reported by patchSpec.
	err error
}

func decodeObject(raw []byte) (*object, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	return &object{m: m}, nil
}

// get returns the raw value of key (nil when absent or null), or
// errNoPatch when another key of o is the same name in other case.
func (o *object) get(key string) (json.RawMessage, error) {
	for k := range o.m {
		if k != key && strings.EqualFold(k, key) {
			return nil, errNoPatch
		}
	}
	v := o.m[key]
	if string(v) == "null" {
		return nil, nil
	}
	return v, nil
}

func (o *object) decode(key string, v any) error {
	raw, err := o.get(key)
	if err != nil || raw == nil {
		return err
	}
	return json.Unmarshal(raw, v)
}

// object returns the object under key, nil when absent or null.
func (o *object) object(key string) (*object, error) {
	raw, err := o.get(key)
	if err != nil || raw == nil {
		return nil, err
	}
	return decodeObject(raw)
}

func (o *object) set(key string, v any) {
	if o.m == nil {
		o.m = map[string]json.RawMessage{}
	}
	b, err := appendJSON(nil, v)
	if err != nil && o.err == nil {
		o.err = err
	}
	o.m[key] = b
}

// appendTo writes the object, its keys sorted (as json.Marshal writes a
// map) and its values as they are.
func (o *object) appendTo(b []byte) ([]byte, error) {
	if o.err != nil {
		return nil, o.err
	}
	keys := make([]string, 0, len(o.m))
	for k := range o.m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = append(b, o.m[k]...)
	}
	return append(b, '}'), nil
}

// decodeArray decodes the array under key both raw, element by element, and
// typed.
func decodeArray[T any](o *object, key string) ([]json.RawMessage, []T, error) {
	raw, err := o.get(key)
	if err != nil || raw == nil {
		return nil, nil, err
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, nil, err
	}
	// Typed in one call: a call per element cost more than the decoding.
	var typed []T
	if err := json.Unmarshal(raw, &typed); err != nil {
		return nil, nil, err
	}
	if len(typed) != len(elems) {
		return nil, nil, fmt.Errorf("%s: %d entries decoded as %d", key, len(elems), len(typed))
	}
	return elems, typed, nil
}

// mergeArray is the array after an edit: an element the edit left as it
// was keeps its original JSON (with any field this build does not know),
// a replaced or appended one is encoded. ApplyToSpec only replaces in place
// and appends. changed is false when nothing changed.
func mergeArray[T any](raw []json.RawMessage, orig, now []T) ([]json.RawMessage, bool, error) {
	if len(now) == len(orig) && reflect.DeepEqual(now, orig) {
		return raw, false, nil
	}
	out := make([]json.RawMessage, len(now))
	for i := range now {
		if i < len(orig) && reflect.DeepEqual(now[i], orig[i]) {
			out[i] = raw[i]
			continue
		}
		b, err := appendJSON(nil, now[i])
		if err != nil {
			return nil, false, err
		}
		out[i] = b
	}
	return out, true, nil
}
