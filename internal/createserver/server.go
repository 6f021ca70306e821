package createserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/containerhook"
	"github.com/gantry-gpu/gantry/internal/createproto"
	"github.com/gantry-gpu/gantry/internal/hook"
	"github.com/gantry-gpu/gantry/internal/inject"
	"github.com/gantry-gpu/gantry/internal/lowlevel"
	"github.com/gantry-gpu/gantry/internal/shim"
	"github.com/gantry-gpu/gantry/internal/unixsock"
)

// Server answers the constructor's requests on one listener.
type Server struct {
	exe   string
	self  procFacts // this server's own, which each caller must match
	uid   int
	log   io.Writer
	mu    sync.Mutex
	cfgs  map[string]cachedConfig
	stale sync.Once
	other sync.Once
	l     *net.UnixListener
	// refusals are the reasons callers were sent in-process, each
	// logged once.
	refusals map[string]bool
}

type cachedConfig struct {
	stamp string
	cfg   config.Config
	err   error
}

// NewServer makes a server for this executable.
func NewServer(log io.Writer) (*Server, error) {
	exe, err := createproto.ExeIdentity("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("reading this program's identity: %w", err)
	}
	self, err := readProcFacts("/proc/self")
	if err != nil {
		return nil, fmt.Errorf("reading this program's namespaces and capabilities: %w", err)
	}
	return &Server{exe: exe, self: self, uid: os.Geteuid(), log: log, cfgs: map[string]cachedConfig{}, refusals: map[string]bool{}}, nil
}

// Serve accepts requests on l until l is closed, or until a caller runs
// another build of gantry-runtime (an upgrade): the server then stops
// accepting, so that an init system can start the new build, and returns
// once the requests in flight are done.
func (s *Server) Serve(l *net.UnixListener) error {
	s.l = l
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.handle(c)
		}()
	}
}

func (s *Server) handle(c *net.UnixConn) {
	defer c.Close()
	// Taken: the caller now waits for the work (ServerAnswerTimeout),
	// no longer for a server that may not be there (ServerAckTimeout).
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte{createproto.ServerAccepted}); err != nil {
		return
	}
	answer := byte(createproto.AnswerSelf)
	var extra string // a ping's answer: this server's identity after it
	defer func() { _, _ = c.Write(append([]byte{answer}, extra...)) }()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	pid, pidfd, ok := s.peer(c)
	if !ok {
		return
	}
	defer unix.Close(pidfd)
	// The caller's /proc files name the caller only while it lives (a
	// pid is reused after it dies): the answer stands only if it is
	// still alive once everything that read them is done.
	defer func() {
		if answer == createproto.AnswerDone && unix.PidfdSendSignal(pidfd, 0, nil, 0) != nil {
			answer = createproto.AnswerSelf
		}
	}()
	buf := make([]byte, createproto.MaxRequest+createproto.MaxHookState)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return
	}
	// A stream socket may deliver a long request (a long configuration
	// path, a large state) in parts: read on until it is whole.
	for n < len(buf) && !createproto.Whole(buf[:n]) {
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			break
		}
	}
	fd := -1
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if fds, err := unix.ParseUnixRights(&m); err == nil {
				for _, f := range fds {
					if fd < 0 {
						fd = f
					} else {
						unix.Close(f)
					}
				}
			}
		}
	}
	if createproto.IsHook(buf[:n]) {
		if fd >= 0 {
			unix.Close(fd)
		} else if s.hook(pid, pidfd, buf[:n]) {
			answer = createproto.AnswerDone
		}
		return
	}
	if fd < 0 {
		// Without a bundle directory only a ping is answered, with
		// this server's identity, which tells the pinger that it was
		// served (a bare 'N' is all an unserved caller ever gets).
		if p, err := createproto.DecodePing(buf[:n]); err == nil {
			answer, extra = s.sameBuild(p.Exe), s.exe
		}
		return
	}
	dir := os.NewFile(uintptr(fd), "bundle")
	defer dir.Close()
	req, err := createproto.DecodeCreate(buf[:n])
	if err == nil && req.IsPing() {
		err = errors.New("malformed " + createproto.ServerProtocol + " request")
	}
	if err != nil {
		fmt.Fprintf(s.log, "gantry-runtime create server: %v\n", err)
		return
	}
	if !s.runsThis(pid, req.Exe) {
		return
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return
	}
	cfg, err := s.config(req.ConfigPath, req.Explicit)
	if err != nil {
		// The in-process path reports a bad configuration itself.
		return
	}
	bundle := "/proc/self/fd/" + strconv.Itoa(fd)
	logged := req.Bundle
	if p, err := os.Readlink(bundle); err == nil {
		logged = p
	}
	rec := inject.NewRecord(inject.FrontEndRuntime, req.Container, logged)
	rec.Server = true
	rec.StartupMS = sinceNS(req.StartNS)
	if err := shim.ModifyFor(rec, bundle, cfg, fmt.Sprintf("/proc/%d/root", pid)); err != nil {
		// Refusals and failures go back to the in-process path, which
		// meets the same error and reports it as always (and logs it).
		return
	}
	rec.Log(cfg, nil)
	answer = createproto.AnswerDone
}

