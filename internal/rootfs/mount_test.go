package rootfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMountTarget(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir() // stands for the host's /etc
	must(t, os.MkdirAll(filepath.Join(dir, "usr/lib"), 0o755))
	must(t, os.Symlink(outside, filepath.Join(dir, "usr/lib/abs")))
	must(t, os.Symlink("../../../../../.."+outside, filepath.Join(dir, "usr/lib/rel")))
	must(t, os.Symlink(outside+"/dangling", filepath.Join(dir, "usr/lib/final.so")))
	must(t, os.WriteFile(filepath.Join(dir, "usr/lib/file"), nil, 0o644))
	must(t, os.Symlink("/missing-in-root", filepath.Join(dir, "usr/lib/nodir")))
	// The links' targets exist in the root too (as /etc does in an image).
	must(t, os.MkdirAll(filepath.Join(dir, outside), 0o755))
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	for _, tc := range []struct {
		p       string
		dir     bool
		created string // where it must land, relative to dir
	}{
		{"/usr/local/nvidia/lib64/libcuda.so.1", false, "usr/local/nvidia/lib64/libcuda.so.1"},
		{"/lib/firmware/nvidia/1.0", true, "lib/firmware/nvidia/1.0"},
		{"/usr/lib/abs/x.so", false, filepath.Join(outside, "x.so")[1:]},
		{"/usr/lib/rel/y.so", false, filepath.Join(outside, "y.so")[1:]},
		{"/usr/lib/final.so", false, filepath.Join(outside, "dangling")[1:]},
		{"/usr/lib/file", false, "usr/lib/file"},
	} {
		f, err := r.MountTarget(tc.p, tc.dir)
		if err != nil {
			t.Errorf("MountTarget(%s): %v", tc.p, err)
			continue
		}
		var got, want unix.Stat_t
		must(t, unix.Fstat(int(f.Fd()), &got))
		f.Close()
		if err := unix.Stat(filepath.Join(dir, tc.created), &want); err != nil {
			t.Errorf("MountTarget(%s): nothing at %s in the root: %v", tc.p, tc.created, err)
			continue
		}
		if got.Ino != want.Ino || got.Dev != want.Dev {
			t.Errorf("MountTarget(%s) opened another file than %s", tc.p, tc.created)
		}
		if (got.Mode&unix.S_IFMT == unix.S_IFDIR) != tc.dir {
			t.Errorf("MountTarget(%s): mode %#o", tc.p, got.Mode)
		}
	}
	if names, _ := os.ReadDir(outside); len(names) != 0 {
		t.Errorf("MountTarget wrote outside the root: %v", names)
	}

	for _, tc := range []struct {
		p   string
		dir bool
	}{
		{"/", true},
		{"/usr/..", true},
		{"/usr/lib/file", true}, // a file where a directory is needed
		{"/usr/lib", false},     // and the other way round
	} {
		if f, err := r.MountTarget(tc.p, tc.dir); err == nil {
			f.Close()
			t.Errorf("MountTarget(%s, dir=%v) succeeded", tc.p, tc.dir)
		} else if !errors.Is(err, ErrBadMountTarget) {
			t.Errorf("MountTarget(%s, dir=%v): %v, want ErrBadMountTarget", tc.p, tc.dir, err)
		}
	}
	// A link to a directory the root lacks is an error, not a way out.
	if f, err := r.MountTarget("/usr/lib/nodir/z.so", false); err == nil {
		f.Close()
		t.Errorf("MountTarget through a link to a missing directory succeeded")
	}
	if _, err := os.Stat("/missing-in-root"); err == nil {
		t.Errorf("MountTarget created /missing-in-root on the host")
	}
	// A symlink to the root itself is refused too.
	must(t, os.Symlink("/", filepath.Join(dir, "usr/lib/toroot")))
	if f, err := r.MountTarget("/usr/lib/toroot", true); err == nil || !errors.Is(err, ErrBadMountTarget) {
		if f != nil {
			f.Close()
		}
		t.Errorf("MountTarget on a link to the root: %v", err)
	}
}

func TestMknod(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: mknod needs root")
	}
	dir := t.TempDir()
	host := filepath.Join(t.TempDir(), "host-file")
	must(t, os.WriteFile(host, []byte("host"), 0o600))
	must(t, os.MkdirAll(filepath.Join(dir, "dev"), 0o755))
	must(t, os.Symlink(host, filepath.Join(dir, "dev/nvidia0")))
	must(t, os.MkdirAll(filepath.Join(dir, "dev/isdir"), 0o755))
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	old := unix.Umask(0o077)
	defer unix.Umask(old)

	for _, p := range []string{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap1"} {
		if err := r.Mknod(p, unix.S_IFCHR|0o666, unix.Mkdev(195, 7)); err != nil {
			t.Fatalf("Mknod(%s): %v", p, err)
		}
		var st unix.Stat_t
		must(t, unix.Lstat(filepath.Join(dir, p), &st))
		if st.Mode != unix.S_IFCHR|0o666 || unix.Major(st.Rdev) != 195 || unix.Minor(st.Rdev) != 7 {
			t.Errorf("%s: mode %#o, device %d:%d", p, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
	}
	var st unix.Stat_t
	must(t, unix.Stat(host, &st))
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o777 != 0o600 {
		t.Errorf("the symlink's target on the host was changed: mode %#o", st.Mode)
	}
	if err := r.Mknod("/dev/isdir", unix.S_IFCHR|0o666, unix.Mkdev(195, 0)); err == nil {
		t.Errorf("Mknod over a directory succeeded")
	}
	if err := r.Mknod("/dev/fifo", unix.S_IFIFO|0o666, 0); err == nil {
		t.Errorf("Mknod of a FIFO succeeded")
	}
	if names, _ := os.ReadDir(filepath.Join(dir, "dev")); len(names) != 3 {
		t.Errorf("dev holds %d names, want 3 (no temporary files left)", len(names))
	}
}
