package shim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
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
	// process is decoded as an object only when its env changes.
	if d.procRaw, err = top.get("process"); err != nil {
		return nil, err
	}
	if d.procRaw != nil {
		var p struct {
			Env  []string      `json:"env"`
			User ocispecs.User `json:"user"`
		}
		if err := json.Unmarshal(d.procRaw, &p); err != nil {
			return nil, err
		}
		spec.Process = &ocispecs.Process{Env: p.Env, User: p.User}
		d.env = slices.Clone(p.Env)
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

	if spec.Process != nil && (d.procRaw == nil || !slices.Equal(spec.Process.Env, d.env)) {
		proc := &object{}
		if d.procRaw != nil {
			if proc, err = decodeObject(d.procRaw); err != nil {
				return nil, err
			}
			if _, err := proc.get("env"); err != nil {
				return nil, err
			}
		}
		proc.set("env", spec.Process.Env)
		top.set("process", proc)
	}
	if m, changed, err := mergeArray(d.mounts, origMounts, spec.Mounts, eqMount); err != nil {
		return nil, err
	} else if changed {
		top.set("mounts", m)
	}
	if spec.Linux != nil {
		linuxChanged := d.linux == nil
		if d.linux == nil {
			d.linux = &object{}
		}
		devs, changed, err := mergeArray(d.devices, origDevices, spec.Linux.Devices, eqDevice)
		if err != nil {
			return nil, err
		}
		if changed {
			d.linux.set("devices", devs)
			linuxChanged = true
		}
		if r := spec.Linux.Resources; r != nil {
			rules, changed, err := mergeArray(d.rules, origRules, r.Devices, eqRule)
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
	procRaw                json.RawMessage
	linux, res             *object
	env                    []string
	mounts, devices, rules json.RawMessage
}

// object is one JSON object of config.json, its values left undecoded.
type object struct {
	m map[string]json.RawMessage
	// dup says a name appears twice in the object: encoding/json (runc's
	// decoder) merges the two objects' fields or keeps the last array,
	// which a map of raw values cannot reproduce.
	dup bool
	// err is the first error of set, reported by patchSpec.
	err error
}

func decodeObject(raw []byte) (*object, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	return &object{m: m, dup: members(raw) != len(m)}, nil
}

// members counts the members of the JSON object raw (valid JSON: the
// commas at its first level, outside strings).
func members(raw []byte) int {
	depth, n, empty := 0, 0, true
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case '"':
			for i++; i < len(raw) && raw[i] != '"'; i++ {
				if raw[i] == '\\' {
					i++
				}
			}
			empty = false
		case '{', '[':
			depth++
			if depth > 1 {
				empty = false
			}
		case '}', ']':
			depth--
		case ',':
			if depth == 1 {
				n++
			}
		case ' ', '\t', '\n', '\r':
		default:
			empty = false
		}
	}
	if empty {
		return 0
	}
	return n + 1
}

// get returns the raw value of key (nil when absent or null), or
// errNoPatch when another key of o is the same name in other case or a
// name appears twice.
func (o *object) get(key string) (json.RawMessage, error) {
	if o.dup {
		return nil, errNoPatch
	}
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
	b = append(b, '{')
	for i, k := range slices.Sorted(maps.Keys(o.m)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = append(b, o.m[k]...)
	}
	return append(b, '}'), nil
}

// decodeArray returns the array under key as it is and typed.
func decodeArray[T any](o *object, key string) (json.RawMessage, []T, error) {
	raw, err := o.get(key)
	if err != nil || raw == nil {
		return nil, nil, err
	}
	var typed []T
	if err := json.Unmarshal(raw, &typed); err != nil {
		return nil, nil, err
	}
	return raw, typed, nil
}

// mergeArray is the array raw after an edit that turned orig into now
// (ApplyToSpec only replaces entries in place and appends): raw itself
// with the new entries added when none was replaced (the usual case), or
// entry by entry, those left as they were keeping their original JSON.
// Either way an entry the edit did not touch keeps fields this build does
// not know. changed is false when nothing changed.
func mergeArray[T any](raw json.RawMessage, orig, now []T, eq func(a, b *T) bool) (json.RawMessage, bool, error) {
	same := 0
	for same < len(orig) && same < len(now) && eq(&orig[same], &now[same]) {
		same++
	}
	if same == len(orig) && len(now) == len(orig) {
		return raw, false, nil
	}
	var err error
	if same == len(orig) {
		// Appended only: the original array, its closing bracket moved.
		b := append([]byte(nil), '[')
		if inner := bytes.TrimSpace(raw); len(inner) >= 2 {
			if inner = bytes.TrimSpace(inner[1 : len(inner)-1]); len(inner) > 0 {
				b = append(append(b, inner...), ',')
			}
		}
		for i, v := range now[len(orig):] {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendJSON(b, v); err != nil {
				return nil, false, err
			}
		}
		return append(b, ']'), true, nil
	}
	var elems []json.RawMessage
	if raw != nil {
		if err := json.Unmarshal(raw, &elems); err != nil {
			return nil, false, err
		}
	}
	if len(elems) != len(orig) {
		return nil, false, fmt.Errorf("%d entries decoded as %d", len(elems), len(orig))
	}
	b := append([]byte(nil), '[')
	for i := range now {
		if i > 0 {
			b = append(b, ',')
		}
		if i < len(orig) && eq(&orig[i], &now[i]) {
			b = append(b, elems[i]...)
			continue
		}
		if b, err = appendJSON(b, now[i]); err != nil {
			return nil, false, err
		}
	}
	return append(b, ']'), true, nil
}

// eqMount, eqDevice and eqRule compare every field
// (TestSpecJSONMatchesEncodingJSON counts them).
func eqMount(a, b *ocispecs.Mount) bool {
	return a.Destination == b.Destination && a.Type == b.Type && a.Source == b.Source &&
		slices.Equal(a.Options, b.Options) && slices.Equal(a.UIDMappings, b.UIDMappings) && slices.Equal(a.GIDMappings, b.GIDMappings)
}

func eqDevice(a, b *ocispecs.LinuxDevice) bool {
	return a.Path == b.Path && a.Type == b.Type && a.Major == b.Major && a.Minor == b.Minor &&
		eqPtr(a.FileMode, b.FileMode) && eqPtr(a.UID, b.UID) && eqPtr(a.GID, b.GID)
}

func eqRule(a, b *ocispecs.LinuxDeviceCgroup) bool {
	return a.Allow == b.Allow && a.Type == b.Type && eqPtr(a.Major, b.Major) && eqPtr(a.Minor, b.Minor) && a.Access == b.Access
}

func eqPtr[T comparable](a, b *T) bool {
	return a == b || (a != nil && b != nil && *a == *b)
}
