package shim

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
)

// The hand-written encoders write exactly json.Marshal's bytes, for every
// field of the types they know; a runtime-spec version that adds a field
// to one of them fails here until the encoder writes it.
func TestSpecJSONMatchesEncodingJSON(t *testing.T) {
	for typ, fields := range map[reflect.Type]int{
		reflect.TypeOf(ocispecs.Mount{}):             6,
		reflect.TypeOf(ocispecs.LinuxDevice{}):       7,
		reflect.TypeOf(ocispecs.LinuxDeviceCgroup{}): 5,
	} {
		if typ.NumField() != fields {
			t.Errorf("%s has %d fields, the encoder in specjson.go and the comparison in specpatch.go (eqMount, eqDevice, eqRule) know %d: teach them the new ones", typ, typ.NumField(), fields)
		}
	}
	odd := []string{"", "plain", `q"uote\back`, "<tag>&amp;", "ctl\x00\x01\x1f\b\f\n\r\t", "bad\xffutf8\xc3", "sep\u2028\u2029", "ünï©ødé 😀", "\x7f"}
	mode := os.FileMode(0o666)
	uid, gid := uint32(1000), uint32(0)
	major, minor := int64(195), int64(-1)
	values := []any{
		odd, []string(nil), []string{},
		map[string]string{"b": "1", "a": "<x>", "\x01k": "\xff"}, map[string]string(nil), map[string]string{},
		ocispecs.Mount{Destination: "/d"},
		ocispecs.Mount{Destination: "/d", Type: "bind", Source: "/s", Options: []string{"ro", "rbind"}},
		ocispecs.Mount{Destination: "/d", Options: []string{}},
		ocispecs.Mount{Destination: "/d", UIDMappings: []ocispecs.LinuxIDMapping{{ContainerID: 0, HostID: 1000, Size: 1}}},
		ocispecs.LinuxDevice{Path: "/dev/nvidia0", Type: "c", Major: 195},
		ocispecs.LinuxDevice{Path: "/dev/x", Type: "b", Major: -1, Minor: 1 << 40, FileMode: &mode, UID: &uid, GID: &gid},
		ocispecs.LinuxDeviceCgroup{},
		ocispecs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Minor: &minor, Access: "rwm"},
		[]json.RawMessage{json.RawMessage(`{"a":1}`), json.RawMessage(`2`)},
	}
	for _, s := range odd {
		values = append(values, ocispecs.Mount{Destination: s, Type: s, Source: s, Options: []string{s}},
			ocispecs.LinuxDevice{Path: s, Type: s}, ocispecs.LinuxDeviceCgroup{Type: s, Access: s})
	}
	for _, v := range values {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendJSON(nil, v)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%#v:\n got %s\nwant %s", v, got, want)
		}
	}
}
