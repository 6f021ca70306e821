package doctor

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/createproto"
)

// hungListenerEnv makes this test binary a process that listens on the
// socket it names and never accepts: a create server's socket held by
// something that does not answer.
const hungListenerEnv = "GANTRY_DOCTOR_TEST_HUNG_LISTENER"

func init() {
	if sock, ok := os.LookupEnv(hungListenerEnv); ok {
		l, err := net.Listen("unix", sock)
		if err != nil {
			fmt.Println(err)
			os.Exit(2)
		}
		fmt.Println("listening")
		time.Sleep(time.Hour)
		l.Close()
		os.Exit(0)
	}
}

// startHungListener starts the listener in a process of its own and
// returns it once it listens.
func startHungListener(t *testing.T, sock string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = []string{hungListenerEnv + "=" + sock}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "listening\n" {
		t.Fatalf("the listener: %q", line)
	}
	return cmd
}

// The create server's socket held by a root process that listens and
// never answers: each GPU create waits the C start's answer bound. FAIL
// naming that cost and the process (pid and command, found through
// /proc/net/unix and /proc/PID/fd), not a PASS or a note. The printed fix
// (kill PID, rm SOCKET) is then run, and the socket no longer costs
// anything.
func TestCreateServerSocketHeld(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("gantry-runtime believes root's create server only: the listener must be root's")
	}
	h := newHost(t)
	sock := filepath.Join(t.TempDir(), "runtime.sock")
	h.opts.RuntimeSocket = sock
	listener := startHungListener(t, sock)

	start := time.Now()
	checks := Run(h.opts)
	took := time.Since(start)
	cost := (createproto.ServerConnectTimeout + createproto.ServerAckTimeout).String()
	c := expect(t, checks, CheckCreateServer, Fail, []string{sock, "does not answer", "waits " + cost}, "rm "+sock)
	// The engine check that pinged first says so, and did not wait again.
	expect(t, checks, CheckDocker, Pass, []string{"does not answer", CheckCreateServer}, "")
	if took > 4*createproto.PingTimeout {
		t.Errorf("doctor took %v: the socket was waited on more than once", took)
	}
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)

	// The holder, found through the real /proc.
	h.opts.Proc = "/proc"
	c = find(t, newEnv(withDefaults(h.opts)).run(only(CheckCreateServer)), CheckCreateServer)
	pid := strconv.Itoa(listener.Process.Pid)
	if c.Status != Fail || !strings.Contains(c.Evidence, "pid "+pid+" (") || !strings.Contains(c.Fix, "kill "+pid) || !strings.Contains(c.Fix, "rm "+sock) {
		t.Fatalf("the holder is not named: %+v", c)
	}
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)

	// The fix works: run it as printed.
	for _, cmd := range []string{"kill " + pid, "rm " + sock} {
		sh := exec.Command("/bin/sh", "-c", cmd)
		sh.Env = []string{"PATH=/usr/bin:/bin"}
		if out, err := sh.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
	}
	listener.Wait()
	start = time.Now()
	c = find(t, newEnv(withDefaults(h.opts)).run(only(CheckCreateServer)), CheckCreateServer)
	if c.Status != Info || !strings.Contains(c.Evidence, "does not exist") {
		t.Fatalf("after the fix: %+v", c)
	}
	if st, err := createproto.PingServer(sock, "/proc/self/exe"); st != createproto.ServerAbsent {
		t.Errorf("after the fix a create still finds something there: %v %v", st, err)
	}
	if d := time.Since(start); d > createproto.PingTimeout {
		t.Errorf("after the fix the check took %v", d)
	}
}

// A stale socket (nobody listens) and no socket cost nothing: INFO.
func TestCreateServerSocketAbsent(t *testing.T) {
	dir := t.TempDir()
	opts := withDefaults(Options{RuntimeSocket: filepath.Join(dir, "none.sock"), Proc: "/proc"})
	if c := checkCreateServer(opts); c.Status != Info || !strings.Contains(c.Evidence, "does not exist") {
		t.Errorf("no socket: %+v", c)
	}
	sock := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	opts = withDefaults(Options{RuntimeSocket: sock, Proc: "/proc"})
	if c := checkCreateServer(opts); c.Status != Info || !strings.Contains(c.Evidence, "stale") {
		t.Errorf("stale socket: %+v", c)
	}
}

func withDefaults(o Options) Options {
	o.serverProbes = nil
	o.defaults()
	return o
}
