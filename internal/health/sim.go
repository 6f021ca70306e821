package health

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// NewSim returns the Source for simulated GPUs. Run listens on a unix stream
// socket at path (created mode 0600, removed when Run returns) for fault
// injections, one command a line:
//
//	xid GPU-UUID 79     an XID error (ignored if p ignores it)
//	ecc GPU-UUID dbe    a double-bit ECC error (sbe: single-bit, ignored)
//	reset GPU-UUID      the device was reset: healthy again at once
//
// UUIDs are those given to Run (the simulated profile's GPU or MIG UUIDs; see
// `gantry sim` and internal/gpu/sim). Each line is answered "ok" or
// "error: <why>". InjectSim sends one command; from a shell,
//
//	echo "xid GPU-... 79" | socat - UNIX-CONNECT:/run/gantry/sim-health.sock
//
// does the same.
func NewSim(path string, p Policy) Source {
	return &simSource{path: path, p: p, clk: realClock{}, log: p.logger()}
}

type simSource struct {
	path string
	p    Policy
	clk  clock
	log  *slog.Logger
}

func (s *simSource) Run(ctx context.Context, uuids []string, out chan<- Event) error {
	ln, err := listenUnix(s.path)
	if err != nil {
		return err
	}
	defer os.Remove(s.path)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopListening := context.AfterFunc(ctx, func() { ln.Close() })
	defer stopListening()

	in := make(chan request)
	var wg sync.WaitGroup
	wg.Go(func() { watch(ctx, s.clk, newTracker(s.p, uuids, nil, s.log), in, out) })
	s.log.Info("simulated GPU health: accepting fault injections", "socket", s.path, "devices", len(uuids))

	var runErr error
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				runErr = fmt.Errorf("simulated GPU health socket %s: %w", s.path, err)
			}
			break
		}
		wg.Go(func() { s.serve(ctx, conn, in) })
	}
	cancel()
	wg.Wait()
	return runErr
}

// serve answers one connection's commands until it closes or ctx is done.
func (s *simSource) serve(ctx context.Context, conn net.Conn, in chan<- request) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		err := s.apply(ctx, sc.Text(), in)
		answer := "ok\n"
		if err != nil {
			answer = "error: " + strings.ReplaceAll(err.Error(), "\n", " ") + "\n"
		}
		if _, err := io.WriteString(conn, answer); err != nil {
			return
		}
	}
}

// apply parses one command line and hands it to the watch loop.
func (s *simSource) apply(ctx context.Context, line string, in chan<- request) error {
	o, ok, err := parseCommand(line)
	if err != nil || !ok {
		return err
	}
	reply := make(chan error, 1)
	select {
	case in <- request{obs: o, reply: reply}:
	case <-ctx.Done():
		return errors.New("the health watcher is stopping")
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return errors.New("the health watcher is stopping")
	}
}

// parseCommand reads one injection line; ok is false for a blank line or a
// # comment.
func parseCommand(line string) (o observation, ok bool, err error) {
	f := strings.Fields(line)
	if len(f) == 0 || strings.HasPrefix(f[0], "#") {
		return observation{}, false, nil
	}
	usage := func(why string) error {
		return fmt.Errorf("%q: %s; use \"xid UUID N\", \"ecc UUID dbe|sbe\" or \"reset UUID\"", line, why)
	}
	want := map[string]int{"xid": 3, "ecc": 3, "reset": 2}
	n, known := want[strings.ToLower(f[0])]
	if !known {
		return observation{}, false, usage(fmt.Sprintf("unknown command %q", f[0]))
	}
	if len(f) != n {
		return observation{}, false, usage(fmt.Sprintf("%s takes %d argument(s)", f[0], n-1))
	}
	o.uuid = f[1]
	switch strings.ToLower(f[0]) {
	case "xid":
		x, err := strconv.ParseUint(f[2], 10, 64)
		if err != nil || x == 0 {
			return observation{}, false, usage(fmt.Sprintf("%q is not an XID number", f[2]))
		}
		o.kind, o.xid = kindXID, x
	case "ecc":
		switch strings.ToLower(f[2]) {
		case "dbe":
			o.kind = kindDBE
		case "sbe":
			o.kind = kindSBE
		default:
			return observation{}, false, usage(fmt.Sprintf("ECC error type %q is neither dbe nor sbe", f[2]))
		}
	case "reset":
		o.kind = kindReset
	}
	return o, true, nil
}

// maxSocketPath is the longest path a unix socket address holds on Linux.
const maxSocketPath = 107

// listenUnix listens at path, replacing a stale socket left by a process
// that died, but never another kind of file or a live socket.
func listenUnix(path string) (net.Listener, error) {
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("health socket path %s is %d bytes, longer than the %d a unix socket allows; choose a shorter path", path, len(path), maxSocketPath)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("health socket path %s exists and is not a socket; remove it or choose another path", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("health socket %s is in use by another process; stop it or choose another path", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing the stale health socket %s: %w", path, err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("health socket: %w; check that the directory exists and is writable", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("health socket %s: %w", path, err)
	}
	return ln, nil
}

// InjectSim sends one command line (see NewSim) to the simulated health
// socket at path and returns the source's verdict: nil once the command has
// been applied, or why it was refused.
func InjectSim(path, line string) error {
	if strings.ContainsAny(line, "\r\n") {
		return fmt.Errorf("injecting %q: one command per call, without newlines", line)
	}
	conn, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return fmt.Errorf("injecting %q: %w; is the device plugin running with simulated GPUs?", line, err)
	}
	defer conn.Close()
	// A generous bound so that a wedged server cannot hang the caller.
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, line+"\n"); err != nil {
		return fmt.Errorf("injecting %q into %s: %w", line, path, err)
	}
	answer, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("injecting %q into %s: reading the answer: %w", line, path, err)
	}
	answer = strings.TrimSpace(answer)
	if answer == "ok" {
		return nil
	}
	return fmt.Errorf("injecting into %s: %s", path, strings.TrimPrefix(answer, "error: "))
}
