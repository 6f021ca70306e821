package sim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// decodeStrict reads a description (YAML, or JSON, which is YAML) into h,
// refusing unknown and duplicate keys. It uses yaml.v3 straight into the
// yaml-tagged types: gantry-runtime links yaml.v3 anyway (the CDI
// library's), while sigs.k8s.io/yaml would add yaml.v2, whose package
// initialisation every container create paid. v3 keeps a bare scalar's
// text for a string field (computeCapability: 8.0 is "8.0") and reads
// YAML 1.1's yes/no/on/off into bool fields, as the older decoder did.
func decodeStrict(data []byte, h *Host) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(h)
	if err == nil || errors.Is(err, io.EOF) { // EOF: an empty description
		return nil
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return errors.New(strings.ReplaceAll(err.Error(), "\n", " "))
	}
	keys := keysByLine(data)
	msgs := make([]string, len(te.Errors))
	for i, e := range te.Errors {
		msgs[i] = typeErrorText(strings.TrimSpace(e), keys)
	}
	return errors.New(strings.Join(msgs, "; "))
}

var (
	unknownFieldRE = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^line ([0-9]+): field (.*) not found in type \S+$`)
	})
	lineRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^line ([0-9]+): (.*)$`) })
)

// typeErrorText words one of yaml.v3's type errors for a user: an unknown
// field as `line N: unknown key "colour"`, a value of the wrong type with the
// key it was given for (`line N: memoryMiB: cannot unmarshal ...`).
func typeErrorText(e string, keys map[int][]keyValue) string {
	if m := unknownFieldRE().FindStringSubmatch(e); m != nil {
		return fmt.Sprintf("line %s: unknown key %q", m[1], m[2])
	}
	m := lineRE().FindStringSubmatch(e)
	if m == nil || !strings.Contains(m[2], "cannot unmarshal") {
		return e
	}
	var line int
	fmt.Sscan(m[1], &line)
	// The value is quoted in backquotes: the key given it on that line.
	_, val, _ := strings.Cut(m[2], "`")
	val, _, _ = strings.Cut(val, "`")
	for _, kv := range keys[line] {
		if kv.value == val {
			return fmt.Sprintf("line %d: %s: %s", line, kv.key, m[2])
		}
	}
	return e
}

type keyValue struct{ key, value string }

// keysByLine maps each line of a YAML text to the mapping keys whose
// scalar values are on it, with those values.
func keysByLine(data []byte) map[int][]keyValue {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return nil
	}
	keys := map[int][]keyValue{}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				if v := n.Content[i+1]; v.Kind == yaml.ScalarNode {
					keys[v.Line] = append(keys[v.Line], keyValue{n.Content[i].Value, v.Value})
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(&root)
	return keys
}
