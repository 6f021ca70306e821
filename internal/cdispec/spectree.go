package cdispec

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"

	specs "tags.cncf.io/container-device-interface/specs-go"
)

// specTree is what decoding json.Marshal(spec) with UseNumber gives (maps,
// []any, strings, json.Numbers, bools and nils, the fields named and left
// out as their json tags say), built without encoding/json: marshalYAML
// writes a spec from it. Reflection over the spec types costs a fresh
// process, such as one cdi generate, most of a millisecond.
//
// ok is false for a spec this cannot give exactly the JSON route's tree
// for: a string that is not valid UTF-8 (json.Marshal replaces its bad
// bytes). TestSpecTreeMatchesJSON fills every field of every spec type by
// reflection, so a field that a new specs-go adds fails it until it is
// handled here.
func specTree(s *specs.Spec) (tree map[string]any, ok bool) {
	t := specTreeBuilder{ok: true}
	m := map[string]any{
		"cdiVersion":     t.str(s.Version),
		"kind":           t.str(s.Kind),
		"devices":        nil,
		"containerEdits": t.edits(&s.ContainerEdits),
	}
	if len(s.Annotations) > 0 {
		m["annotations"] = t.strMap(s.Annotations)
	}
	if s.Devices != nil {
		devs := make([]any, len(s.Devices))
		for i := range s.Devices {
			d := &s.Devices[i]
			dm := map[string]any{"name": t.str(d.Name), "containerEdits": t.edits(&d.ContainerEdits)}
			if len(d.Annotations) > 0 {
				dm["annotations"] = t.strMap(d.Annotations)
			}
			devs[i] = dm
		}
		m["devices"] = devs
	}
	return m, t.ok
}

type specTreeBuilder struct{ ok bool }

func (t *specTreeBuilder) str(s string) string {
	if !utf8.ValidString(s) {
		t.ok = false
	}
	return s
}

func (t *specTreeBuilder) strs(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = t.str(s)
	}
	return out
}

func (t *specTreeBuilder) strMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[t.str(k)] = t.str(v)
	}
	return out
}

func number[T ~int | ~int64 | ~uint32](v T) json.Number {
	if v < 0 {
		return json.Number(strconv.FormatInt(int64(v), 10))
	}
	return json.Number(strconv.FormatUint(uint64(v), 10))
}

// setStr sets m[k] to s unless s is empty (omitempty).
func (t *specTreeBuilder) setStr(m map[string]any, k, s string) {
	if s != "" {
		m[k] = t.str(s)
	}
}

func (t *specTreeBuilder) setStrs(m map[string]any, k string, ss []string) {
	if len(ss) > 0 {
		m[k] = t.strs(ss)
	}
}

func (t *specTreeBuilder) edits(e *specs.ContainerEdits) map[string]any {
	m := map[string]any{}
	t.setStrs(m, "env", e.Env)
	if len(e.DeviceNodes) > 0 {
		l := make([]any, len(e.DeviceNodes))
		for i, d := range e.DeviceNodes {
			if d == nil {
				continue
			}
			dm := map[string]any{"path": t.str(d.Path)}
			t.setStr(dm, "hostPath", d.HostPath)
			t.setStr(dm, "type", d.Type)
			if d.Major != 0 {
				dm["major"] = number(d.Major)
			}
			if d.Minor != 0 {
				dm["minor"] = number(d.Minor)
			}
			if d.FileMode != nil {
				dm["fileMode"] = number(uint32(*d.FileMode))
			}
			t.setStr(dm, "permissions", d.Permissions)
			if d.UID != nil {
				dm["uid"] = number(*d.UID)
			}
			if d.GID != nil {
				dm["gid"] = number(*d.GID)
			}
			l[i] = dm
		}
		m["deviceNodes"] = l
	}
	if len(e.NetDevices) > 0 {
		l := make([]any, len(e.NetDevices))
		for i, d := range e.NetDevices {
			if d != nil {
				l[i] = map[string]any{"hostInterfaceName": t.str(d.HostInterfaceName), "name": t.str(d.Name)}
			}
		}
		m["netDevices"] = l
	}
	if len(e.Hooks) > 0 {
		l := make([]any, len(e.Hooks))
		for i, h := range e.Hooks {
			if h == nil {
				continue
			}
			hm := map[string]any{"hookName": t.str(h.HookName), "path": t.str(h.Path)}
			t.setStrs(hm, "args", h.Args)
			t.setStrs(hm, "env", h.Env)
			if h.Timeout != nil {
				hm["timeout"] = number(*h.Timeout)
			}
			l[i] = hm
		}
		m["hooks"] = l
	}
	if len(e.Mounts) > 0 {
		l := make([]any, len(e.Mounts))
		for i, mt := range e.Mounts {
			if mt == nil {
				continue
			}
			mm := map[string]any{"hostPath": t.str(mt.HostPath), "containerPath": t.str(mt.ContainerPath)}
			t.setStrs(mm, "options", mt.Options)
			t.setStr(mm, "type", mt.Type)
			l[i] = mm
		}
		m["mounts"] = l
	}
	if r := e.IntelRdt; r != nil {
		rm := map[string]any{}
		t.setStr(rm, "closID", r.ClosID)
		t.setStr(rm, "l3CacheSchema", r.L3CacheSchema)
		t.setStr(rm, "memBwSchema", r.MemBwSchema)
		t.setStrs(rm, "schemata", r.Schemata)
		if r.EnableMonitoring {
			rm["enableMonitoring"] = true
		}
		m["intelRdt"] = rm
	}
	if len(e.AdditionalGIDs) > 0 {
		l := make([]any, len(e.AdditionalGIDs))
		for i, g := range e.AdditionalGIDs {
			l[i] = number(g)
		}
		m["additionalGids"] = l
	}
	return m
}
