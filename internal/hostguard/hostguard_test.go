package hostguard

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Leaks names a file written after the snapshot that mentions a marker, and
// only that one: not an older file, not another process's file.
func TestLeaks(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("inventory-old.bin", "/tmp/TestMine123/001/driver")
	before := snapshot(dir)
	time.Sleep(10 * time.Millisecond)
	write("inventory-new.bin", "x/tmp/TestMine456/001/driverx")
	write("inventory-other.bin", "/tmp/TestTheirs789/001/driver")
	got := Leaks(dir, before, []string{"/TestMine"})
	if len(got) != 1 || !strings.Contains(got[0], "inventory-new.bin") {
		t.Fatalf("Leaks = %q, want only inventory-new.bin", got)
	}
	if got := Leaks(dir, snapshot(dir), []string{"/TestMine"}); len(got) != 0 {
		t.Fatalf("Leaks with nothing new = %q", got)
	}
	// A shared file rewritten by another process keeps an old path of ours:
	// not a leak; a new path of ours in it is.
	before = snapshot(dir)
	write("inventory-old.bin", "/tmp/TestMine123/001/driver /tmp/TestTheirs1/x")
	if got := Leaks(dir, before, []string{"/TestMine"}); len(got) != 0 {
		t.Fatalf("Leaks of a rewritten file with only old paths = %q", got)
	}
	write("inventory-old.bin", "/tmp/TestMine123/001/driver /tmp/TestMine999/001/driver")
	if got := Leaks(dir, before, []string{"/TestMine"}); len(got) != 1 || !strings.Contains(got[0], "/TestMine999/001/driver") {
		t.Fatalf("Leaks of a rewritten file with a new path = %q", got)
	}
}

func TestTestMarkers(t *testing.T) {
	m := testMarkers()
	if !strings.Contains(strings.Join(m, " "), "/TestLeaks") {
		t.Fatalf("testMarkers() = %q, want /TestLeaks among them", m)
	}
}
