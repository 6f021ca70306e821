package deviceplugin

import (
	"reflect"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// unknownKeys lists the keys of a configuration file (YAML or JSON) that
// Config has no field for, as dotted paths ("flags.migStrategee",
// "imex.channels"), sorted. NVIDIA's plugin ignores keys it does not know,
// so a file written for a newer NVIDIA release still starts it; Gantry does
// the same but says which keys it ignored (ParseConfig's warnings), where a
// strict parse would stop at the first one and take the node's GPUs away.
func unknownKeys(data []byte) ([]string, error) {
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	var out []string
	walkKeys(doc, reflect.TypeOf(Config{}), "", &out)
	sort.Strings(out)
	return out, nil
}

// unmarshalerType is the type of values that read themselves
// (StrategyList, ReplicatedDevices): their content is not walked.
var unmarshalerType = reflect.TypeOf((*interface{ UnmarshalJSON([]byte) error })(nil)).Elem()

func walkKeys(v any, t reflect.Type, prefix string, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return
		}
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" || name == "" {
				continue
			}
			fields[name] = f.Type
		}
		for k, sub := range m {
			ft, ok := fields[k]
			if !ok {
				*out = append(*out, prefix+k)
				continue
			}
			walkKeys(sub, ft, prefix+k+".", out)
		}
	case reflect.Slice:
		items, ok := v.([]any)
		if !ok {
			return
		}
		p := strings.TrimSuffix(prefix, ".")
		for i, it := range items {
			walkKeys(it, t.Elem(), p+"["+strconv.Itoa(i)+"].", out)
		}
	}
}
