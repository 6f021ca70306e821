package engineconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// dockerDefinition is Docker: daemon.json.
var dockerDefinition = Definition{
	Name:        Docker,
	Title:       "Docker",
	DefaultPath: "/etc/docker/daemon.json",
	Writes:      `/etc/docker/daemon.json: "runtimes": {"nvidia": {"path": ...}}`,
	Program:     "dockerd",
	CheckHelp:   "dockerd --validate (Docker 23+; 20.10 has none, and Gantry reads the runtimes as dockerd does)",
	Restart:     "systemctl restart docker",
	Plan:        planned(planDocker),
	Parse:       parseDocker,
	Check: func(bin, path string, planned []byte, _ Options, _ []string) (string, error) {
		return checkDocker(bin, path, planned)
	},
}

// jsonMember is one key of a JSON object. Values read from the file are
// kept verbatim (value), so numbers, escapes, nested key order and even the
// user's line breaks survive a rewrite; objects we build or change are held
// as obj and encoded with the file's indentation.
type jsonMember struct {
	key   string
	value json.RawMessage
	obj   jsonObject
	isObj bool
}

// jsonObject is a JSON object in source order.
type jsonObject []jsonMember

func (o jsonObject) index(key string) int {
	for i, m := range o {
		if m.key == key {
			return i
		}
	}
	return -1
}

// set replaces the value of key in place, or appends key at the end. value
// must not contain newlines (it is written as is).
func (o jsonObject) set(key string, value json.RawMessage) jsonObject {
	return o.put(jsonMember{key: key, value: value})
}

// setObject is set for a nested object.
func (o jsonObject) setObject(key string, obj jsonObject) jsonObject {
	return o.put(jsonMember{key: key, obj: obj, isObj: true})
}

func (o jsonObject) put(m jsonMember) jsonObject {
	if i := o.index(m.key); i >= 0 {
		o[i] = m
		return o
	}
	return append(o, m)
}

// parseJSONObject decodes one JSON object keeping member order. where names
// the object in error messages ("the top level", "runtimes").
func parseJSONObject(data []byte, where string) (jsonObject, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("%w: %s must be a JSON object, found %s", ErrMalformed, where, describeJSON(data))
	}
	var obj jsonObject
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		// dockerd would silently take the last duplicate; editing one copy
		// and leaving the other would be worse than refusing.
		if seen[key] {
			return nil, fmt.Errorf("%w: key %q appears twice in %s: delete one of them", ErrMalformed, key, where)
		}
		seen[key] = true
		obj = append(obj, jsonMember{key: key, value: raw})
	}
	if _, err := dec.Token(); err != nil { // closing brace
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: unexpected data after the closing brace of %s: remove it", ErrMalformed, where)
	}
	return obj, nil
}

// describeJSON names the kind of a JSON value for error messages.
func describeJSON(raw []byte) string {
	s := bytes.TrimSpace(raw)
	if len(s) == 0 {
		return "nothing"
	}
	switch s[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}

// jsonString encodes s without the HTML escaping encoding/json does by
// default, so paths and names read naturally in daemon.json.
func jsonString(s string) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return bytes.TrimRight(b.Bytes(), "\n")
}

// encode writes o as indented JSON, its first line already positioned
// after prefix. Member order is kept as given; values read from the file are
// written byte for byte, which places them correctly because they sit at
// the same depth as before.
func (o jsonObject) encode(w *bytes.Buffer, prefix, indent string) {
	if len(o) == 0 {
		w.WriteString("{}")
		return
	}
	w.WriteString("{\n")
	for i, m := range o {
		w.WriteString(prefix + indent)
		w.Write(jsonString(m.key))
		w.WriteString(": ")
		if m.isObj {
			m.obj.encode(w, prefix+indent, indent)
		} else {
			w.Write(m.value)
		}
		if i < len(o)-1 {
			w.WriteByte(',')
		}
		w.WriteByte('\n')
	}
	w.WriteString(prefix + "}")
}

// detectJSONIndent returns the indentation unit of the first indented member
// line, so a file written with two spaces or tabs keeps its style.
func detectJSONIndent(data []byte) string {
	for _, line := range strings.Split(string(data), "\n")[1:] {
		trimmed := strings.TrimLeft(line, " \t")
		if len(trimmed) < len(line) && strings.HasPrefix(trimmed, `"`) {
			return line[:len(line)-len(trimmed)]
		}
	}
	return "    "
}

// jsonSyntaxError turns a decoding error into one naming line and column.
func jsonSyntaxError(data []byte, err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	var off int64 = -1
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &te):
		off = te.Offset
	}
	if off >= 0 {
		line, col := lineCol(data, int(off))
		return fmt.Errorf("%w: invalid JSON at line %d, column %d: %v: fix the syntax (check with `python3 -m json.tool FILE`) and run again", ErrMalformed, line, col, err)
	}
	return fmt.Errorf("%w: invalid JSON: %v: fix the syntax and run again", ErrMalformed, err)
}

