package cdispec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// jsonTree is the tree specTree stands in for: json.Marshal, then Decode
// with UseNumber.
func jsonTree(t *testing.T, s *specs.Spec) map[string]any {
	t.Helper()
	j, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// filler sets every field of a value by reflection, so that a field that a
// new specs-go adds is set too, and TestSpecTreeMatchesJSON then fails until
// specTree handles it.
type filler struct {
	empty bool // "" strings, empty slices and maps, pointers to zero values
	n     int
}

func (f *filler) fill(v reflect.Value) {
	f.n++
	switch v.Kind() {
	case reflect.String:
		if !f.empty {
			// Strings the YAML writer leaves to yaml.v2 on the way, too.
			v.SetString([]string{"a", "/dev/nvidia0", "yes", "x: y", "0", "é"}[f.n%6] + fmt.Sprint(f.n%3))
		}
	case reflect.Bool:
		v.SetBool(!f.empty)
	case reflect.Int, reflect.Int64:
		if !f.empty {
			v.SetInt(int64(f.n) * -7)
		}
	case reflect.Uint32:
		if !f.empty {
			v.SetUint(uint64(f.n) * 4096)
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		f.fill(v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			f.fill(v.Field(i))
		}
	case reflect.Slice:
		n := 3
		if f.empty {
			n = 0
		}
		v.Set(reflect.MakeSlice(v.Type(), n, n))
		for i := range n {
			if i == 1 && v.Type().Elem().Kind() == reflect.Pointer {
				continue // a nil element
			}
			f.fill(v.Index(i))
		}
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		if !f.empty {
			for i := range 2 {
				k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
				f.fill(k)
				f.fill(e)
				k.SetString(fmt.Sprintf("key%d.example.com/k", i))
				v.SetMapIndex(k, e)
			}
		}
	default:
		panic(fmt.Sprintf("filler: a %s field (a new specs-go?): teach specTree and this test about it", v.Type()))
	}
}

// specTree builds exactly the tree the JSON route gives, for every field of
// every spec type (filled, filled with empty values, zero, and the specs
// Generate writes), and the YAML of both routes is the same, and the
// library's.
func TestSpecTreeMatchesJSON(t *testing.T) {
	full, empty := &specs.Spec{}, &specs.Spec{}
	(&filler{}).fill(reflect.ValueOf(full).Elem())
	(&filler{empty: true}).fill(reflect.ValueOf(empty).Elem())
	generated, _ := generate(t, Options{})
	sys := eightGPUs()
	big, err := Generate(sys, testInventory(), Options{HookPath: hookPath, DevRoot: makeDevRoot(t, sys)})
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*specs.Spec{"every field": full, "every field empty": empty, "zero": {}, "2-GPU spec": generated, "8-GPU spec": big} {
		tree, ok := specTree(s)
		if !ok {
			t.Errorf("%s: specTree refused it", name)
			continue
		}
		if want := jsonTree(t, s); !reflect.DeepEqual(tree, want) {
			gj, _ := json.Marshal(tree)
			wj, _ := json.Marshal(want)
			t.Errorf("%s: specTree differs from the JSON route:\n%s\nwant\n%s", name, gj, wj)
		}
		got, err := marshalYAML(s)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		viaJSON, err := marshalYAML(*s) // not a *specs.Spec: the JSON route
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		lib, err := sigsyaml.Marshal(s)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got, viaJSON) || !bytes.Equal(got, lib) {
			t.Errorf("%s: YAML differs:\n%s\nJSON route\n%s\nsigs.k8s.io/yaml\n%s", name, got, viaJSON, lib)
		}
	}
	// json.Marshal replaces bytes that are not UTF-8: such a spec takes the
	// JSON route, and comes out as the library writes it.
	bad := *generated
	bad.Devices = append([]specs.Device{{Name: "x\xff", ContainerEdits: specs.ContainerEdits{Env: []string{"A=\xfe"}}}}, bad.Devices...)
	if _, ok := specTree(&bad); ok {
		t.Error("specTree took a string that is not UTF-8")
	}
	got, err := marshalYAML(&bad)
	if err != nil {
		t.Fatal(err)
	}
	if lib, _ := sigsyaml.Marshal(&bad); !bytes.Equal(got, lib) {
		t.Errorf("spec with bytes that are not UTF-8:\n%s\nwant\n%s", got, lib)
	}
}
