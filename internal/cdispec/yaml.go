package cdispec

import (
	"bytes"
	"encoding/json"
	"errors"
	"sort"
	"strconv"
	"strings"

	specs "tags.cncf.io/container-device-interface/specs-go"
)

// marshalYAML writes v as sigs.k8s.io/yaml.Marshal does (what the CDI
// library writes and reads), byte for byte, in a fraction of the time.
// That function encodes v as JSON, parses the JSON with the YAML parser to
// get typed values, and encodes those with yaml.v2. Here the JSON is
// decoded by encoding/json and written in yaml.v2's block style directly;
// a value outside the shapes a CDI spec has (a float, a key that is not
// plain letters, a multi-line string, a nested list, ...) is written by
// yaml.v2 itself, the whole document, with numbers typed the way the YAML
// parser types them. Each string that is not certainly a plain scalar is
// quoted by yaml.v2 (alone, when it has no blank that a line could break at). TestMarshalYAMLMatchesLibrary and FuzzMarshalYAML hold
// the result against the library's.
//
// A *specs.Spec skips the JSON step: its tree is built directly (specTree).
func marshalYAML(v any) ([]byte, error) {
	if spec, ok := v.(*specs.Spec); ok && spec != nil {
		if m, ok := specTree(spec); ok {
			w := yamlWriter{b: make([]byte, 0, 32<<10)}
			if err := w.mapping(m, 0, false); err == nil {
				return w.b, nil
			} else if !errors.Is(err, errYAMLFallback) {
				return nil, err
			}
		}
	}
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	var obj any
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	if m, ok := obj.(map[string]any); ok {
		w := yamlWriter{b: make([]byte, 0, 2*len(j))}
		if err := w.mapping(m, 0, false); err == nil {
			return w.b, nil
		} else if !errors.Is(err, errYAMLFallback) {
			return nil, err
		}
	}
	return yamlV2(yamlTyped(obj))
}

// ErrFullYAML is the lean build's answer for a spec that needs yaml.v2
// (see yamlv2_lean.go): the caller hands the work to the gantry binary.
var ErrFullYAML = errors.New("this spec needs the YAML encoder of the gantry binary")

// errYAMLFallback: a value yamlWriter leaves to yaml.v2.
var errYAMLFallback = errors.New("left to yaml.v2")

// yamlWriter writes yaml.v2's block style (two-space indent, sequences
// in a mapping at the key's indent, keys sorted).
type yamlWriter struct{ b []byte }

func (w *yamlWriter) indent(n int) {
	for range n {
		w.b = append(w.b, ' ')
	}
}

// mapping writes m with its keys at column ind; inline: the first key
// goes on the current line (after "- ").
func (w *yamlWriter) mapping(m map[string]any, ind int, inline bool) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		if !letters(k) || !plainSafe(k) {
			return errYAMLFallback
		}
		keys = append(keys, k)
	}
	// For keys of ASCII letters only, yaml.v2's key order is byte order.
	sort.Strings(keys)
	for i, k := range keys {
		if i > 0 || !inline {
			w.indent(ind)
		}
		w.b = append(w.b, k...)
		w.b = append(w.b, ':')
		switch x := m[k].(type) {
		case map[string]any:
			if len(x) == 0 {
				w.b = append(w.b, " {}\n"...)
				continue
			}
			w.b = append(w.b, '\n')
			if err := w.mapping(x, ind+2, false); err != nil {
				return err
			}
		case []any:
			if len(x) == 0 {
				w.b = append(w.b, " []\n"...)
				continue
			}
			w.b = append(w.b, '\n')
			if err := w.sequence(x, ind); err != nil {
				return err
			}
		default:
			w.b = append(w.b, ' ')
			if err := w.scalar(x); err != nil {
				return err
			}
		}
	}
	return nil
}

// sequence writes s with its dashes at column ind.
func (w *yamlWriter) sequence(s []any, ind int) error {
	for _, e := range s {
		w.indent(ind)
		w.b = append(w.b, "- "...)
		switch x := e.(type) {
		case map[string]any:
			if len(x) == 0 {
				return errYAMLFallback
			}
			if err := w.mapping(x, ind+2, true); err != nil {
				return err
			}
		case []any:
			return errYAMLFallback
		default:
			if err := w.scalar(x); err != nil {
				return err
			}
		}
	}
	return nil
}