// hook runs a prestart hook's request from pid (checked by peer): true
// when done, false to have the caller do it in-process (which then meets
// any error again and reports it). Besides the create's checks (the
// caller runs this very file), the caller must see the server's root
// directory as its own: the state's bundle and root.path are host paths as
// the caller resolves them, and package hook's checks compare the
// container's root with them.
func (s *Server) hook(pid, pidfd int, b []byte) bool {
	req, err := createproto.DecodeHook(b)
	if err != nil {
		fmt.Fprintf(s.log, "gantry-runtime create server: %v\n", err)
		return false
	}
	if !s.runsThis(pid, req.Exe) {
		return false
	}
	proc := "/proc/" + strconv.Itoa(pid)
	var theirs, ours unix.Stat_t
	if unix.Stat(proc+"/root", &theirs) != nil || unix.Stat("/", &ours) != nil || theirs.Dev != ours.Dev || theirs.Ino != ours.Ino {
		s.refused("hook's root directory is not the server's")
		return false
	}
	cfg, err := s.config(req.ConfigPath, req.Explicit)
	if err != nil {
		return false
	}
	rec := inject.NewRecord(inject.FrontEndHook, "", "")
	rec.Server = true
	rec.StartupMS = sinceNS(req.StartNS)
	caller := hook.Caller{PID: pid, Alive: func() error {
		if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
			return fmt.Errorf("exited while the create server worked for it: %w", err)
		}
		return nil
	}}
	st, err := containerhook.ParseState(req.State)
	if err != nil {
		return false
	}
	if err := hook.Prestart(st, cfg, caller, cfg.Runtime.NoCgroups, rec); err != nil {
		return false
	}
	rec.Log(cfg, nil)
	return true
}

// sinceNS is the time since the caller's constructor started (a
// CLOCK_MONOTONIC reading), in ms; 0 when unknown.
func sinceNS(start int64) float64 {
	var ts unix.Timespec
	if start <= 0 || unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
		return 0
	}
	return float64(ts.Nano()-start) / 1e6
}

// runsThis reports whether the caller pid runs this very executable: the
// identity it sent (exe) says so (sameBuild, which also makes way for a
// new build), and the file its process runs is that file, whatever it
// claims.
func (s *Server) runsThis(pid int, exe string) bool {
	if s.sameBuild(exe) != createproto.AnswerDone {
		return false
	}
	if id, err := createproto.ExeIdentity("/proc/" + strconv.Itoa(pid) + "/exe"); err != nil || id != s.exe {
		s.refused("caller runs another file than the identity it sent")
		return false
	}
	return true
}

