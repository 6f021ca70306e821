package inject

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

// fill sets every field reachable from v to a value of its own: strings
// name their path, numbers count up, bools are true, lists hold two
// elements, pointers point to a filled value. A field the codec forgets
// then comes back zero or different.
func fill(v reflect.Value, path string, n *int) {
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(path + "\x00é\n" + strings.Repeat("x", *n%200))
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(int64(*n) * -977)
	case reflect.Uint, reflect.Uint64, reflect.Uint32:
		v.SetUint(uint64(*n) << 33)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), path, n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := 0; i < 2; i++ {
			fill(v.Index(i), path+"["+string(rune('0'+i))+"]", n)
		}
	case reflect.Array:
		for i := 0; i < v.Len(); i++ {
			fill(v.Index(i), path+"["+string(rune('0'+i))+"]", n)
		}
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		for i := 0; i < 2; i++ {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fill(k, path+"{key}", n)
			fill(e, path+"{value}", n)
			v.SetMapIndex(k, e)
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), path+"."+v.Type().Field(i).Name, n)
			}
		}
	default:
		panic("fill: add " + v.Kind().String() + " (" + path + ") here and to cachecodec.go")
	}
}

// Every field of the cached types survives the cache: a field added to
// driver.Inventory, driver.File, gpu.System, gpu.Device, gpu.MIGDevice or
// gpu.NVLink (or the key) fails here until cachecodec.go writes it.
func TestCacheCodecEveryField(t *testing.T) {
	var c cacheFile
	n := 0
	fill(reflect.ValueOf(&c).Elem(), "c", &n)
	c.Key.Format = cacheFormat
	b := encodeCache(c)
	got, err := decodeCache(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*got, c) {
		t.Errorf("cache round trip lost data:\n got %+v\nwant %+v", *got, c)
	}
	// Nil and empty parts, as discovery gives them.
	for _, c := range []cacheFile{
		{Key: cacheKey{Format: cacheFormat}},
		{Key: cacheKey{Format: cacheFormat, DriverRoot: "/"}, Inventory: &driver.Inventory{Root: "/"}},
		{Key: cacheKey{Format: cacheFormat}, Inventory: &driver.Inventory{}, GPUs: &gpu.System{Devices: []gpu.Device{{}}}},
	} {
		got, err := decodeCache(encodeCache(c))
		if err != nil || !reflect.DeepEqual(*got, c) {
			t.Errorf("%+v: got %+v, %v", c, got, err)
		}
	}
}

// A cache file that is not a whole, current one is an error, never a panic,
// whatever its bytes: each truncation, each byte changed, trailing bytes,
// another format, an old JSON cache.
func TestDecodeCacheCorrupt(t *testing.T) {
	var c cacheFile
	n := 0
	fill(reflect.ValueOf(&c).Elem(), "c", &n)
	c.Key.Format = cacheFormat
	b := encodeCache(c)
	for i := 0; i < len(b); i++ {
		if _, err := decodeCache(b[:i]); err == nil {
			t.Fatalf("truncated to %d of %d bytes: no error", i, len(b))
		}
	}
	for i := 0; i < len(b); i++ {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			m := bytes.Clone(b)
			m[i] ^= x
			_, _ = decodeCache(m) // may decode (a changed string): must not panic
		}
	}
	if _, err := decodeCache(append(bytes.Clone(b), 0)); err == nil {
		t.Error("trailing byte: no error")
	}
	old := c
	old.Key.Format = cacheFormat - 1
	if _, err := decodeCache(encodeCache(old)); err == nil {
		t.Error("another format: no error")
	}
	if _, err := decodeCache([]byte(`{"key":{"format":1},"inventory":{}}`)); err == nil {
		t.Error("a JSON cache: no error")
	}
	// A count far beyond the file: refused before anything is allocated.
	huge := append([]byte(cacheMagic), encodeCache(cacheFile{Key: cacheKey{Format: cacheFormat}})[len(cacheMagic):]...)
	huge = append(huge[:len(huge)-2], 1, 0xff, 0xff, 0xff, 0xff, 0x0f)
	if _, err := decodeCache(huge); err == nil {
		t.Error("huge count: no error")
	}
}

func FuzzDecodeCache(f *testing.F) {
	var c cacheFile
	n := 0
	fill(reflect.ValueOf(&c).Elem(), "c", &n)
	c.Key.Format = cacheFormat
	f.Add(encodeCache(c))
	f.Add(encodeCache(cacheFile{Key: cacheKey{Format: cacheFormat}, Inventory: &driver.Inventory{}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCache(b)
		if err != nil {
			return
		}
		// What decodes encodes to a file that decodes the same.
		again, err := decodeCache(encodeCache(*c))
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Errorf("re-encoded cache: %v, %+v, want %+v", err, again, c)
		}
	})
}

// Every field of the driver tree's cache survives it, maps included.
func TestTreeCodecEveryField(t *testing.T) {
	var c treeCache
	n := 0
	fill(reflect.ValueOf(&c).Elem(), "c", &n)
	c.Format = treeFormat
	got, err := decodeTree(encodeTree(&c))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*got, c) {
		t.Errorf("tree cache round trip lost data:\n got %+v\nwant %+v", *got, c)
	}
	b := encodeTree(&c)
	for i := 0; i < len(b); i++ {
		if _, err := decodeTree(b[:i]); err == nil {
			t.Fatalf("truncated to %d of %d bytes: no error", i, len(b))
		}
		m := bytes.Clone(b)
		m[i] ^= 0x80
		_, _ = decodeTree(m) // must not panic
	}
	old := c
	old.Format = treeFormat - 1
	if _, err := decodeTree(encodeTree(&old)); err == nil {
		t.Error("another format: no error")
	}
	if _, err := decodeTree([]byte(`{"format":3}`)); err == nil {
		t.Error("a JSON tree cache: no error")
	}
}

func FuzzDecodeTree(f *testing.F) {
	var c treeCache
	n := 0
	fill(reflect.ValueOf(&c).Elem(), "c", &n)
	c.Format = treeFormat
	f.Add(encodeTree(&c))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeTree(b)
		if err != nil {
			return
		}
		again, err := decodeTree(encodeTree(c))
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Errorf("re-encoded tree cache: %v, %+v, want %+v", err, again, c)
		}
	})
}