// scalar writes v and a newline.
func (w *yamlWriter) scalar(v any) error {
	switch x := v.(type) {
	case nil:
		w.b = append(w.b, "null"...)
	case bool:
		w.b = strconv.AppendBool(w.b, x)
	case json.Number:
		if _, err := strconv.ParseInt(string(x), 10, 64); err != nil {
			return errYAMLFallback // floats and huge numbers
		}
		w.b = append(w.b, x...)
	case string:
		if plainSafe(x) || plainToo(x) {
			w.b = append(w.b, x...)
			break
		}
		if numberLike(x) {
			// yaml.v2 resolves these to numbers, so it double-quotes them:
			// device names "0", MIG names "0:1".
			w.b = append(append(append(w.b, '"'), x...), '"', '\n')
			return nil
		}
		if strings.ContainsAny(x, " \t\n\r\u0085\u2028\u2029") || len(x) > 64 {
			// Literal style, or quoted with breaks that depend on the
			// column the scalar starts at.
			return errYAMLFallback
		}
		q, err := yamlV2(x)
		if err != nil || bytes.Count(q, []byte("\n")) != 1 {
			return errYAMLFallback
		}
		w.b = append(w.b, q[:len(q)-1]...)
	default:
		return errYAMLFallback
	}
	w.b = append(w.b, '\n')
	return nil
}

// letters reports whether k is non-empty and all ASCII letters.
func letters(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i] | 0x20; c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// plainSafe reports whether yaml.v2 certainly writes s as a plain scalar:
// it starts with a letter, '/' or '_', holds only letters, digits and
// "/_.=+:-", does not end in ':', and is not one of YAML 1.1's boolean or
// null words (all that yaml.v2 resolves to a non-string when it starts
// with a letter).
func plainSafe(s string) bool {
	if s == "" || s[len(s)-1] == ':' {
		return false
	}
	if c := s[0]; !(c|0x20 >= 'a' && c|0x20 <= 'z') && c != '/' && c != '_' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c|0x20 >= 'a' && c|0x20 <= 'z') && !(c >= '0' && c <= '9') && !strings.ContainsRune("/_.=+:-", rune(c)) {
			return false
		}
	}
	switch strings.ToLower(s) {
	case "y", "yes", "n", "no", "true", "false", "on", "off", "null":
		return false
	}
	return true
}

// plainToo reports the other strings of a CDI spec that yaml.v2 writes
// as plain scalars: hook flags ("--link": a '-' not followed by a blank is
// no indicator, and no number parses from it) and dotted versions of three
// or more parts ("580.159.04": neither an integer, nor a float, nor a
// base-60 number to yaml.v2's resolver).
func plainToo(s string) bool {
	switch {
	case len(s) > 2 && s[0] == '-' && s[1] == '-' && s[2]|0x20 >= 'a' && s[2]|0x20 <= 'z':
		for i := 3; i < len(s); i++ {
			c := s[i]
			if !(c|0x20 >= 'a' && c|0x20 <= 'z') && !(c >= '0' && c <= '9') && !strings.ContainsRune("/_.=+-", rune(c)) {
				return false
			}
		}
		return true
	case s != "" && s[0] >= '0' && s[0] <= '9':
		parts := strings.Split(s, ".")
		if len(parts) < 3 {
			return false
		}
		for _, p := range parts {
			if !digits(p) {
				return false
			}
		}
		return true
	}
	return false
}

// numberLike reports the strings yaml.v2 double-quotes because, plain,
// they would be numbers: decimal digits (an integer, or a float when too
// big), and digit groups joined by ':' whose later groups are below 60 (a
// base-60 number to YAML 1.1), at most 64 bytes.
func numberLike(s string) bool {
	if len(s) > 64 {
		return false
	}
	groups := strings.Split(s, ":")
	for i, g := range groups {
		if !digits(g) || (i > 0 && (len(g) > 2 || (len(g) == 2 && g[0] > '5'))) {
			return false
		}
	}
	return true
}

// digits reports whether s is one or more ASCII decimal digits.
func digits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// yamlTyped replaces the json.Numbers in v by the Go values yaml.v2's
// resolver gives the same plain scalars.
func yamlTyped(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = yamlTyped(e)
		}
	case []any:
		for i, e := range x {
			x[i] = yamlTyped(e)
		}
	case json.Number:
		s := string(x)
		if i, err := strconv.ParseInt(s, 0, 64); err == nil {
			if i == int64(int(i)) {
				return int(i)
			}
			return i
		}
		if u, err := strconv.ParseUint(s, 0, 64); err == nil {
			return u
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return f
		}
		return s
	}
	return v
}
