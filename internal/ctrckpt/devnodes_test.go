package ctrckpt

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSyncDevNodesHostileDev: the restored container's /dev is image
// content after CRIU: links at the GPU nodes' names that point out of the
// root are replaced, never followed, and a stale name that is not the
// GPU's node is left alone; no host file is touched.
func TestSyncDevNodesHostileDev(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox (scripts/deps.sh --test installs busybox-static)")
	}
	tmp := t.TempDir()
	root := filepath.Join(tmp, "root")
	for _, d := range []string{"dev", "bin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(tmp, "host-file")
	if err := os.WriteFile(outside, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	// /dev/nvidia1 (wanted) and /dev/nvidia0 (stale) both links to a host file.
	for _, n := range []string{"nvidia1", "nvidia0"} {
		if err := os.Symlink(outside, filepath.Join(root, "dev", n)); err != nil {
			t.Fatal(err)
		}
	}
	// the "container": a process chrooted into root, whose /proc/PID/root
	// SyncDevNodes resolves in
	ct := exec.Command("/bin/busybox", "sleep", "600")
	ct.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	if err := ct.Start(); err != nil {
		t.Skipf("cannot start a chrooted process (static busybox needed): %v", err)
	}
	defer func() { _ = ct.Process.Kill(); _ = ct.Wait() }()
	if err := SyncDevNodes(ct.Process.Pid, []DevNode{{Minor: 1, Mode: 0o666}}, []int{0}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, "dev", "nvidia1"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != nvidiaMajor || unix.Minor(st.Rdev) != 1 {
		t.Errorf("/dev/nvidia1 is mode %o rdev %d:%d, want the character device 195:1", st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	if l, err := os.Readlink(filepath.Join(root, "dev", "nvidia0")); err != nil || l != outside {
		t.Errorf("a stale name that is not the GPU's node was changed: %q, %v", l, err)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "host" {
		t.Errorf("the host file behind the links changed: %q, %v", b, err)
	}
	var hs unix.Stat_t
	if err := unix.Lstat(outside, &hs); err != nil || hs.Mode&unix.S_IFMT != unix.S_IFREG {
		t.Errorf("the host file is no longer a regular file: mode %o, %v", hs.Mode, err)
	}
}
