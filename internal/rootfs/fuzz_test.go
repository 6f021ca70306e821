package rootfs

import (
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// mkParents creates the missing directories of p below rootDir with host
// calls, and reports false when an existing one is a symlink: the fuzz
// layout's own links (to "/", "../../..") must not make the test write on
// the host.
func mkParents(rootDir, p string) bool {
	rel, err := filepath.Rel(rootDir, filepath.Dir(p))
	if err != nil || strings.HasPrefix(rel, "..") {
		return false
	}
	cur := rootDir
	for _, c := range strings.Split(rel, "/") {
		if c == "." {
			continue
		}
		cur = filepath.Join(cur, c)
		fi, err := os.Lstat(cur)
		if os.IsNotExist(err) {
			if os.Mkdir(cur, 0o755) != nil {
				return false
			}
			continue
		}
		if err != nil || !fi.IsDir() {
			return false
		}
	}
	return true
}

// FuzzNoEscape builds a root from the fuzzer's bytes — directories, and
// symlinks whose targets climb out, name the host absolutely or loop — then
// runs every operation on fuzzer-chosen paths, and checks that nothing
// outside the root was created, changed or removed, and that reads never
// return host content.
func FuzzNoEscape(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12"))
	f.Add([]byte{2, 0, 9, 3, 1, 7, 7, 7, 5, 4, 2, 1, 0, 6, 8, 8, 3, 2, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 96 {
			data = data[:96] // bounded: a few dozen entries and operations
		}
		base := t.TempDir()
		rootDir, host := filepath.Join(base, "rootfs"), filepath.Join(base, "host")
		must(t, os.MkdirAll(rootDir, 0o755))
		must(t, os.MkdirAll(host+"/d", 0o755))
		must(t, os.WriteFile(host+"/f", []byte("HOST"), 0o644))
		must(t, os.WriteFile(host+"/d/f", []byte("HOST"), 0o644))

		// Names that no ordinary host has at "/": were the package broken,
		// an escape through a "/" link would create junk, not overwrite
		// /etc or /lib of the machine running the test.
		names := []string{"a", "b", "c", "x", "f", "..", "d", "host"}
		targets := []string{"/", "..", "../..", "../../../..", host, host + "/f", host + "/d",
			"../host", "../../host/d", "/a", "a/b", "b", ".", "/etc/../..", "loop", "/d/f"}
		byteAt := func(i int) int {
			if i < len(data) {
				return int(data[i])
			}
			return 0
		}
		rel := func(i, n int) string {
			var parts []string
			for k := 0; k < n; k++ {
				parts = append(parts, names[byteAt(i+k)%len(names)])
			}
			return strings.Join(parts, "/")
		}
		// Layout: entries of three bytes (kind, path, target).
		i := 0
		for ; i+3 <= len(data)/2; i += 3 {
			p := filepath.Join(rootDir, rel(i+1, 1+byteAt(i)%3))
			if !strings.HasPrefix(p, rootDir+"/") {
				continue // the test itself must not write outside
			}
			if !mkParents(rootDir, p) {
				continue
			}
			switch byteAt(i) % 3 {
			case 0:
				os.Mkdir(p, 0o755)
			case 1:
				os.Symlink(targets[byteAt(i+2)%len(targets)], p)
			case 2:
				// O_EXCL|O_NOFOLLOW: never write through a link made above.
				if f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644); err == nil {
					f.WriteString("IMAGE")
					f.Close()
				}
			}
		}
		before := snapshot(t, base, rootDir)
		r, err := Open(rootDir)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		// Operations: the rest, three bytes each.
		for ; i+3 <= len(data); i += 3 {
			p := "/" + rel(i+1, 1+byteAt(i+2)%4)
			switch byteAt(i) % 7 {
			case 0:
				r.MkdirAll(p, 0o755)
			case 1:
				r.WriteFileAtomic(p, []byte("OURS"), 0o644)
			case 2:
				r.Symlink(targets[byteAt(i+2)%len(targets)], p)
			case 3:
				r.ReplaceSymlink(targets[byteAt(i+2)%len(targets)], p)
			case 4:
				if b, err := r.ReadFile(p); err == nil && string(b) == "HOST" {
					t.Fatalf("ReadFile(%s) read the host file", p)
				}
			case 5:
				r.ReadDir(p)
				r.Lstat(p)
				r.Stat(p)
			case 6:
				r.MkdirAll(path.Dir(p), 0o755)
				r.WriteFileAtomic(p, []byte("OURS"), 0o644)
			}
		}
		outsideUnchanged(t, before, base, rootDir)
	})
}
