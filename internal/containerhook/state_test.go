package containerhook

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadState(t *testing.T) {
	b := t.TempDir()
	writeFile(t, filepath.Join(b, "config.json"), `{"ociVersion":"1.0.2","root":{"path":"rootfs","readonly":true}}`)
	state := `{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":42,"bundle":"` + b + `","annotations":{"a":"b"}}`
	bundleDir, root, err := ReadState(strings.NewReader(state))
	if err != nil || bundleDir != b || root != filepath.Join(b, "rootfs") {
		t.Fatalf("ReadState = %q, %q, %v", bundleDir, root, err)
	}
	abs := t.TempDir()
	writeFile(t, filepath.Join(b, "config.json"), `{"root":{"path":"`+abs+`/"}}`)
	if _, root, err := ReadState(strings.NewReader(state)); err != nil || root != abs {
		t.Errorf("absolute root.path: %q, %v", root, err)
	}

	noRoot := t.TempDir()
	writeFile(t, filepath.Join(noRoot, "config.json"), `{"ociVersion":"1.0.2"}`)
	badCfg := t.TempDir()
	writeFile(t, filepath.Join(badCfg, "config.json"), `{"root":`)
	for _, tc := range []struct{ in, want string }{
		{"", "no container state"},
		{"  \n", "no container state"},
		{"{", "parsing the container state"},
		{`{"id":"c1"}`, "no bundle"},
		{`{"bundle":"rel/dir"}`, "relative bundle"},
		{`{"bundle":"/nonexistent-bundle"}`, "/nonexistent-bundle/config.json"},
		{`{"bundle":"` + noRoot + `"}`, "no root.path"},
		{`{"bundle":"` + badCfg + `"}`, "parsing the bundle's " + badCfg + "/config.json"},
	} {
		_, _, err := ReadState(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadState(%q) = %v; want an error containing %q", tc.in, err, tc.want)
		}
	}
	if _, _, err := ReadState(strings.NewReader("")); !errors.Is(err, ErrNoState) {
		t.Errorf("empty stdin: %v, want ErrNoState", err)
	}
}

func TestParseLink(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Link
		ok   bool
	}{
		{"libcuda.so.1::/usr/lib/libcuda.so", Link{"libcuda.so.1", "/usr/lib/libcuda.so"}, true},
		{"../x::/a/b/../c//", Link{"../x", "/a/c"}, true},
		{"/abs/target::/l", Link{"/abs/target", "/l"}, true},
		{"a::b::/c", Link{}, false}, // the link "b::/c" is relative
		{"libcuda.so.1", Link{}, false},
		{"::/a", Link{}, false},
		{"a::", Link{}, false},
		{"a::relative/b", Link{}, false},
		{"a::/", Link{}, false},
		{"a::/..", Link{}, false},
		{"a\x00::/b", Link{}, false},
		{"a::/b\x00", Link{}, false},
	} {
		got, err := ParseLink(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseLink(%q) = %v, %v", tt.in, got, err)
		}
		if err != nil && !errors.Is(err, ErrBadLink) {
			t.Errorf("ParseLink(%q) error %v is not ErrBadLink", tt.in, err)
		}
		if err == nil {
			if back, err := ParseLink(got.String()); err != nil || back != got {
				t.Errorf("round trip of %v: %v, %v", got, back, err)
			}
		}
	}
}

func FuzzParseLink(f *testing.F) {
	for _, s := range []string{"libcuda.so.1::/usr/lib/libcuda.so", "::", "a::/", "a::b::/c", "x::/a/../../b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLink(s)
		if err != nil {
			return
		}
		if l.Target == "" || !strings.HasPrefix(l.Link, "/") || l.Link == "/" ||
			strings.Contains(l.Link, "/../") || strings.ContainsRune(l.Target+l.Link, 0) {
			t.Fatalf("ParseLink(%q) accepted %#v", s, l)
		}
	})
}

// FuzzReadState feeds arbitrary state and config.json documents; ReadState
// must not panic, and a root it returns is absolute.
func FuzzReadState(f *testing.F) {
	f.Add([]byte(`{"ociVersion":"1.0.2","id":"c","pid":1,"bundle":"BUNDLE"}`), []byte(`{"root":{"path":"rootfs"}}`))
	f.Add([]byte(`{"bundle":"BUNDLE"}`), []byte(`{"root":{"path":"/"}}`))
	f.Add([]byte(`{"bundle":1}`), []byte(`{"root":null}`))
	f.Fuzz(func(t *testing.T, state, cfg []byte) {
		b := t.TempDir()
		if err := os.WriteFile(filepath.Join(b, "config.json"), cfg, 0o644); err != nil {
			t.Fatal(err)
		}
		state = bytes.ReplaceAll(state, []byte("BUNDLE"), []byte(b))
		_, root, err := ReadState(bytes.NewReader(state))
		if err == nil && !filepath.IsAbs(root) {
			t.Fatalf("relative root %q", root)
		}
	})
}