// lineCol converts a byte offset into 1-based line and column.
func lineCol(data []byte, off int) (int, int) {
	if off > len(data) {
		off = len(data)
	}
	line := 1 + bytes.Count(data[:off], []byte("\n"))
	col := off - bytes.LastIndexByte(data[:off], '\n')
	return line, col
}

func planDocker(current []byte, opts Options, names []string) (result, error) {
	var top jsonObject
	if len(bytes.TrimSpace(current)) > 0 {
		// A full decode first: it reports syntax errors with an offset.
		var probe any
		if err := json.Unmarshal(current, &probe); err != nil {
			return result{}, jsonSyntaxError(current, err)
		}
		var err error
		if top, err = parseJSONObject(current, "the top level of daemon.json"); err != nil {
			return result{}, err
		}
	}

	var changes []string
	var runtimes jsonObject
	if i := top.index("runtimes"); i >= 0 && string(bytes.TrimSpace(top[i].value)) != "null" {
		var err error
		if runtimes, err = parseJSONObject(top[i].value, `"runtimes"`); err != nil {
			return result{}, err
		}
	}
	runtimesChanged := false
	for _, name := range names {
		i := runtimes.index(name)
		if i < 0 {
			// Only "path": Docker's field for arguments is "runtimeArgs";
			// NVIDIA's tool writes an empty "args" that dockerd ignores.
			entry := jsonObject{{key: "path", value: jsonString(opts.RuntimePath)}}
			what := "path " + opts.RuntimePath
			if opts.NVIDIAForm {
				// NVIDIA's form, under NVIDIA's command name.
				entry = append(entry, jsonMember{key: "args", value: json.RawMessage("[]")})
				what += ", args []"
			}
			runtimes = runtimes.setObject(name, entry)
			runtimesChanged = true
			changes = append(changes, fmt.Sprintf("add runtimes.%s (%s)", name, what))
			continue
		}
		var entry jsonObject
		if kind := describeJSON(runtimes[i].value); kind != "an object" {
			// Not an object: dockerd cannot load it either, so replace it.
			changes = append(changes, fmt.Sprintf("replace runtimes.%s (was %s, not an object) with path %s", name, kind, opts.RuntimePath))
		} else {
			var err error
			if entry, err = parseJSONObject(runtimes[i].value, "runtimes."+name); err != nil {
				return result{}, err
			}
			var old string
			if j := entry.index("path"); j >= 0 {
				if err := json.Unmarshal(entry[j].value, &old); err != nil || old != opts.RuntimePath {
					changes = append(changes, fmt.Sprintf("set runtimes.%s.path = %s (was %s)", name, opts.RuntimePath, entry[j].value))
				} else {
					continue
				}
			} else {
				changes = append(changes, fmt.Sprintf("set runtimes.%s.path = %s (was unset)", name, opts.RuntimePath))
			}
		}
		runtimes = runtimes.setObject(name, entry.set("path", jsonString(opts.RuntimePath)))
		runtimesChanged = true
	}
	if runtimesChanged {
		top = top.setObject("runtimes", runtimes)
	}

	if opts.SetAsDefault {
		var old string
		i := top.index("default-runtime")
		if i >= 0 {
			_ = json.Unmarshal(top[i].value, &old)
		}
		if i < 0 || old != opts.RuntimeName {
			was := "unset, Docker uses runc"
			if i >= 0 {
				was = string(top[i].value)
			}
			top = top.set("default-runtime", jsonString(opts.RuntimeName))
			changes = append(changes, fmt.Sprintf("set default-runtime = %s (was %s)", opts.RuntimeName, was))
		}
	}
	if opts.EnableCDI {
		var features jsonObject
		if i := top.index("features"); i >= 0 && string(bytes.TrimSpace(top[i].value)) != "null" {
			var err error
			if features, err = parseJSONObject(top[i].value, `"features"`); err != nil {
				return result{}, err
			}
		}
		var on bool
		j := features.index("cdi")
		if j >= 0 {
			_ = json.Unmarshal(features[j].value, &on)
		}
		if !on {
			was := "unset"
			if j >= 0 {
				was = string(features[j].value)
			}
			top = top.setObject("features", features.set("cdi", json.RawMessage("true")))
			changes = append(changes, fmt.Sprintf("set features.cdi = true (was %s)", was))
		}
	}
	if len(changes) == 0 {
		return result{}, nil
	}
	var out bytes.Buffer
	top.encode(&out, "", detectJSONIndent(current))
	out.WriteByte('\n')
	return result{updated: out.Bytes(), changes: changes}, nil
}
