//go:build cgo

package shim

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/createproto"
)

// exited waits up to 60s for the process pid to end (or be a zombie).
func exited(pid int) bool {
	for i := 0; i < 1200; i++ {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || bytes.Contains(b, []byte(") Z ")) {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// running reports whether the process pid still runs.
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && !bytes.Contains(b, []byte(") Z "))
}

// rawRequest sends fields (NUL-terminated each) to sock, with an open
// directory when dir is not empty, and returns all of the answer after the
// server's createproto.ServerAccepted, which must come first.
func rawRequest(t *testing.T, sock string, dir string, fields ...string) []byte {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := strings.Join(fields, "\x00") + "\x00"
	var oob []byte
	if dir != "" {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		oob = unix.UnixRights(fd)
	}
	if _, _, err := c.WriteMsgUnix([]byte(msg), oob, nil); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 || b[0] != createproto.ServerAccepted {
		t.Fatalf("the server's answer %q does not start with createproto.ServerAccepted (%q)", b, createproto.ServerAccepted)
	}
	return b[1:]
}

// TestPingServer: createproto.PingServer tells a server of the runtime's build from
// one of another build (which then stops), from no server, and a request
// shaped like a ping but carrying a bundle, or a create without one, is
// answered as before: "do it yourself", and the server goes on.
func TestPingServer(t *testing.T) {
	gantry, rt := buildGantry(t)

	none := filepath.Join(t.TempDir(), "runtime.sock")
	if st, err := createproto.PingServer(none, rt); st != createproto.ServerAbsent || err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("no socket: %v, %v; want not running, naming the missing socket", st, err)
	}

	sock, srv, out := startServer(t, rt)
	for i := 0; i < 2; i++ {
		if st, err := createproto.PingServer(sock, rt); st != createproto.ServerSameBuild || err != nil {
			t.Fatalf("ping %d with the server's own build: %v, %v", i, st, err)
		}
	}
	self, err := createproto.ExeIdentity(rt)
	if err != nil {
		t.Fatal(err)
	}
	// A ping's fields with a bundle directory: not a ping, and a
	// malformed create.
	if b := rawRequest(t, sock, t.TempDir(), createproto.ServerProtocol, self, "", "0", "", "", "0"); string(b) != "N" {
		t.Errorf("ping fields with a bundle fd: answer %q, want N", b)
	}
	// A create without a bundle directory, even from another build: not
	// served, and not a reason to stop.
	if b := rawRequest(t, sock, "", createproto.ServerProtocol, "1:2:3:4.000000005", "", "0", "/b", "id", "0"); string(b) != "N" {
		t.Errorf("create without a bundle fd: answer %q, want N", b)
	}
	if st, err := createproto.PingServer(sock, rt); st != createproto.ServerSameBuild || err != nil {
		t.Fatalf("after two requests it does not serve: %v, %v (output: %s)", st, err, readFile(out))
	}
	if !strings.Contains(readFile(out), "malformed") {
		t.Errorf("the server's output does not report the malformed request:\n%s", readFile(out))
	}

	other := filepath.Join(t.TempDir(), "gantry-runtime")
	if err := copyFile(gantry, other, 0o755); err != nil {
		t.Fatal(err)
	}
	st, err := createproto.PingServer(sock, other)
	if st != createproto.ServerOtherBuild || err == nil || !strings.Contains(err.Error(), "serves none of its creates") || !strings.Contains(err.Error(), other) {
		t.Fatalf("ping with another build: %v, %v", st, err)
	}
	// The server's own file is unchanged: it stays, for its own build.
	if st, err := createproto.PingServer(sock, rt); st != createproto.ServerSameBuild || err != nil {
		t.Fatalf("after a ping of another copy: %v, %v; want the server still serving its build", st, err)
	}
	if !strings.Contains(readFile(out), "another gantry-runtime file") {
		t.Errorf("the server's output does not say what it refused:\n%s", readFile(out))
	}
	srv.Process.Signal(syscall.SIGTERM)
	if !exited(srv.Process.Pid) {
		t.Fatalf("the server still runs after SIGTERM")
	}
	if st, err := createproto.PingServer(sock, rt); st != createproto.ServerAbsent || err == nil {
		t.Errorf("after the server stopped: %v, %v; want not running", st, err)
	}
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// TestPingServerNotOurs: a socket that is not a create server's (no
// answer, a foreign answer, a stale socket file, not a socket at all) is
// reported as such, never as a server.
func TestPingServerNotOurs(t *testing.T) {
	_, rt := buildGantry(t)
	defer func(d time.Duration) { createproto.PingTimeout = d }(createproto.PingTimeout)
	createproto.PingTimeout = 500 * time.Millisecond
	dir := t.TempDir()

	listen := func(name string, serve func(net.Conn)) string {
		p := filepath.Join(dir, name)
		l, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go serve(c)
			}
		}()
		return p
	}
	silent := listen("silent.sock", func(c net.Conn) { time.Sleep(2 * time.Second); c.Close() })
	foreign := listen("foreign.sock", func(c net.Conn) { c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")); c.Close() })
	mute := listen("mute.sock", func(c net.Conn) { c.Close() })
	// "Y" and the pinger's own identity, from something that is not the
	// server but echoes: still a server's answer only when well-formed.
	fake := listen("fake.sock", func(c net.Conn) { c.Write([]byte("Yes")); c.Close() })
	for _, p := range []string{silent, foreign, mute, fake} {
		if st, err := createproto.PingServer(p, rt); st != createproto.ServerNotOurs || err == nil {
			t.Errorf("%s: %v, %v; want not a create server", filepath.Base(p), st, err)
		}
	}

	stale := filepath.Join(dir, "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if st, err := createproto.PingServer(stale, rt); st != createproto.ServerAbsent || err == nil || !strings.Contains(err.Error(), "nobody listens") {
		t.Errorf("stale socket: %v, %v; want not running", st, err)
	}

	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := createproto.PingServer(file, rt); st != createproto.ServerNotOurs || err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("regular file: %v, %v; want not a create server", st, err)
	}
}

// TestPingServerUnserved: a server that does not serve the pinger (here:
// it runs in another mount namespace) answers a bare "do it yourself";
// createproto.PingServer says it cannot tell, not "another build", and the server
// goes on.
func TestPingServerUnserved(t *testing.T) {
	_, rt := buildGantry(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root: unshare -m")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "runtime.sock")
	var out bytes.Buffer
	cmd := exec.Command("unshare", "-m", "--propagation", "private", rt, "--create-server", "--socket", sock)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i == 1200 {
			t.Fatal("no socket in 60s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	st, err := createproto.PingServer(sock, rt)
	if st != createproto.ServerUnknown || err == nil || !strings.Contains(err.Error(), "mount namespace") {
		t.Errorf("server in another mount namespace: %v, %v; want unknown", st, err)
	}
	if !running(cmd.Process.Pid) {
		t.Errorf("the server stopped after an unserved ping")
	}
}
