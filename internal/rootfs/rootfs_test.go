package rootfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hostile builds a root whose image content points out of it, and a "host"
// directory beside it holding files that must never change.
func hostile(t *testing.T) (rootDir, host string, r *Root) {
	t.Helper()
	base := t.TempDir()
	rootDir, host = filepath.Join(base, "rootfs"), filepath.Join(base, "host")
	for _, d := range []string{rootDir + "/usr", host + "/etc", host + "/lib"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(host+"/etc/passwd", []byte("host secret\n"), 0o644)
	os.WriteFile(host+"/victim", []byte("host victim\n"), 0o644)
	// /etc is an absolute link to the host's directory; /usr/lib climbs out.
	must(t, os.Symlink(host+"/etc", rootDir+"/etc"))
	must(t, os.Symlink("../../../../../../"+strings.TrimPrefix(host, "/")+"/lib", rootDir+"/usr/lib"))
	must(t, os.Symlink(host+"/victim", rootDir+"/cache"))
	r, err := Open(rootDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return rootDir, host, r
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func hostUnchanged(t *testing.T, host string) {
	t.Helper()
	entries := map[string]string{"etc/passwd": "host secret\n", "victim": "host victim\n"}
	for p, want := range entries {
		b, err := os.ReadFile(filepath.Join(host, p))
		if err != nil || string(b) != want {
			t.Errorf("host file %s changed: %q, %v", p, b, err)
		}
	}
	for _, d := range []string{"etc", "lib", "."} {
		names, _ := os.ReadDir(filepath.Join(host, d))
		for _, n := range names {
			if n.Name() != "passwd" && n.Name() != "victim" && n.Name() != "etc" && n.Name() != "lib" {
				t.Errorf("file created on the host: %s/%s", d, n.Name())
			}
		}
	}
}

func TestReadNeverLeavesRoot(t *testing.T) {
	rootDir, host, r := hostile(t)
	if _, err := r.ReadFile("/etc/passwd"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadFile(/etc/passwd) through an absolute link to the host: err = %v, want not-exist (clamped inside the root)", err)
	}
	if _, err := r.ReadFile("/cache"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadFile of a link to a host file: %v", err)
	}
	// The same link target, made inside the root, is what gets read.
	must(t, os.MkdirAll(filepath.Join(rootDir, host, "etc"), 0o755))
	must(t, os.WriteFile(filepath.Join(rootDir, host, "etc/passwd"), []byte("image\n"), 0o644))
	b, err := r.ReadFile("/etc/passwd")
	if err != nil || string(b) != "image\n" {
		t.Fatalf("ReadFile clamped = %q, %v", b, err)
	}
	hostUnchanged(t, host)
}

func TestWritesNeverLeaveRoot(t *testing.T) {
	rootDir, host, r := hostile(t)
	// /etc links to a host path that does not exist inside the root: writing
	// through it fails cleanly rather than reaching the host.
	if err := r.WriteFileAtomic("/etc/ld.so.cache", []byte("ours"), 0o644); err == nil {
		t.Fatal("write through a dangling (inside the root) /etc link succeeded")
	}
	if err := r.MkdirAll("/etc/ld.so.conf.d", 0o755); err == nil {
		t.Fatal("MkdirAll through a dangling /etc link succeeded")
	}
	hostUnchanged(t, host)
	// Once the link's target exists inside the root, writes land there.
	must(t, os.MkdirAll(filepath.Join(rootDir, host, "etc"), 0o755))
	must(t, r.WriteFileAtomic("/etc/ld.so.cache", []byte("ours"), 0o644))
	if b, err := os.ReadFile(filepath.Join(rootDir, host, "etc/ld.so.cache")); err != nil || string(b) != "ours" {
		t.Fatalf("write did not land inside the root: %q, %v", b, err)
	}
	// A final component that links to a host file is replaced, not followed.
	must(t, r.WriteFileAtomic("/cache", []byte("ours"), 0o644))
	if fi, err := os.Lstat(filepath.Join(rootDir, "cache")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("/cache is not a regular file in the root now: %v %v", fi, err)
	}
	// ../ climbing links are clamped for mkdir and symlink too.
	must(t, os.MkdirAll(filepath.Join(rootDir, host, "lib"), 0o755))
	must(t, r.MkdirAll("/usr/lib/x86_64-linux-gnu", 0o755))
	must(t, r.Symlink("libcuda.so.580", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"))
	must(t, r.Symlink(host+"/victim", "/usr/lib/x86_64-linux-gnu/libcuda.so.1")) // replaced, host untouched
	target, err := os.Readlink(filepath.Join(rootDir, host, "lib/x86_64-linux-gnu/libcuda.so.1"))
	if err != nil || target != host+"/victim" {
		t.Fatalf("symlink not created inside the root: %q, %v", target, err)
	}
	hostUnchanged(t, host)
}

// A directory swapped for a link to the host between two operations must
// not redirect the second one.
func TestSwapBetweenCalls(t *testing.T) {
	rootDir, host, r := hostile(t)
	must(t, r.MkdirAll("/opt/lib", 0o755))
	must(t, os.RemoveAll(filepath.Join(rootDir, "opt/lib")))
	must(t, os.Symlink(host, filepath.Join(rootDir, "opt/lib")))
	if err := r.WriteFileAtomic("/opt/lib/victim", []byte("overwritten"), 0o644); err == nil {
		// Only acceptable if it landed inside the root.
		if _, serr := os.Stat(filepath.Join(rootDir, host, "victim")); serr != nil {
			t.Fatalf("write succeeded but not inside the root: %v", serr)
		}
	}
	hostUnchanged(t, host)
}

func TestReadDirAndErrors(t *testing.T) {
	rootDir, _, r := hostile(t)
	must(t, os.WriteFile(filepath.Join(rootDir, "usr/a"), nil, 0o644))
	names, err := r.ReadDir("/usr")
	if err != nil || len(names) != 2 {
		t.Fatalf("ReadDir(/usr) = %v, %v", names, err)
	}
	if _, err := r.ReadFile("/usr"); err == nil {
		t.Fatal("ReadFile of a directory must fail")
	}
	if err := r.WriteFileAtomic("/", nil, 0o644); err == nil {
		t.Fatal("writing the root itself must fail")
	}
	if _, err := Open(filepath.Join(rootDir, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("Open(missing) = %v", err)
	}
}
