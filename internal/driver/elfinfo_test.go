package driver

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// buildSharedObject compiles a tiny shared object with gcc, or skips.
func buildSharedObject(t testing.TB, soname string, m32 bool) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not found: needed to build test ELF objects")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "x.c")
	os.WriteFile(src, []byte("int gantry_test(void) { return 1; }\n"), 0o644)
	out := filepath.Join(dir, "x.so")
	args := []string{"-shared", "-fPIC", "-Wl,-soname," + soname, "-o", out, src}
	if m32 {
		args = append([]string{"-m32", "-nostdlib"}, args...)
	}
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		if m32 {
			t.Skipf("gcc cannot build 32-bit objects here: %v: %s", err, b)
		}
		t.Fatalf("gcc: %v: %s", err, b)
	}
	return out
}

func TestReadELF(t *testing.T) {
	tests := []struct {
		soname string
		m32    bool
		class  elf.Class
	}{
		{"libcuda.so.1", false, elf.ELFCLASS64},
		{"libnvidia-glcore.so.550.54.15", false, elf.ELFCLASS64},
		{"libcuda.so.1", true, elf.ELFCLASS32},
	}
	for _, tt := range tests {
		so := buildSharedObject(t, tt.soname, tt.m32)
		got, err := readELFFile(so)
		if err != nil {
			t.Fatalf("readELFFile(%s, m32=%v): %v", tt.soname, tt.m32, err)
		}
		if got.SONAME != tt.soname || got.Class != tt.class {
			t.Errorf("readELFFile(m32=%v) = %+v, want SONAME %s class %v", tt.m32, got, tt.soname, tt.class)
		}
	}
}

// TestReadELFMatchesDebugELF compares our reader with the standard library's
// on the libraries of this machine.
func TestReadELFMatchesDebugELF(t *testing.T) {
	files, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/lib*.so.*")
	if len(files) > 60 {
		files = files[:60]
	}
	if len(files) == 0 {
		t.Skip("no system libraries in /usr/lib/x86_64-linux-gnu to compare with")
	}
	for _, p := range files {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		want := ""
		if s, err := f.DynString(elf.DT_SONAME); err == nil && len(s) > 0 {
			want = s[0]
		}
		class, machine := f.Class, f.Machine
		f.Close()
		got, err := readELFFile(p)
		if err != nil {
			t.Errorf("readELFFile(%s): %v", p, err)
			continue
		}
		if got.SONAME != want || got.Class != class || got.Machine != machine {
			t.Errorf("readELFFile(%s) = %+v, debug/elf says %q %v %v", p, got, want, class, machine)
		}
	}
}

func TestReadELFRejects(t *testing.T) {
	for _, b := range [][]byte{nil, []byte("root:x:0:0:root:/root:/bin/bash\n"), []byte("\x7fELF"), []byte("\x7fELF\x09\x01\x01")} {
		if _, err := readELF(bytes.NewReader(b)); err == nil {
			t.Errorf("readELF(%q) succeeded", b)
		}
	}
}

func FuzzReadELF(f *testing.F) {
	for _, p := range []string{"/bin/true", "/usr/lib/x86_64-linux-gnu/libc.so.6"} {
		if b, err := os.ReadFile(p); err == nil && len(b) < 4<<20 {
			f.Add(b[:min(len(b), 64<<10)])
		}
	}
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := readELF(bytes.NewReader(b))
		if err == nil && len(info.SONAME) > maxSONAMELen {
			t.Fatalf("SONAME longer than the limit: %d bytes", len(info.SONAME))
		}
	})
}
