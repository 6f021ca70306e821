package doctor

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/config"
)

var (
	rtOnce       sync.Once
	rtBin, rtErr string
)

// realRuntime builds gantry-runtime from this tree, once: the create
// server the engine checks ask is the real one.
func realRuntime(t *testing.T) string {
	t.Helper()
	rtOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gantry-doctor-rt-")
		if err != nil {
			rtErr = err.Error()
			return
		}
		goTool := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			goTool = "go"
		}
		rtBin = filepath.Join(dir, "gantry-runtime")
		cmd := exec.Command(goTool, "build", "-o", rtBin, "github.com/gantry-gpu/gantry/cmd/gantry-runtime")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			rtErr = fmt.Sprintf("go build ./cmd/gantry-runtime: %v\n%s", err, out)
		}
	})
	if rtErr != "" {
		t.Fatal(rtErr)
	}
	return rtBin
}

// startCreateServer runs `rt --create-server` on sock until the test ends.
func startCreateServer(t *testing.T, rt, sock string) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	out := &lockedBuffer{}
	cmd := exec.Command(rt, "--create-server", "--socket", sock)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
		}
	})
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			return cmd, out
		}
		if i == 1200 {
			t.Fatalf("no create server socket in 60s: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gone waits up to 60s for process pid to end (or be a zombie).
func gone(pid int) bool {
	for i := 0; i < 1200; i++ {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || bytes.Contains(b, []byte(") Z ")) {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// TestCreateServerNote: the engine checks' PASS line says what the
// create server at the socket is, asking the real server: not running,
// the registered runtime's build, another build (which stops, and a second
// engine check in the same run says the same, not "not running"), and a
// socket that is not a create server's. NVIDIA's runtime is not asked.
func TestCreateServerNote(t *testing.T) {
	rt := realRuntime(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "runtime.sock")
	newOpts := func() Options {
		return Options{Proc: t.TempDir(), Config: config.Default(), RuntimeSocket: sock, serverPings: map[string]serverPing{}}
	}
	// nvidia-container-runtime -> gantry-runtime, as make install links it.
	link := filepath.Join(dir, "nvidia-container-runtime")
	if err := os.Symlink(rt, link); err != nil {
		t.Fatal(err)
	}
	judge := func(opts Options, prog string) Check {
		t.Helper()
		c := judgeRuntimes(opts, CheckDocker, "daemon.json", "configure", "reinstall", []registered{{Name: "nvidia", Program: prog}})
		if c.Status != Pass {
			t.Fatalf("%s: %s %q, want PASS", prog, c.Status, c.Evidence)
		}
		return c
	}

	c := judge(newOpts(), link)
	if !strings.Contains(c.Evidence, "create server not running ("+sock+" does not exist): each GPU create starts Go") {
		t.Errorf("no server: %q", c.Evidence)
	}

	srv, out := startCreateServer(t, rt, sock)
	c = judge(newOpts(), link)
	if want := "create server: same build, listening on " + sock; !strings.Contains(c.Evidence, want) || strings.Contains(c.Evidence, "create server not") {
		t.Errorf("server of the runtime's build: %q, want %q", c.Evidence, want)
	}

	// NVIDIA's runtime (another program by that name) is not asked: the
	// server goes on serving.
	nv := filepath.Join(t.TempDir(), "nvidia-container-runtime")
	if err := os.WriteFile(nv, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if c := judge(newOpts(), nv); strings.Contains(c.Evidence, "create server") {
		t.Errorf("NVIDIA's runtime: %q mentions the create server", c.Evidence)
	}
	if c := judge(newOpts(), link); !strings.Contains(c.Evidence, "same build") {
		t.Errorf("after NVIDIA's runtime was judged: %q, want the server still there", c.Evidence)
	}

	// Another build: a copy of the binary.
	other := filepath.Join(t.TempDir(), "gantry-runtime")
	b, err := os.ReadFile(rt)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, b, 0o755); err != nil {
		t.Fatal(err)
	}
	opts := newOpts()
	want := "create server on " + sock + " is another build than " + other + ": its creates are not served; after an upgrade of that file the server stops by itself (or: systemctl restart gantry-runtime-server.service), otherwise it runs another file: make the unit's ExecStart " + other
	if c := judge(opts, other); !strings.Contains(c.Evidence, want) {
		t.Errorf("another build: %q, want %q", c.Evidence, want)
	}
	// Its own file unchanged, the server stays for its own callers.
	if c := judge(newOpts(), link); !strings.Contains(c.Evidence, "same build") {
		t.Errorf("after the ping of another copy: %q, want the server still serving its build", c.Evidence)
	}
	if !strings.Contains(out.String(), "another gantry-runtime file") {
		t.Errorf("the server's output does not say what it refused: %s", out)
	}
	// The next engine check of the same run reports the same answer.
	if c := judge(opts, other); !strings.Contains(c.Evidence, want) {
		t.Errorf("second engine check: %q, want %q", c.Evidence, want)
	}
	srv.Process.Signal(syscall.SIGTERM)
	if !gone(srv.Process.Pid) {
		t.Fatalf("the server did not stop on SIGTERM")
	}
	// A fresh run finds it gone.
	if c := judge(newOpts(), link); !strings.Contains(c.Evidence, "create server not running") {
		t.Errorf("after the server stopped: %q", c.Evidence)
	}

	// Something else listens on the socket.
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	if c := judge(newOpts(), link); !strings.Contains(c.Evidence, "not a create server's answer") || strings.Contains(c.Evidence, "same build") {
		t.Errorf("a foreign listener: %q", c.Evidence)
	}
}

// lockedBuffer is the server's output, written by exec's copying goroutine
// while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestHookCreateServerNote: when the hook on dockerd's PATH is Gantry's,
// its PASS line says what the create server is for it (the server does the
// hook's work for callers of its build), as the engine checks do.
func TestHookCreateServerNote(t *testing.T) {
	rt := realRuntime(t)
	h := newHost(t)
	dir := filepath.Join(h.dir, "hookbin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(rt, filepath.Join(dir, "nvidia-container-runtime-hook")); err != nil {
		t.Fatal(err)
	}
	h.write(t, filepath.Join(h.opts.Proc, "100/environ"), "PATH="+dir+"\x00")
	sock := filepath.Join(t.TempDir(), "runtime.sock")
	h.opts.RuntimeSocket = sock
	expect(t, Run(h.opts), CheckHook, Pass, []string{"create server not running (" + sock + " does not exist)"}, "")
	startCreateServer(t, rt, sock)
	expect(t, Run(h.opts), CheckHook, Pass, []string{"create server: same build, listening on " + sock}, "")
}
