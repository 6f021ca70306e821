//go:build cgo

package shim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
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

// startServer runs `gantry-runtime --create-server` of runtime on a socket
// of its own until the test ends, and returns the socket and the server's
// process (its output in the returned buffer's file).
func startServer(t *testing.T, runtime string) (string, *exec.Cmd, string) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "runtime.sock")
	out := filepath.Join(dir, "server.out")
	w, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cmd := exec.Command(runtime, "--create-server", "--socket", sock)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			t.Errorf("the create server did not stop on SIGTERM")
		}
	})
	for i := 0; ; i++ {
		if st, err := os.Stat(sock); err == nil {
			if st.Mode().Perm() != 0o600 {
				t.Errorf("server socket mode %v, want 0600", st.Mode().Perm())
			}
			return sock, cmd, out
		}
		if i == 1200 {
			b, _ := os.ReadFile(out)
			t.Fatalf("the create server made no socket in 60s:\n%s", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logLines are the container's gantry.log records.
func logLines(t *testing.T, c *container) []map[string]any {
	t.Helper()
	f, err := os.Open(filepath.Join(filepath.Dir(c.config), "gantry.log"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var recs []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r map[string]any
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		recs = append(recs, r)
	}
	return recs
}

// servedBy reports whether the container's create was made by the create
// server (its log record says so), failing on anything but one record.
func servedBy(t *testing.T, c *container) bool {
	t.Helper()
	recs := logLines(t, c)
	if len(recs) != 1 {
		t.Fatalf("container %s: %d log records, want 1: %v", c.id, len(recs), recs)
	}
	return recs[0]["server"] == true
}

// TestCreateServer: a GPU container created through the create server runs
// (its probe finds libcuda.so.1 through the image's loader), and its
// config.json and root filesystem are what the in-process create makes.
func TestCreateServer(t *testing.T) {
	f := need(t)
	sock, _, _ := startServer(t, f.runtime)
	env := []string{"NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}
	args := []string{"sh", "-c", gpuScript}
	served := newContainer(t, opts{env: env, args: args})
	served.server = sock
	out, stderr, err := served.run()
	if err != nil {
		t.Fatalf("gantry-runtime run through the server: %v\n%s\n%s", err, out, stderr)
	}
	if want := fmt.Sprintf("cuda=%d path=%s/libcuda.so.1", f.driver.CUDAVersion, treeLibDir); !strings.Contains(out, want) {
		t.Errorf("probe in the container: want %q in\n%s", want, out)
	}
	if !servedBy(t, served) {
		t.Errorf("the create was not made by the server: %v", logLines(t, served))
	}
	local := newContainer(t, opts{env: env, args: args})
	if out2, stderr, err := local.run(); err != nil {
		t.Fatalf("gantry-runtime run in-process: %v\n%s\n%s", err, out2, stderr)
	} else if out2 != out {
		t.Errorf("container output differs:\nserver:\n%s\nin-process:\n%s", out, out2)
	}
	if servedBy(t, local) {
		t.Errorf("a create without the server's socket says it was served")
	}
	if a, b := sameBundle(served.configJSON(), served.bundle), sameBundle(local.configJSON(), local.bundle); a != b {
		t.Errorf("config.json differs:\nserver:\n%s\nin-process:\n%s", a, b)
	}
	for _, p := range []string{"etc/ld.so.cache", "usr/bin/nvidia-smi"} {
		x, err1 := os.Readlink(filepath.Join(served.rootfs, p))
		y, err2 := os.Readlink(filepath.Join(local.rootfs, p))
		if x != y || (err1 == nil) != (err2 == nil) {
			t.Errorf("%s: server %q (%v), in-process %q (%v)", p, x, err1, y, err2)
		}
		a, _ := os.ReadFile(filepath.Join(served.rootfs, p))
		b, _ := os.ReadFile(filepath.Join(local.rootfs, p))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between the server's create and the in-process one", p)
		}
	}
}

// sameBundle is config.json with its container's directory (the bundle,
// its driver trees) taken out.
func sameBundle(b []byte, bundle string) string {
	return strings.ReplaceAll(string(b), filepath.Dir(bundle), "DIR")
}

// TestCreateServerRefusalsInProcess: a request the server cannot serve
// goes to the in-process path, which refuses it with its usual one-line
// error, config.json untouched.
func TestCreateServerRefusalsInProcess(t *testing.T) {
	f := need(t)
	sock, _, _ := startServer(t, f.runtime)
	c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=99"}, args: []string{"true"}})
	c.server = sock
	before := c.configJSON()
	_, stderr, err := c.runtime("create", "--bundle", c.bundle, c.id)
	if err == nil {
		c.runtime("delete", "--force", c.id)
		t.Fatal("a container asking for GPU 99 of 8 was created")
	}
	if !strings.Contains(stderr, "99") || strings.Count(strings.TrimSpace(stderr), "\n") > 0 {
		t.Errorf("want one line naming 99, got:\n%s", stderr)
	}
	if string(c.configJSON()) != string(before) {
		t.Errorf("config.json changed by a refused create")
	}
	recs := logLines(t, c)
	if len(recs) != 1 || recs[0]["error"] == nil || recs[0]["server"] == true {
		t.Errorf("want one log record of the in-process refusal, got %v", recs)
	}
}

// TestCreateServerOtherBuild: a caller running another copy of
// gantry-runtime (another file) is not served and creates in-process; the
// server, its own file unchanged, goes on serving its own callers.
func TestCreateServerOtherBuild(t *testing.T) {
	f := need(t)
	sock, _, out := startServer(t, f.runtime)
	other := filepath.Join(t.TempDir(), "gantry-runtime")
	if err := copyFile(f.gantry, other, 0o755); err != nil {
		t.Fatal(err)
	}
	c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"true"}})
	c.server = sock
	cmd := exec.Command(other, "--root", c.state, "create", "--bundle", c.bundle, c.id)
	cmd.Env = append(os.Environ(), "GANTRY_CONFIG="+c.config, createproto.ServerSocketEnv+"="+sock)
	if b, err := outputToFile(t, cmd); err != nil {
		t.Fatalf("create through another copy: %v\n%s", err, b)
	}
	c.runtime("delete", "--force", c.id)
	if servedBy(t, c) {
		t.Errorf("the server served a caller running another file")
	}
	c2 := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"true"}})
	c2.server = sock
	if _, stderr, err := c2.runtime("create", "--bundle", c2.bundle, c2.id); err != nil {
		t.Fatalf("create of the server's build: %v\n%s", err, stderr)
	}
	c2.runtime("delete", "--force", c2.id)
	if !servedBy(t, c2) {
		t.Errorf("after a caller of another copy, the server no longer serves its own build")
	}
	if b, _ := os.ReadFile(out); !strings.Contains(string(b), "another gantry-runtime file") {
		t.Errorf("the server's output does not say what it refused:\n%s", b)
	}
}

