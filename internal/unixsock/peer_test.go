package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func inode(t *testing.T, fd int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestPeerInode: the kernel names the other end of a connection, for a
// socket pair and for an accepted connection (the server's end), and this
// process is seen holding it; a closed other end is no peer.
func TestPeerInode(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	got, err := PeerInode(fds[0])
	if err != nil {
		t.Fatalf("PeerInode: %v (is unix_diag available?)", err)
	}
	if want := inode(t, fds[1]); got != want {
		t.Errorf("PeerInode = %d, want the other end's %d", got, want)
	}
	if ok, err := HoldsSocket("/proc/self", got); !ok || err != nil {
		t.Errorf("HoldsSocket(self, %d) = %v, %v; want true", got, ok, err)
	}
	if ok, err := HoldsSocket("/proc/1", got); ok || err != nil {
		t.Errorf("HoldsSocket(pid 1, %d) = %v, %v; want false", got, ok, err)
	}
	unix.Close(fds[1])
	if p, err := PeerInode(fds[0]); err == nil {
		t.Errorf("PeerInode after the other end closed = %d, want an error", p)
	}

	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sf, _ := s.File()
	defer sf.Close()
	cf, _ := c.File()
	defer cf.Close()
	if got, err := PeerInode(int(sf.Fd())); err != nil || got != inode(t, int(cf.Fd())) {
		t.Errorf("accepted end: PeerInode = %d, %v; want the client's %d", got, err, inode(t, int(cf.Fd())))
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := PeerInode(int(f.Fd())); err == nil {
		t.Error("PeerInode of /dev/null: no error")
	}
}