// sameBuild answers AnswerDone when a caller of identity exe runs this very
// executable. Otherwise the caller decides for itself; and when this
// server's own file was replaced (an upgrade: the caller runs the new
// build), the server makes way for one of that build. A caller that runs
// another copy while this server's file is unchanged (an engine
// configured with another path) does not stop it: its own callers keep
// being served.
func (s *Server) sameBuild(exe string) byte {
	if exe == s.exe {
		return createproto.AnswerDone
	}
	if s.ownFileReplaced() {
		s.stale.Do(func() {
			fmt.Fprintf(s.log, "gantry-runtime create server: callers run another gantry-runtime (%s) and this server's file was replaced (it is %s): stopping\n", exe, s.exe)
			_ = s.l.Close()
		})
	} else {
		s.other.Do(func() {
			fmt.Fprintf(s.log, "gantry-runtime create server: a caller runs another gantry-runtime file (%s, this server is %s, its file unchanged): not served, staying\n", exe, s.exe)
		})
	}
	return createproto.AnswerSelf
}

// ownFileReplaced reports whether the file this server was started from
// is gone or is another file now.
func (s *Server) ownFileReplaced() bool {
	p, err := os.Readlink("/proc/self/exe")
	if err != nil || strings.HasSuffix(p, " (deleted)") {
		return true
	}
	id, err := createproto.ExeIdentity(p)
	return err != nil || id != s.exe
}

// peer is the caller's PID when the caller may be served, and a pidfd
// that holds the caller's process (SO_PEERPIDFD, Linux 6.5, else
// pidfd_open right after the credentials were read), for the checks that
// the pid still names the caller (alive). A caller may be served only when
// it could do the work itself: root (the server's own user), in the
// server's namespaces (mount: its paths are the server's; cgroup, pid,
// user: the container's cgroup, pid and user namespace read alike), with
// at least the server's effective capabilities, no seccomp filter, and the
// server's LSM label (or AppArmor's "unconfined"). A root process stripped
// of its capabilities, or sandboxed, gets no more done through the server
// than it could do in-process.
//
// Without SO_PEERPIDFD (Linux before 6.5: Debian 12, RHEL 9, Ubuntu 22.04)
// the pid SO_PEERCRED gives may be another process's by the time it is
// opened: the caller exited and its pid was taken. There the process
// opened must hold the caller's end of this very connection (its
// /proc/PID/fd links to the peer socket's inode, which sock_diag names), or
// no one is served.
func (s *Server) peer(c *net.UnixConn) (int, int, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, -1, false
	}
	var cred *unix.Ucred
	var cerr error
	pidfd := -1
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if !usePeerPidfd {
			return
		}
		if p, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
			pidfd = p
		}
	}); err != nil || cerr != nil || cred == nil {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		return 0, -1, false
	}
	byPid := false
	if pidfd < 0 && cred.Pid > 0 {
		if p, err := unix.PidfdOpen(int(cred.Pid), 0); err == nil {
			pidfd, byPid = p, true
		}
	}
	why := ""
	switch {
	case pidfd < 0 || cred.Pid <= 0:
		why = "no process to hold"
	case int(cred.Uid) != s.uid:
		why = "not root"
	case byPid && !holdsPeer(raw, int(cred.Pid)):
		why = "whose pid is held by a process without its end of the connection (it exited and its pid was taken?)"
	default:
		facts, err := readProcFacts("/proc/" + strconv.Itoa(int(cred.Pid)))
		if err != nil {
			// No pid in the reason: it is logged once per reason.
			why = "whose /proc files could not be read (it exited?)"
		} else {
			why = s.self.refuse(facts)
		}
	}
	if why == "" && unix.PidfdSendSignal(pidfd, 0, nil, 0) != nil {
		why = "exited"
	}
	if why != "" {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		s.refused("caller " + why)
		return 0, -1, false
	}
	return int(cred.Pid), pidfd, true
}

// usePeerPidfd is false only in tests, which take the path of kernels
// without SO_PEERPIDFD on any kernel.
var usePeerPidfd = true

// holdsPeer reports whether process pid holds the other end of the
// connection raw: a caller known by its pid alone (no SO_PEERPIDFD) is that
// process only if so.
func holdsPeer(raw syscall.RawConn, pid int) bool {
	var ino uint64
	var err error
	if cerr := raw.Control(func(fd uintptr) { ino, err = unixsock.PeerInode(int(fd)) }); cerr != nil || err != nil {
		return false
	}
	ok, err := unixsock.HoldsSocket("/proc/"+strconv.Itoa(pid), ino)
	return ok && err == nil
}