// TestCreateServerUpgrade: when the server's own file is replaced (an
// upgrade) and a caller runs the new file, the caller creates in-process
// and the server stops, making way for a server of the new build.
func TestCreateServerUpgrade(t *testing.T) {
	f := need(t)
	bin := filepath.Join(t.TempDir(), "gantry-runtime")
	if err := copyFile(f.gantry, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	sock, srv, out := startServer(t, bin)
	// The upgrade: a new file renamed over the server's.
	next := bin + ".new"
	if err := copyFile(f.gantry, next, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, bin); err != nil {
		t.Fatal(err)
	}
	c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"true"}})
	cmd := exec.Command(bin, "--root", c.state, "create", "--bundle", c.bundle, c.id)
	cmd.Env = append(os.Environ(), "GANTRY_CONFIG="+c.config, createproto.ServerSocketEnv+"="+sock)
	if b, err := outputToFile(t, cmd); err != nil {
		t.Fatalf("create through the new build: %v\n%s", err, b)
	}
	c.runtime("delete", "--force", c.id)
	if servedBy(t, c) {
		t.Errorf("the server served a caller of the new build")
	}
	if !exited(srv.Process.Pid) {
		t.Fatalf("the server still runs after its file was replaced and a caller of the new build came")
	}
	if b, _ := os.ReadFile(out); !strings.Contains(string(b), "file was replaced") {
		t.Errorf("the server's output does not say why it stopped:\n%s", b)
	}
}

