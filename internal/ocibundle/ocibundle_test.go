package ocibundle

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestReadRegular(t *testing.T) {
	dir := t.TempDir()
	ok := filepath.Join(dir, "ok.json")
	if err := os.WriteFile(ok, []byte(`{"ociVersion":"1.0.2"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadRegular(ok, "x", 100); err != nil || string(b) != `{"ociVersion":"1.0.2"}` {
		t.Fatalf("ReadRegular(ok) = %q, %v", b, err)
	}
	if _, err := ReadRegular(ok, "x", 5); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the bound: %v, want ErrTooLarge", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, "/dev/zero", dir} {
		done := make(chan error, 1)
		go func() { _, err := ReadRegular(p, "the thing", 1<<20); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "the thing") {
				t.Errorf("ReadRegular(%s) = %v, want ErrNotRegular naming the file", p, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("ReadRegular(%s) blocked", p)
		}
	}
}

func TestReadAtMost(t *testing.T) {
	if b, err := ReadAtMost(strings.NewReader("12345"), 5, "s"); err != nil || string(b) != "12345" {
		t.Errorf("at the bound: %q, %v", b, err)
	}
	if _, err := ReadAtMost(strings.NewReader("123456"), 5, "stdin"); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "stdin") {
		t.Errorf("over the bound: %v", err)
	}
}
