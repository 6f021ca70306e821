package shim

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
)

// The JSON patchSpec writes, by hand: encoding/json's reflection costs more
// than the rest of the patch the first (and only) time a fresh
// gantry-runtime encodes a type. Each encoder writes what json.Marshal
// writes for the value (TestSpecJSONMatchesEncodingJSON), and gives way to
// json.Marshal for what the edits never produce.

// appendJSON appends v's JSON to b.
func appendJSON(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case []string:
		return appendStrings(b, v), nil
	case ocispecs.Mount:
		if len(v.UIDMappings) == 0 && len(v.GIDMappings) == 0 {
			return appendMount(b, v), nil
		}
	case ocispecs.LinuxDevice:
		return appendDevice(b, v), nil
	case ocispecs.LinuxDeviceCgroup:
		return appendRule(b, v), nil
	case map[string]string:
		return appendStringMap(b, v), nil
	case *object:
		return v.appendTo(b)
	case []json.RawMessage:
		return appendRawArray(b, v), nil
	case json.RawMessage:
		return append(b, v...), nil
	}
	out, err := json.Marshal(v)
	return append(b, out...), err
}

func appendMount(b []byte, m ocispecs.Mount) []byte {
	b = append(b, `{"destination":`...)
	b = appendString(b, m.Destination)
	if m.Type != "" {
		b = append(b, `,"type":`...)
		b = appendString(b, m.Type)
	}
	if m.Source != "" {
		b = append(b, `,"source":`...)
		b = appendString(b, m.Source)
	}
	if len(m.Options) > 0 {
		b = append(b, `,"options":`...)
		b = appendStrings(b, m.Options)
	}
	return append(b, '}')
}

func appendDevice(b []byte, d ocispecs.LinuxDevice) []byte {
	b = append(b, `{"path":`...)
	b = appendString(b, d.Path)
	b = append(b, `,"type":`...)
	b = appendString(b, d.Type)
	b = append(b, `,"major":`...)
	b = strconv.AppendInt(b, d.Major, 10)
	b = append(b, `,"minor":`...)
	b = strconv.AppendInt(b, d.Minor, 10)
	if d.FileMode != nil {
		b = append(b, `,"fileMode":`...)
		b = strconv.AppendUint(b, uint64(*d.FileMode), 10)
	}
	if d.UID != nil {
		b = append(b, `,"uid":`...)
		b = strconv.AppendUint(b, uint64(*d.UID), 10)
	}
	if d.GID != nil {
		b = append(b, `,"gid":`...)
		b = strconv.AppendUint(b, uint64(*d.GID), 10)
	}
	return append(b, '}')
}

func appendRule(b []byte, r ocispecs.LinuxDeviceCgroup) []byte {
	b = append(b, `{"allow":`...)
	b = strconv.AppendBool(b, r.Allow)
	if r.Type != "" {
		b = append(b, `,"type":`...)
		b = appendString(b, r.Type)
	}
	if r.Major != nil {
		b = append(b, `,"major":`...)
		b = strconv.AppendInt(b, *r.Major, 10)
	}
	if r.Minor != nil {
		b = append(b, `,"minor":`...)
		b = strconv.AppendInt(b, *r.Minor, 10)
	}
	if r.Access != "" {
		b = append(b, `,"access":`...)
		b = appendString(b, r.Access)
	}
	return append(b, '}')
}

func appendStrings(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

func appendStringMap(b []byte, m map[string]string) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	b = append(b, '{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, m[k])
	}
	return append(b, '}')
}

// appendRawArray writes elements that are JSON values already.
func appendRawArray(b []byte, elems []json.RawMessage) []byte {
	b = append(b, '[')
	for i, e := range elems {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, e...)
	}
	return append(b, ']')
}

const hex = "0123456789abcdef"

// appendString writes s as a JSON string the way encoding/json does:
// control characters, <, > and & as \u00XX (or their short escapes), invalid
// UTF-8 as U+FFFD, U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