// TestCreateServerRefusesOthers: a caller that is not root is not served
// even when it can reach the socket (made world-writable here, as a
// misconfiguration would), and neither is a root caller in another mount
// namespace: both create in-process.
func TestCreateServerRefusesOthers(t *testing.T) {
	f := need(t)
	sock, _, _ := startServer(t, f.runtime)
	// Reachable by anyone: the socket and the directories above it.
	for _, p := range []string{sock, filepath.Dir(sock), filepath.Dir(filepath.Dir(sock))} {
		if err := os.Chmod(p, 0o777); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("other mount namespace", func(t *testing.T) {
		if _, err := exec.LookPath("unshare"); err != nil {
			t.Skip("no unshare")
		}
		c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"true"}})
		cmd := exec.Command("unshare", "-m", "--propagation", "private", f.runtime, "--root", c.state, "create", "--bundle", c.bundle, c.id)
		cmd.Env = append(os.Environ(), "GANTRY_CONFIG="+c.config, createproto.ServerSocketEnv+"="+sock)
		if b, err := outputToFile(t, cmd); err != nil {
			t.Fatalf("create in another mount namespace: %v\n%s", err, b)
		}
		c.runtime("delete", "--force", c.id)
		if servedBy(t, c) {
			t.Errorf("the server served a caller in another mount namespace")
		}
	})

	t.Run("not root", func(t *testing.T) {
		// A bundle the unprivileged caller can read and write: the
		// in-process create then succeeds, as far as runc's part.
		dir, err := os.MkdirTemp("", "gantry-server-nobody-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"true"}})
		bundle := filepath.Join(dir, "bundle")
		if err := run("cp", "-a", c.bundle, bundle); err != nil {
			t.Fatal(err)
		}
		if err := run("chown", "-R", "65534:65534", dir); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// The configuration the server would serve it with: the
		// fixture's driver and GPUs, a log the server (root) can write.
		cfg := filepath.Join(dir, "gantry.toml")
		logFile := filepath.Join(dir, "gantry.log")
		conf := fmt.Sprintf("gpus = \"sim:h100x8\"\ndriver-root = %q\n[runtime]\nlow-level = \"/bin/true\"\ncache-dir = %q\nlog-file = %q\n",
			f.driver.Root, filepath.Join(dir, "cache"), logFile)
		if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		// The same executable (a hard link: the server's own build),
		// where the unprivileged caller can run it.
		self := filepath.Join(dir, "gantry-runtime")
		if err := os.Link(f.gantry, self); err != nil {
			t.Skipf("cannot hard-link %s into %s: %v", f.gantry, dir, err)
		}
		cmd := exec.Command(self, "create", "--bundle", bundle, c.id)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "GANTRY_CONFIG=" + cfg, createproto.ServerSocketEnv + "=" + sock}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		b, _ := outputToFile(t, cmd)
		if rb, _ := os.ReadFile(logFile); bytes.Contains(rb, []byte(`"server":true`)) {
			t.Errorf("the server served an unprivileged caller: %s\n%s", rb, b)
		}
	})
}

// outputToFile runs cmd with its output in a file, not a pipe: after
// "create" the container's init holds its stdio until "start".
func outputToFile(t *testing.T, cmd *exec.Cmd) ([]byte, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "out")
	w, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Run()
	b, _ := os.ReadFile(p)
	return b, err
}

// TestCreateServerChecksCallerFile: a caller that claims the server's
// identity but runs another program (this test) is not served, and the
// bundle stays as it was.
func TestCreateServerChecksCallerFile(t *testing.T) {
	f := need(t)
	sock, _, _ := startServer(t, f.runtime)
	c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"true"}})
	before := c.configJSON()
	claimed, err := createproto.ExeIdentity(f.gantry)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.Open(c.bundle)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msg := strings.Join([]string{createproto.ServerProtocol, claimed, c.config, "1", c.bundle, c.id, "0", ""}, "\x00")
	if _, _, err := conn.WriteMsgUnix([]byte(msg), unix.UnixRights(int(dir.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	answer := make([]byte, 2)
	if _, err := io.ReadFull(conn, answer); err != nil {
		t.Fatal(err)
	}
	if answer[0] != createproto.ServerAccepted || answer[1] != 'N' {
		t.Errorf("answer %q to a caller running another program under the server's identity, want N", answer)
	}
	if string(c.configJSON()) != string(before) {
		t.Errorf("the server changed config.json for a caller running another program")
	}
}

// TestModifyLocksBundle: a create waits while another modify of the same
// bundle holds it (the create server's, when the constructor gave up
// waiting), then finds its work done instead of redoing it.
func TestModifyLocksBundle(t *testing.T) {
	c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"true"}})
	before := c.configJSON()
	lock, err := unix.Open(c.bundle, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(lock, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, stderr, err := c.runtime("create", "--bundle", c.bundle, c.id)
		if err != nil {
			err = fmt.Errorf("%v: %s", err, stderr)
		}
		done <- err
	}()
	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the create did not wait for the bundle's lock (%v)", err)
	default:
	}
	if string(c.configJSON()) != string(before) {
		t.Errorf("config.json changed while another modify held the bundle")
	}
	unix.Close(lock)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.runtime("delete", "--force", c.id)
	if string(c.configJSON()) == string(before) {
		t.Errorf("the create did not inject anything once the lock was free")
	}
}