// refused logs why a caller was sent in-process, once per reason: a host
// where every create runs in-process can be told why from the server's log.
func (s *Server) refused(why string) {
	s.mu.Lock()
	seen := s.refusals[why]
	s.refusals[why] = true
	s.mu.Unlock()
	if !seen {
		fmt.Fprintf(s.log, "gantry-runtime create server: not served, in-process instead (logged once): %s\n", why)
	}
}

// procFacts are what a process may do, as far as the server compares it
// with its callers.
type procFacts struct {
	ns      [4]string // mnt, cgroup, pid, user
	capEff  uint64
	seccomp string
	label   string
}

var factNamespaces = [4]string{"mnt", "cgroup", "pid", "user"}

func readProcFacts(proc string) (procFacts, error) {
	var f procFacts
	for i, n := range factNamespaces {
		l, err := os.Readlink(proc + "/ns/" + n)
		if err != nil {
			return f, fmt.Errorf("reading %s/ns/%s: %w", proc, n, err)
		}
		f.ns[i] = l
	}
	b, err := os.ReadFile(proc + "/status")
	if err != nil {
		return f, err
	}
	caps := false
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "CapEff":
			if f.capEff, err = strconv.ParseUint(v, 16, 64); err != nil {
				return f, fmt.Errorf("%s/status: CapEff %q", proc, v)
			}
			caps = true
		case "Seccomp":
			f.seccomp = v
		}
	}
	if !caps {
		return f, fmt.Errorf("%s/status has no CapEff", proc)
	}
	// No LSM (no attr/current, or an empty one) reads as "".
	if l, err := os.ReadFile(proc + "/attr/current"); err == nil {
		f.label = strings.TrimRight(string(l), "\x00\n")
	}
	return f, nil
}

// unconfined reports whether an LSM label confines nothing: AppArmor's
// "unconfined", or a profile in unconfined mode ("runc (unconfined)", as
// Ubuntu 24.04 ships runc's).
func unconfined(label string) bool {
	return label == "unconfined" || strings.HasSuffix(label, " (unconfined)")
}

// refuse says why a caller with facts c may not be served by a server
// with s's, "" when it may.
func (s procFacts) refuse(c procFacts) string {
	for i, n := range factNamespaces {
		if c.ns[i] != s.ns[i] {
			return "in another " + n + " namespace than the server's"
		}
	}
	if c.capEff&s.capEff != s.capEff {
		return fmt.Sprintf("without some of the server's capabilities (CapEff %016x, the server's %016x)", c.capEff, s.capEff)
	}
	if c.seccomp != "" && c.seccomp != "0" {
		return "under a seccomp filter (Seccomp " + c.seccomp + ")"
	}
	if c.label != s.label && !unconfined(c.label) {
		return fmt.Sprintf("under another LSM label (%q, the server's %q)", c.label, s.label)
	}
	return ""
}

// config loads the configuration at path, again only when the file
// changed.
func (s *Server) config(path string, explicit bool) (config.Config, error) {
	if path == "" {
		path, explicit = config.DefaultPath, false
	}
	stamp := ""
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		stamp = fmt.Sprintf("%d:%d:%d:%d.%d:%d.%d", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	}
	key := path + "\x00" + strconv.FormatBool(explicit)
	s.mu.Lock()
	c, ok := s.cfgs[key]
	s.mu.Unlock()
	if ok && stamp != "" && c.stamp == stamp {
		return c.cfg, c.err
	}
	cfg, err := config.LoadFile(path, explicit)
	s.mu.Lock()
	s.cfgs[key] = cachedConfig{stamp: stamp, cfg: cfg, err: err}
	s.mu.Unlock()
	return cfg, err
}

