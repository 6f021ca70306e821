package driver

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestResolveInRoot checks that symlinks are resolved as if the root were
// "/", so no link leads out of it.
func TestResolveInRoot(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	mk := func(p string) {
		t.Helper()
		h := filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(h), 0o755)
		if err := os.WriteFile(h, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ln := func(target, p string) {
		t.Helper()
		h := filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(h), 0o755)
		if err := os.Symlink(target, h); err != nil {
			t.Fatal(err)
		}
	}
	mk("usr/lib/real.so")
	mk("etc/passwd")
	os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644)
	ln("usr/lib", "lib")
	ln("real.so", "usr/lib/rel.so")
	ln("/usr/lib/real.so", "usr/lib/abs.so")
	ln("/etc/passwd", "usr/lib/passwd.so")
	ln("../../../../../../etc/passwd", "usr/lib/dotdot.so")
	ln(outside+"/secret", "usr/lib/outside.so")
	ln("../../../../../../"+outside+"/secret", "usr/lib/outside-dotdot.so")
	ln("/lib/abs.so", "usr/lib/chain.so")
	ln("loop-b", "usr/lib/loop-a")
	ln("loop-a", "usr/lib/loop-b")
	ln("/", "usr/lib/toroot")
	ln("missing.so", "usr/lib/dangling.so")

	tests := []struct {
		in, want string
		err      error
	}{
		{in: "/usr/lib/real.so", want: "/usr/lib/real.so"},
		{in: "/lib/real.so", want: "/usr/lib/real.so"},
		{in: "/usr/lib/rel.so", want: "/usr/lib/real.so"},
		{in: "/usr/lib/abs.so", want: "/usr/lib/real.so"},
		{in: "/lib/chain.so", want: "/usr/lib/real.so"},
		{in: "/usr/lib/passwd.so", want: "/etc/passwd"},
		{in: "/usr/lib/dotdot.so", want: "/etc/passwd"},
		{in: "/usr/lib/toroot/usr/lib/real.so", want: "/usr/lib/real.so"},
		{in: "/../../usr/lib/real.so", want: "/usr/lib/real.so"},
		{in: "/usr/lib/outside.so", err: os.ErrNotExist},
		{in: "/usr/lib/outside-dotdot.so", err: os.ErrNotExist},
		{in: "/usr/lib/dangling.so", err: os.ErrNotExist},
		{in: "/usr/lib/loop-a", err: errTooManyLinks},
		{in: "/usr/lib/real.so/x", err: nil}, // any error: a file is not a directory
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ResolveInRoot(root, tt.in)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("ResolveInRoot(%s) = %s, want an error", tt.in, got)
				}
				if tt.err != nil && !errors.Is(err, tt.err) {
					t.Fatalf("ResolveInRoot(%s) error = %v, want %v", tt.in, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ResolveInRoot(%s): %v", tt.in, err)
			}
			if want := filepath.Join(root, tt.want); got != want {
				t.Fatalf("ResolveInRoot(%s) = %s, want %s", tt.in, got, want)
			}
			if !strings.HasPrefix(got, root+"/") {
				t.Fatalf("ResolveInRoot(%s) = %s escapes %s", tt.in, got, root)
			}
		})
	}
}

// TestResolveHostRoot checks that root "/" gives plain host paths.
func TestResolveHostRoot(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), nil, 0o644)
	os.Symlink("f", filepath.Join(dir, "l"))
	got, err := ResolveInRoot("/", filepath.Join(dir, "l"))
	real, _ := filepath.EvalSymlinks(filepath.Join(dir, "f"))
	if err != nil || got != real {
		t.Fatalf("ResolveInRoot(/, %s) = %s, %v; want %s", dir+"/l", got, err, real)
	}
}