// stuckListener is a socket at a new path that listens but never accepts:
// with full, its backlog is full too (connects nobody accepts), so that a
// connect blocks; without, a connect is queued at once and then nothing
// answers.
func stuckListener(t *testing.T, full bool) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "stuck.sock")
	l, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(l) })
	if err := unix.Bind(l, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	backlog := 64
	if full {
		backlog = 0
	}
	if err := unix.Listen(l, backlog); err != nil {
		t.Fatal(err)
	}
	if !full {
		return sock
	}
	for i := 0; ; i++ {
		c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(c) })
		if err := unix.Connect(c, &unix.SockaddrUnix{Name: sock}); err != nil {
			if !errors.Is(err, unix.EAGAIN) {
				t.Fatalf("filling the backlog: %v", err)
			}
			return sock
		}
		if i == 64 {
			t.Fatal("the backlog of 0 took 64 connections")
		}
	}
}

// TestServerNotTaking: a create server's socket where nothing takes the
// connection (a stopped or frozen server: a listener that never accepts,
// with room in its backlog or with the backlog full) costs a GPU create and
// Docker's --gpus hook well under a second (createproto.ServerConnectTimeout,
// createproto.ServerAckTimeout) before the work runs in-process, and the create
// succeeds. Before the acceptance byte, a create waited 15 s (5 s with a
// full backlog). The bound asserted is generous: 5 s of the create's
// start-up (its log record's startup_ms: the constructor's time before Go
// ran) and of the hook's whole run. Once per low-level runtime.
func TestServerNotTaking(t *testing.T) {
	eachRuntime(t, serverNotTaking)
}

func serverNotTaking(t *testing.T) {
	f := need(t)
	for _, full := range []bool{false, true} {
		name := "never accepts"
		if full {
			name = "backlog full"
		}
		t.Run(name, func(t *testing.T) {
			sock := stuckListener(t, full)
			c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"probe"}})
			c.server = sock
			start := time.Now()
			out, stderr, err := c.run()
			wall := time.Since(start)
			if err != nil || !strings.Contains(out, "cuda=") {
				t.Fatalf("the GPU container did not run in-process: %v\n%s\n%s", err, out, stderr)
			}
			recs := logLines(t, c)
			if len(recs) != 1 || recs[0]["server"] == true {
				t.Fatalf("want one in-process record, got %v", recs)
			}
			startup, _ := recs[0]["startup_ms"].(float64)
			t.Logf("create start-up %.0f ms (run %v)", startup, wall.Round(time.Millisecond))
			if startup <= 0 || startup > 5000 {
				t.Errorf("the create waited %.0f ms for a server that takes no connection, want well under a second (asserted: 5 s)", startup)
			}

			// The --gpus hook: its in-process run (here it fails on the
			// state's bundle, after the wait) within the same bound.
			cmd := exec.Command(hookBin(t, f), "prestart")
			cmd.Stdin = strings.NewReader(`{"ociVersion":"1.0.2","id":"stuck","status":"creating","pid":1,"bundle":"/nonexistent-bundle"}`)
			cmd.Env = []string{"GANTRY_CONFIG=/dev/null", createproto.ServerSocketEnv + "=" + sock}
			start = time.Now()
			hout, _ := cmd.CombinedOutput()
			wall = time.Since(start)
			if !strings.Contains(string(hout), "/nonexistent-bundle") {
				t.Errorf("want the in-process hook's error about the bundle, got:\n%s", hout)
			}
			t.Logf("hook %v", wall.Round(time.Millisecond))
			if wall > 5*time.Second {
				t.Errorf("the hook took %v with a server that takes no connection, want well under a second (asserted: 5 s)", wall)
			}
		})
	}
}
