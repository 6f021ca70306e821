// Package unixsock makes the unix sockets Gantry's servers listen on: the
// nvidia-docker volume plugin's and gantry-runtime's create server.
package unixsock

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Listen listens on a new socket at p, mode 0600 from its creation (umask
// 0177 around bind, so no other user can connect before a chmod), making
// p's directory with dirMode when missing. A socket left by a server that
// is gone (nobody answers) is replaced; one that answers is not, nor is a
// file that is not a socket. who names the kind of server in errors.
func Listen(p string, dirMode os.FileMode, who string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(p), dirMode); err != nil {
		return nil, fmt.Errorf("creating the directory of %s: %w", p, err)
	}
	if st, err := os.Lstat(p); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket: remove it", p)
		}
		if c, err := net.DialTimeout("unix", p, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another %s listens there (stop it first)", p, who)
		}
		if err := os.Remove(p); err != nil {
			return nil, fmt.Errorf("removing the stale socket %s: %w", p, err)
		}
	}
	old := syscall.Umask(0o177)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", p, err)
	}
	return l, nil
}
