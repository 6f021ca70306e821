package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// hostile builds, in a fresh temporary directory, a container root whose
// image content points out of it, and a "host" directory beside it holding
// files that must never change. It returns the snapshot of everything
// outside the root, for outsideUnchanged.
func hostile(t testing.TB) (base, rootDir, host string, r *Root) {
	t.Helper()
	base = t.TempDir()
	rootDir, host = filepath.Join(base, "rootfs"), filepath.Join(base, "host")
	for _, d := range []string{rootDir + "/usr", host + "/etc", host + "/lib"} {
		must(t, os.MkdirAll(d, 0o755))
	}
	must(t, os.WriteFile(host+"/etc/passwd", []byte("host secret\n"), 0o644))
	must(t, os.WriteFile(host+"/victim", []byte("host victim\n"), 0o644))
	// /etc is an absolute link to a host directory; /usr/lib climbs out with
	// more ".." than there are levels; /etc/ld.so.cache-like final names
	// link to a host file.
	must(t, os.Symlink(host+"/etc", rootDir+"/etc"))
	must(t, os.Symlink("../../../../../../../../"+strings.TrimPrefix(host, "/")+"/lib", rootDir+"/usr/lib"))
	must(t, os.Symlink(host+"/victim", rootDir+"/cache"))
	must(t, os.Symlink("../host/victim", rootDir+"/relcache"))
	var err error
	r, err = Open(rootDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return base, rootDir, host, r
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// snapshot records every file under base except the root's subtree: its
// type, mode, and content or link target.
func snapshot(t testing.TB, base, rootDir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == rootDir {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		v := fi.Mode().String()
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			v += " -> " + target
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func outsideUnchanged(t testing.TB, before map[string]string, base, rootDir string) {
	t.Helper()
	after := snapshot(t, base, rootDir)
	for p, v := range after {
		if w, ok := before[p]; !ok {
			t.Errorf("created outside the root: %s (%s)", p, v)
		} else if w != v {
			t.Errorf("changed outside the root: %s: %q, was %q", p, v, w)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			t.Errorf("removed outside the root: %s", p)
		}
	}
}

func TestReadNeverLeavesRoot(t *testing.T) {
	base, rootDir, host, r := hostile(t)
	before := snapshot(t, base, rootDir)
	for _, p := range []string{"/etc/passwd", "/cache", "relcache", "/usr/lib/../../host/victim", "../host/victim", "/usr/lib"} {
		if b, err := r.ReadFile(p); err == nil || strings.Contains(string(b), "host") {
			t.Errorf("ReadFile(%s) = %q, %v; want an error (the link resolves inside the root, where nothing is)", p, b, err)
		}
	}
	if _, err := r.ReadDir("/etc"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadDir(/etc) through an absolute link to the host: %v, want not-exist", err)
	}
	if _, err := r.ReadFile("/etc/passwd"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadFile(/etc/passwd): %v, want not-exist", err)
	}
	// The same link targets, made inside the root, are what get read.
	must(t, os.MkdirAll(filepath.Join(rootDir, host, "etc"), 0o755))
	must(t, os.WriteFile(filepath.Join(rootDir, host, "etc/passwd"), []byte("image\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(rootDir, host, "victim"), []byte("image victim\n"), 0o644))
	for p, want := range map[string]string{"/etc/passwd": "image\n", "/cache": "image victim\n"} {
		if b, err := r.ReadFile(p); err != nil || string(b) != want {
			t.Errorf("ReadFile(%s) clamped = %q, %v; want %q", p, b, err, want)
		}
	}
	names, err := r.ReadDir("/etc")
	if err != nil || len(names) != 1 || names[0] != "passwd" {
		t.Errorf("ReadDir(/etc) clamped = %v, %v", names, err)
	}
	f, err := r.OpenFile("/etc/passwd")
	must(t, err)
	buf := make([]byte, 3)
	if _, err := f.ReadAt(buf, 2); err != nil || string(buf) != "age" {
		t.Errorf("ReadAt = %q, %v", buf, err)
	}
	f.Close()
	outsideUnchanged(t, before, base, rootDir)
}

func TestWritesNeverLeaveRoot(t *testing.T) {
	base, rootDir, host, r := hostile(t)
	before := snapshot(t, base, rootDir)
	// /etc links to a host path that does not exist inside the root: writing
	// through it fails cleanly rather than reaching the host.
	if err := r.WriteFileAtomic("/etc/ld.so.cache", []byte("ours"), 0o644); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("write through a dangling (inside the root) /etc link: %v, want not-exist", err)
	}
	if err := r.MkdirAll("/etc/ld.so.conf.d", 0o755); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("MkdirAll through a dangling /etc link: %v, want not-exist", err)
	}
	if err := r.Symlink("x", "/etc/x"); err == nil {
		t.Error("Symlink through a dangling /etc link succeeded")
	}
	outsideUnchanged(t, before, base, rootDir)

	// Once the link's target exists inside the root, writes land there.
	must(t, os.MkdirAll(filepath.Join(rootDir, host, "etc"), 0o755))
	must(t, r.WriteFileAtomic("/etc/ld.so.cache", []byte("ours"), 0o644))
	if b, err := os.ReadFile(filepath.Join(rootDir, host, "etc/ld.so.cache")); err != nil || string(b) != "ours" {
		t.Fatalf("write did not land inside the root: %q, %v", b, err)
	}
	must(t, r.MkdirAll("/etc/ld.so.conf.d", 0o755))
	if fi, err := os.Stat(filepath.Join(rootDir, host, "etc/ld.so.conf.d")); err != nil || !fi.IsDir() {
		t.Fatalf("MkdirAll did not land inside the root: %v", err)
	}

	// A final component that links to a host file (absolute or relative)
	// is replaced, not followed.
	for _, name := range []string{"cache", "relcache"} {
		must(t, r.WriteFileAtomic("/"+name, []byte("ours"), 0o600))
		fi, err := os.Lstat(filepath.Join(rootDir, name))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
			t.Errorf("/%s in the root after WriteFileAtomic: %v, %v; want a regular file 0600", name, fi.Mode(), err)
		}
	}
	// Symlink leaves an existing different file alone; ReplaceSymlink
	// replaces the link itself, not what it points to.
	must(t, os.Symlink(host+"/victim", filepath.Join(rootDir, "usr/libcuda.so.1")))
	if err := r.Symlink("libcuda.so.580", "/usr/libcuda.so.1"); !errors.Is(err, fs.ErrExist) {
		t.Errorf("Symlink over a different link: %v, want exist", err)
	}
	must(t, r.ReplaceSymlink("libcuda.so.580", "/usr/libcuda.so.1"))
	if got, err := os.Readlink(filepath.Join(rootDir, "usr/libcuda.so.1")); err != nil || got != "libcuda.so.580" {
		t.Errorf("link after ReplaceSymlink = %q, %v", got, err)
	}
	must(t, r.Symlink("libcuda.so.580", "/usr/libcuda.so.1")) // identical: no-op

	// "../" climbing links are clamped for mkdir and symlink too.
	must(t, os.MkdirAll(filepath.Join(rootDir, host, "lib"), 0o755))
	must(t, r.MkdirAll("/usr/lib/x86_64-linux-gnu", 0o755))
	must(t, r.Symlink("libcuda.so.580", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"))
	must(t, r.ReplaceSymlink(host+"/victim", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"))
	target, err := os.Readlink(filepath.Join(rootDir, host, "lib/x86_64-linux-gnu/libcuda.so.1"))
	if err != nil || target != host+"/victim" {
		t.Fatalf("symlink not created inside the root: %q, %v", target, err)
	}
	outsideUnchanged(t, before, base, rootDir)
}

// A directory swapped for a link to the host between two calls must not
// redirect the second one.
func TestSwapBetweenCalls(t *testing.T) {
	base, rootDir, host, r := hostile(t)
	before := snapshot(t, base, rootDir)
	must(t, r.MkdirAll("/opt/lib", 0o755))
	must(t, os.RemoveAll(filepath.Join(rootDir, "opt/lib")))
	must(t, os.Symlink(host, filepath.Join(rootDir, "opt/lib")))
	if err := r.WriteFileAtomic("/opt/lib/victim", []byte("overwritten"), 0o644); err == nil {
		t.Error("write through a swapped-in link to a directory missing in the root succeeded")
	}
	if err := r.MkdirAll("/opt/lib/new", 0o755); err == nil {
		t.Error("MkdirAll through a swapped-in dangling link succeeded")
	}
	if err := r.ReplaceSymlink("x", "/opt/lib/victim"); err == nil {
		t.Error("ReplaceSymlink through a swapped-in dangling link succeeded")
	}
	outsideUnchanged(t, before, base, rootDir)
}

// While another goroutine keeps swapping a directory of the root for a
// symlink to the host and back, no operation may touch the host.
func TestConcurrentSwap(t *testing.T) {
	base, rootDir, host, r := hostile(t)
	before := snapshot(t, base, rootDir)
	dir := filepath.Join(rootDir, "swap")
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			tmp := fmt.Sprintf("%s.%d", dir, i)
			if i%2 == 0 {
				os.Symlink(host, tmp)
			} else {
				os.Mkdir(tmp, 0o755)
			}
			os.RemoveAll(dir)
			os.Rename(tmp, dir)
		}
	}()
	for i := 0; i < 2000; i++ {
		r.MkdirAll("/swap/etc/sub", 0o755)
		r.WriteFileAtomic("/swap/victim", []byte("overwritten"), 0o644)
		r.WriteFileAtomic("/swap/etc/passwd", []byte("overwritten"), 0o644)
		r.ReplaceSymlink("x", "/swap/lib")
		r.ReadFile("/swap/etc/passwd")
	}
	stop.Store(true)
	wg.Wait()
	os.RemoveAll(dir)
	outsideUnchanged(t, before, base, rootDir)
}

// A FIFO or device node planted where a file is read must be refused
// without blocking or reading it.
func TestReadRefusesSpecialFiles(t *testing.T) {
	_, rootDir, _, r := hostile(t)
	must(t, os.Mkdir(filepath.Join(rootDir, "etc2"), 0o755))
	must(t, syscall.Mkfifo(filepath.Join(rootDir, "etc2/fifo"), 0o644))
	must(t, os.Symlink("/etc2/fifo", filepath.Join(rootDir, "etc2/to-fifo")))
	special := []string{"/etc2/fifo", "/etc2/to-fifo", "/usr", "/"}
	if os.Geteuid() == 0 {
		// A character device (the kernel's /dev/null numbers).
		must(t, syscall.Mknod(filepath.Join(rootDir, "etc2/dev"), syscall.S_IFCHR|0o644, 1<<8|3))
		special = append(special, "/etc2/dev")
	}
	for _, p := range special {
		if _, err := r.ReadFile(p); !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadFile(%s) = %v, want ErrNotRegular", p, err)
		}
	}
}

// An image's file or directory can be of any size; the bounded readers
// stop at their bound (a sparse file by its size, before reading).
func TestReadBounds(t *testing.T) {
	_, rootDir, _, r := hostile(t)
	must(t, os.Mkdir(filepath.Join(rootDir, "big"), 0o755))
	for i := range 3000 {
		must(t, os.WriteFile(filepath.Join(rootDir, "big", fmt.Sprint(i)), nil, 0o644))
	}
	if names, err := r.ReadDirMax("/big", 3000); err != nil || len(names) != 3000 {
		t.Errorf("ReadDirMax at the bound: %d names, %v", len(names), err)
	}
	if _, err := r.ReadDirMax("/big", 2999); !errors.Is(err, ErrTooLarge) {
		t.Errorf("ReadDirMax over the bound: %v, want ErrTooLarge", err)
	}
	f, err := os.Create(filepath.Join(rootDir, "sparse"))
	must(t, err)
	must(t, f.Truncate(1<<40))
	f.Close()
	if _, err := r.ReadFileMax("/sparse", 1<<20); !errors.Is(err, ErrTooLarge) {
		t.Errorf("ReadFileMax of a 1 TiB sparse file: %v, want ErrTooLarge", err)
	}
	if _, err := r.ReadFile("/sparse"); !errors.Is(err, ErrTooLarge) {
		t.Errorf("ReadFile of a 1 TiB sparse file: %v, want ErrTooLarge", err)
	}
}

func TestStatLstatReadlink(t *testing.T) {
	_, rootDir, host, r := hostile(t)
	fi, err := r.Lstat("/etc")
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 || fi.Name() != "etc" {
		t.Errorf("Lstat(/etc) = %v, %v; want a symlink", fi, err)
	}
	if got, err := r.Readlink("/etc"); err != nil || got != host+"/etc" {
		t.Errorf("Readlink(/etc) = %q, %v", got, err)
	}
	if _, err := r.Stat("/etc"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat(/etc) = %v, want not-exist (dangling inside the root)", err)
	}
	must(t, os.WriteFile(filepath.Join(rootDir, "usr/f"), []byte("12345"), 0o640))
	fi, err = r.Stat("/usr/../usr/f")
	if err != nil || fi.Size() != 5 || fi.Mode() != 0o640 || fi.IsDir() {
		t.Errorf("Stat(/usr/f) = %v, %v", fi, err)
	}
	if fi, err := r.Lstat("/"); err != nil || !fi.IsDir() {
		t.Errorf("Lstat(/) = %v, %v", fi, err)
	}
}

func TestErrors(t *testing.T) {
	_, rootDir, _, r := hostile(t)
	must(t, os.WriteFile(filepath.Join(rootDir, "usr/a"), nil, 0o644))
	names, err := r.ReadDir("/usr")
	if err != nil || len(names) != 2 {
		t.Fatalf("ReadDir(/usr) = %v, %v", names, err)
	}
	if err := r.WriteFileAtomic("/", nil, 0o644); err == nil {
		t.Error("writing the root itself must fail")
	}
	if err := r.WriteFileAtomic("/usr", nil, 0o644); err == nil {
		t.Error("writing over a directory must fail")
	}
	if err := r.MkdirAll("/usr/a/b", 0o755); err == nil || !strings.Contains(err.Error(), "/usr/a") {
		t.Errorf("MkdirAll under a file = %v", err)
	}
	if err := r.ReplaceSymlink("x", "/usr"); err == nil {
		t.Error("ReplaceSymlink over a directory must fail")
	}
	if err := r.Symlink("", "/usr/empty"); err == nil {
		t.Error("Symlink with an empty target must fail")
	}
	if _, err := Open(filepath.Join(rootDir, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Open(missing) = %v", err)
	}
	_, err = r.ReadFile("/nope")
	if err == nil || !strings.Contains(err.Error(), "/nope in "+rootDir) {
		t.Errorf("error does not name the container path and root: %v", err)
	}
	// No temporary files are left behind.
	ents, _ := os.ReadDir(filepath.Join(rootDir, "usr"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".gantry-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

func BenchmarkWriteFileAtomic(b *testing.B) {
	r, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	must(b, r.MkdirAll("/etc", 0o755))
	data := make([]byte, 64<<10)
	for b.Loop() {
		if err := r.WriteFileAtomic("/etc/ld.so.cache", data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPresent: which names a directory holds, its path resolved in the
// root: /etc links to the host's etc, where passwd exists, and it must read
// as the root's own (empty) /etc, not the host's.
func TestPresent(t *testing.T) {
	_, rootDir, _, r := hostile(t)
	must(t, os.MkdirAll(rootDir+"/lib64", 0o755))
	must(t, os.WriteFile(rootDir+"/lib64/libcuda.so.1", nil, 0o644))
	must(t, os.Symlink("libcuda.so.1", rootDir+"/lib64/libnvidia-ml.so.1"))
	got, err := r.Present("/lib64", []string{"libcuda.so.1", "libnvidia-ml.so.1", "libnone.so.1"})
	if err != nil || len(got) != 2 || !got["libcuda.so.1"] || !got["libnvidia-ml.so.1"] {
		t.Errorf("Present(/lib64) = %v, %v; want libcuda.so.1 and libnvidia-ml.so.1", got, err)
	}
	if got, err := r.Present("/etc", []string{"passwd"}); err != nil || got["passwd"] {
		t.Errorf("Present(/etc) = %v, %v: the host's /etc read through the root's link", got, err)
	}
	if got, err := r.Present("/missing", []string{"x"}); err != nil || len(got) != 0 {
		t.Errorf("Present(/missing) = %v, %v", got, err)
	}
	if _, err := r.Present("/lib64", []string{"../etc"}); err == nil {
		t.Errorf("Present took a name with a slash")
	}
}