const serverUsage = `usage: gantry-runtime --create-server [--socket PATH]

Serves the GPU changes of container creates for gantry-runtime, so that a
GPU container's create does not start a Go program: gantry-runtime's C start
sends the bundle to this server and runs the low-level runtime when it is
done. Without a server, or with any doubt (another gantry-runtime build, a
caller that is not root or in another mount namespace, an error), the create
runs in-process exactly as before.

  --socket PATH   the socket (default $GANTRY_RUNTIME_SOCKET, else
                  /run/gantry/runtime.sock); mode 0600, root only

Under systemd, socket activation (LISTEN_FDS) is used when present: see
deployments/systemd/gantry-runtime-server.socket. The server stops by itself when
callers run another build (an upgrade), and on SIGTERM or SIGINT.
`

// Main runs the create server (arguments after --create-server).
func Main(args []string, stderr io.Writer) int {
	sock := os.Getenv(createproto.ServerSocketEnv)
	if sock == "" {
		sock = createproto.DefaultServerSocket
	}
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-h" || a == "--help":
			fmt.Fprint(stderr, serverUsage)
			return 0
		case a == "--socket" && i+1 < len(args):
			i++
			sock = args[i]
		case strings.HasPrefix(a, "--socket="):
			sock = strings.TrimPrefix(a, "--socket=")
		default:
			fmt.Fprintf(stderr, "gantry-runtime --create-server: unknown argument %q\n%s", a, serverUsage)
			return 2
		}
	}
	// The server's children (the NVML helper) get no loader variables
	// from whoever started it: in-process, a hook's or a create's
	// helper has its caller's environment, which the server does not
	// know. A helper that needs one fails here, and that create runs
	// in-process.
	for _, v := range []string{"LD_LIBRARY_PATH", "LD_PRELOAD", "LD_AUDIT"} {
		_ = os.Unsetenv(v)
	}
	s, err := NewServer(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "gantry-runtime --create-server: %v\n", err)
		return 1
	}
	warnLowLevel(stderr)
	l, err := serverListener(sock)
	if err != nil {
		fmt.Fprintf(stderr, "gantry-runtime --create-server: %v\n", err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		_ = l.Close()
	}()
	fmt.Fprintf(stderr, "gantry-runtime create server on %s\n", l.Addr())
	if err := s.Serve(l); err != nil {
		fmt.Fprintf(stderr, "gantry-runtime --create-server: %v\n", err)
		return 1
	}
	return 0
}

// warnLowLevel says, once at start, when the low-level runtime of the
// default configuration is a release with a known container escape
// (package lowlevel): the creates the server serves run it.
func warnLowLevel(stderr io.Writer) {
	cfg, _, err := config.Load("")
	if err != nil {
		return
	}
	path, err := shim.FindRuntime(cfg.Runtime.LowLevel)
	if err != nil {
		return
	}
	ver, err := lowlevel.Probe(context.Background(), path)
	if err != nil {
		fmt.Fprintf(stderr, "gantry-runtime create server: the low-level runtime's version is unknown: %v\n", err)
		return
	}
	if advs, _ := lowlevel.Advisories(ver); len(advs) > 0 {
		fmt.Fprintf(stderr, "gantry-runtime create server: warning: %s\n", lowlevel.Warning(path, ver, advs))
	}
}

// serverListener is systemd's socket (LISTEN_FDS) when it passed one, or
// a new socket at sock, 0600, replacing a stale one (a socket file nobody
// listens on).
func serverListener(sock string) (*net.UnixListener, error) {
	if os.Getenv("LISTEN_PID") == strconv.Itoa(os.Getpid()) && os.Getenv("LISTEN_FDS") == "1" {
		_ = os.Unsetenv("LISTEN_PID")
		_ = os.Unsetenv("LISTEN_FDS")
		unix.CloseOnExec(3)
		fl, err := net.FileListener(os.NewFile(3, "systemd socket"))
		if err != nil {
			return nil, fmt.Errorf("the socket systemd passed (LISTEN_FDS): %w", err)
		}
		ul, ok := fl.(*net.UnixListener)
		if !ok {
			return nil, errors.New("the socket systemd passed (LISTEN_FDS) is not a unix stream socket")
		}
		return ul, nil
	}
	return unixsock.Listen(sock, 0o755, "create server")
}
