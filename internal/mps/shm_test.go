package mps

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/mps/mpstest"
)

// TestMain runs the tests in a mount namespace of their own (the shm
// tests mount tmpfs), and the launcher when this binary is started as one.
func TestMain(m *testing.M) {
	LaunchMain()
	mpstest.PrivateMounts()
	os.Exit(m.Run())
}

func devOf(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Dev
}

// TestShm: each daemon's shm is a tmpfs of its own, nosuid, nodev, noexec,
// mode 1777, of the size asked (a write past it fails with ENOSPC); two
// daemons' are different file systems; mounting again keeps what is there
// (an adopted daemon's clients use it) with the new size; unmounting
// leaves the directory, and twice is no error.
func TestShm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a tmpfs")
	}
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a", "shm"), filepath.Join(dir, "b", "shm")
	for _, p := range []string{a, b} {
		if err := MountShm(p, 4<<20); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(p, unix.MNT_DETACH) })
		mo, typ, so, ok := mpstest.ShmOptions(t, p)
		if !ok || typ != "tmpfs" || !mpstest.HasOptions(mo, "rw", "nosuid", "nodev", "noexec") || !mpstest.HasOptions(so, "size=4096k") {
			t.Errorf("%s: mounted %v, %s %s %s; want tmpfs rw,nosuid,nodev,noexec size=4096k (mode 1777 is tmpfs's default, not listed)", p, ok, typ, mo, so)
		}
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o777 || st.Mode()&os.ModeSticky == 0 {
			t.Errorf("%s: %v %v, want drwxrwxrwt", p, st.Mode(), err)
		}
	}
	if devOf(t, a) == devOf(t, b) {
		t.Error("two daemons share one shm")
	}
	if err := os.WriteFile(filepath.Join(a, "seg"), []byte("tenant a"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(b, "seg")); err == nil {
		t.Error("a segment of one daemon's shm is in the other's")
	}
	err := os.WriteFile(filepath.Join(a, "big"), bytes.Repeat([]byte{1}, 5<<20), 0o600)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("writing 5 MiB into a 4 MiB shm: %v, want ENOSPC", err)
	}
	os.Remove(filepath.Join(a, "big"))

	if err := MountShm(a, 8<<20); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(a, "seg")); string(got) != "tenant a" {
		t.Errorf("mounting again lost the shm's content: %q", got)
	}
	if _, _, so, _ := mpstest.ShmOptions(t, a); !mpstest.HasOptions(so, "size=8192k") {
		t.Errorf("size after mounting again: %s, want size=8192k", so)
	}
	for range 2 {
		if err := UnmountShm(a); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := IsShmMounted(a); m || err != nil {
		t.Errorf("after UnmountShm: mounted %v, %v", m, err)
	}
	if _, err := os.Stat(filepath.Join(a, "seg")); err == nil {
		t.Error("the segment is still there after the unmount")
	}
}

func TestParseShmSize(t *testing.T) {
	for in, want := range map[string]int64{"": DefaultShmSize, "1Gi": 1 << 30, "512Mi": 512 << 20, "1048576": 1 << 20, "2Ti": 2 << 40} {
		if got, err := ParseShmSize("k", in); err != nil || got != want {
			t.Errorf("ParseShmSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"1G", "-1Gi", "0", "1Ki", "lots", "Gi", "9999999999Ti"} {
		if _, err := ParseShmSize("gantry.mpsShmSize", in); err == nil {
			t.Errorf("ParseShmSize(%q): no error", in)
		}
	}
}
