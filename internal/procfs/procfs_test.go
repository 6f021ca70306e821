package procfs

import (
	"os"
	"path/filepath"
	"testing"
)

// TestStat reads this process's own stat, and a crafted one whose command
// name holds spaces and a ") " that would shift every field after it.
func TestStat(t *testing.T) {
	if p, err := Parent("/proc", os.Getpid()); err != nil || p != os.Getppid() {
		t.Errorf("Parent(self) = %d, %v; want %d", p, err, os.Getppid())
	}
	if st, err := StartTime("/proc", os.Getpid()); err != nil || st == 0 {
		t.Errorf("StartTime(self) = %d, %v", st, err)
	}
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "42"), 0o755); err != nil {
		t.Fatal(err)
	}
	stat := "42 (evil) 7 9 (x) S 17 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 1000 10\n"
	if err := os.WriteFile(filepath.Join(proc, "42/stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := Parent(proc, 42); err != nil || p != 17 {
		t.Errorf("Parent = %d, %v; want 17", p, err)
	}
	if st, err := StartTime(proc, 42); err != nil || st != 123456 {
		t.Errorf("StartTime = %d, %v; want 123456", st, err)
	}
	if err := os.WriteFile(filepath.Join(proc, "42/stat"), []byte("42 (short) S 1 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Parent(proc, 42); err == nil {
		t.Errorf("a short stat was read")
	}
	if _, err := Parent(proc, 43); err == nil {
		t.Errorf("a missing process was read")
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:            "/plain",
		`/a\040b`:           "/a b",
		`/tab\011and\012nl`: "/tab\tand\nnl",
		`/back\134slash`:    `/back\slash`,
		`/end\040`:          "/end ",
		`/short\04`:         `/short\04`,
		`/not\999octal`:     `/not\999octal`,
	} {
		if got := UnescapeMountinfo(in); got != want {
			t.Errorf("UnescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}
