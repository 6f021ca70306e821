package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplacesWhole(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.json")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, sync := range []bool{false, true} {
		if err := Write(p, []byte("new"), Options{Mode: 0o640, Sync: sync}); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(p)
		st, _ := os.Stat(p)
		if string(b) != "new" || st.Mode().Perm() != 0o640 {
			t.Errorf("sync %v: %q %v, want new 0640", sync, b, st.Mode().Perm())
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
}

func TestNoReplace(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := Write(p, []byte("one"), Options{NoReplace: true}); err != nil {
		t.Fatal(err)
	}
	err := Write(p, []byte("two"), Options{NoReplace: true})
	if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second write: %v, want ErrExist", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "one" {
		t.Errorf("the existing file changed: %q", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
}

// A failure (the target is a directory) leaves the old content and no
// temporary file.
func TestFailureLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "d")
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, []byte("x"), Options{}); err == nil {
		t.Fatal("renaming a file over a non-empty directory succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
	if err := Write(filepath.Join(dir, "missing", "f"), nil, Options{}); err == nil {
		t.Error("a missing directory is not an error")
	}
}

// TestStaged: staged content is invisible at the path until Commit, which
// puts it there whole; Abort leaves the old file and no temporary one.
func TestStaged(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "config.json")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Stage(p, []byte("aborted"), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Fatalf("staged content visible before Commit: %q", b)
	}
	s.Abort()
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("Abort changed the file: %q", b)
	}
	s, err = Stage(p, []byte("new"), 0o640)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	st, _ := os.Stat(p)
	if string(b) != "new" || st.Mode().Perm() != 0o640 {
		t.Errorf("after Commit: %q %v, want new 0640", b, st.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
}
