//go:build cgo

package createserver

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The roles this test binary plays for TestPeerPidTaken (GANTRY_TEST_PEER).
const peerRoleEnv = "GANTRY_TEST_PEER"

// peerHelper runs a role: "hold" connects to $GANTRY_TEST_PEER_SOCK and
// stays; "pass" connects, starts a process that keeps the connection
// (sleep, given the socket) and exits; "idle" only stays. Each prints one
// line when ready.
func peerHelper(role string) {
	sock := os.Getenv("GANTRY_TEST_PEER_SOCK")
	switch role {
	case "hold", "pass":
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			fmt.Println("dial:", err)
			os.Exit(1)
		}
		if role == "hold" {
			fmt.Println("connected")
			time.Sleep(time.Minute)
			os.Exit(0)
		}
		f, err := c.File()
		if err != nil {
			fmt.Println("file:", err)
			os.Exit(1)
		}
		keeper := exec.Command("sleep", "60")
		keeper.ExtraFiles = []*os.File{f}
		if err := keeper.Start(); err != nil {
			fmt.Println("keeper:", err)
			os.Exit(1)
		}
		fmt.Println("keeper", keeper.Process.Pid)
		os.Exit(0)
	case "idle":
		fmt.Println("idle")
		time.Sleep(time.Minute)
	}
	os.Exit(0)
}

// startPeerHelper starts this binary in role with the socket, and returns
// it with its first line.
func startPeerHelper(t *testing.T, role, sock string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPeerPidTaken$")
	cmd.Env = append(os.Environ(), peerRoleEnv+"="+role, "GANTRY_TEST_PEER_SOCK="+sock)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	return cmd, strings.TrimSpace(line)
}

// TestPeerPidTaken: on a kernel without SO_PEERPIDFD (forced here:
// usePeerPidfd false) the server knows a caller by the pid SO_PEERCRED
// gives. The attack: a caller connects, hands its connection to another
// process and exits, and a root process (which the server would serve)
// takes its pid before the server looks. The server must refuse: the
// process at that pid does not hold the caller's end of the connection.
// A caller that stays is served. Run as pid 1 of a PID namespace of its
// own (unshare --pid), where the test chooses the next pid
// (ns_last_pid).
func TestPeerPidTaken(t *testing.T) {
	if role := os.Getenv(peerRoleEnv); role != "" {
		if role == "scenario" {
			peerScenario(t)
			return
		}
		peerHelper(role)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: a PID namespace and ns_last_pid")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare (util-linux)")
	}
	cmd := exec.Command("unshare", "--pid", "--fork", "--mount-proc", os.Args[0], "-test.run=^TestPeerPidTaken$", "-test.v")
	cmd.Env = append(os.Environ(), peerRoleEnv+"=scenario", "TMPDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("in a PID namespace of its own: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

func peerScenario(t *testing.T) {
	if os.Getpid() != 1 {
		t.Fatalf("not the init of a PID namespace (pid %d)", os.Getpid())
	}
	defer func(v bool) { usePeerPidfd = v }(usePeerPidfd)
	s, err := NewServer(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "runtime.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accept := func() *net.UnixConn {
		_ = l.SetDeadline(time.Now().Add(10 * time.Second))
		c, err := l.AcceptUnix()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// A caller that stays is served, by either path.
	for _, pidfd := range []bool{true, false} {
		usePeerPidfd = pidfd
		h, line := startPeerHelper(t, "hold", sock)
		if line != "connected" {
			t.Fatalf("helper: %q", line)
		}
		c := accept()
		pid, fd, ok := s.peer(c)
		if !ok || pid != h.Process.Pid {
			t.Errorf("SO_PEERPIDFD %v: a caller that stays: served %v as pid %d, want pid %d", pidfd, ok, pid, h.Process.Pid)
		}
		if ok {
			unix.Close(fd)
		}
		c.Close()
		h.Process.Kill()
		h.Wait()
	}

	usePeerPidfd = false
	for attempt := 0; ; attempt++ {
		if attempt == 20 {
			t.Fatal("no process took the caller's pid in 20 attempts")
		}
		h, line := startPeerHelper(t, "pass", sock)
		victim := h.Process.Pid
		h.Wait() // it exited; its pid is free again
		keeper, err := strconv.Atoi(strings.TrimPrefix(line, "keeper "))
		if err != nil {
			t.Fatalf("helper: %q", line)
		}
		// The next process gets the caller's pid.
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(victim-1)), 0); err != nil {
			t.Fatalf("ns_last_pid: %v", err)
		}
		taker, line := startPeerHelper(t, "idle", sock)
		c := accept()
		if taker.Process.Pid != victim || line != "idle" {
			// Another process (a thread of this one) got there first.
			c.Close()
			taker.Process.Kill()
			taker.Wait()
			syscall.Kill(keeper, syscall.SIGKILL)
			continue
		}
		pid, fd, ok := s.peer(c)
		t.Logf("attempt %d: caller pid %d exited, its connection kept by %d, pid taken by a root process: served %v (pid %d)", attempt, victim, keeper, ok, pid)
		if ok {
			unix.Close(fd)
			t.Errorf("the server took the process that took the exited caller's pid %d for the caller", victim)
		}
		c.Close()
		taker.Process.Kill()
		taker.Wait()
		syscall.Kill(keeper, syscall.SIGKILL)
		break
	}
}
