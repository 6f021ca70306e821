package doctor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/createproto"
)

// The create server's socket is asked first by every GPU create of
// gantry-runtime (its C start, fastpath.c): a process that holds it and
// never answers costs each of them the C start's bound before the create
// runs in-process. The engine checks say which build a server is; this
// check says whether anything answers there at all, and what holds it.

// socketHolder is a process with the listening socket open.
type socketHolder struct {
	pid  int
	comm string
	uid  int // -1 when unknown
}

func (h socketHolder) String() string { return fmt.Sprintf("pid %d (%s)", h.pid, h.comm) }

// serverProbe is what doctor found at the create server's socket.
type serverProbe struct {
	sock   string
	status createproto.ServerStatus
	err    error
	// noAnswer: a connection was taken (or queued) and no answer came;
	// backlogFull: the connection itself was refused for now (EAGAIN):
	// the C start's blocking connect waits instead.
	noAnswer, backlogFull bool
	// peerUID is the listener's user (SO_PEERCRED), -1 when unknown: the
	// C start believes root's server only and leaves anyone else's at
	// once.
	peerUID int
	holders []socketHolder
}

// probeCreateServer asks the socket once per doctor run: a ping with this
// executable's identity (any build's server answers one), and, when
// nothing answers, which processes hold the listening socket.
func probeCreateServer(opts Options) *serverProbe {
	sock := opts.RuntimeSocket
	key := sock + "\x00probe"
	if p, ok := opts.serverProbes[key]; ok {
		return p
	}
	p := &serverProbe{sock: sock, peerUID: -1}
	if opts.serverProbes != nil {
		opts.serverProbes[key] = p
	}
	self, err := os.Executable()
	if err != nil {
		p.err = err
		return p
	}
	p.status, p.err = createproto.PingServer(sock, self)
	p.noAnswer = errors.Is(p.err, createproto.ErrNoAnswer)
	p.backlogFull = errors.Is(p.err, syscall.EAGAIN)
	if p.noAnswer || p.backlogFull {
		// Whose listener it is (a connection that queues, as the
		// ping's did; a server that answers is not asked twice).
		if c, err := net.DialTimeout("unix", sock, createproto.ServerConnectTimeout); err == nil {
			p.peerUID = peerUID(c)
			c.Close()
		}
		p.holders = socketHolders(opts.Proc, sock)
		if p.peerUID < 0 {
			for _, h := range p.holders {
				p.peerUID = h.uid
			}
		}
	}
	return p
}

// hung reports that GPU creates wait on this socket.
func (p *serverProbe) hung() bool { return (p.noAnswer || p.backlogFull) && p.peerUID <= 0 }

// peerUID is the user of the process at the other end of c, -1 if unknown.
func peerUID(c net.Conn) int {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return -1
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return -1
	}
	uid := -1
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			uid = int(cred.Uid)
		}
	})
	return uid
}

// socketHolders finds the processes that have the listening unix socket
// bound at sock open: its inode from proc's net/unix (flag __SO_ACCEPTCON),
// then each process's fd links "socket:[INODE]".
func socketHolders(proc, sock string) []socketHolder {
	inodes := listeningInodes(filepath.Join(proc, "net/unix"), sock)
	if len(inodes) == 0 {
		return nil
	}
	entries, _ := os.ReadDir(proc)
	var out []socketHolder
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join(proc, e.Name(), "fd"))
		if holdsAny(proc, e.Name(), fds, inodes) {
			h := socketHolder{pid: pid, uid: -1}
			if b, err := os.ReadFile(filepath.Join(proc, e.Name(), "comm")); err == nil {
				h.comm = strings.TrimSpace(string(b))
			}
			if b, err := os.ReadFile(filepath.Join(proc, e.Name(), "status")); err == nil {
				for _, line := range strings.Split(string(b), "\n") {
					if v, ok := strings.CutPrefix(line, "Uid:"); ok {
						if f := strings.Fields(v); len(f) > 0 {
							h.uid, _ = strconv.Atoi(f[0])
						}
					}
				}
			}
			out = append(out, h)
		}
	}
	return out
}

// checkCreateServer judges the create server's socket by what a GPU
// create would pay there.
func checkCreateServer(opts Options) Check {
	sock := opts.RuntimeSocket
	if sock == "" {
		return skip(CheckCreateServer, "no socket to ask")
	}
	p := probeCreateServer(opts)
	switch {
	case p.hung():
		cost, how := createproto.ServerConnectTimeout+createproto.ServerAckTimeout, fmt.Sprintf("connected, but no answer to a create server's ping in %v", createproto.PingTimeout)
		if p.backlogFull {
			cost, how = createproto.ServerConnectTimeout, "its listen backlog is full: connections are not taken"
		}
		held, f := "a process doctor could not find (another PID namespace?)", fix(fixServerHeldUnknown, "SOCKET", sock)
		if len(p.holders) > 0 {
			var names []string
			for _, h := range p.holders {
				names = append(names, h.String())
			}
			held = strings.Join(names, ", ")
			h := p.holders[0]
			f = fix(fixServerHeld, "SOCKET", sock, "PID", strconv.Itoa(h.pid), "COMM", h.comm)
			if h.pid == 1 {
				f = fix(fixServerUnitHeld, "SOCKET", sock)
			}
		}
		return fail(CheckCreateServer, f,
			"%s is held by %s, which does not answer (%s): every GPU create of gantry-runtime asks this socket first and waits %v (its bound) before doing the work in-process; %v",
			sock, held, how, cost, p.err)
	case p.status == createproto.ServerAbsent:
		return info(CheckCreateServer, "%v: GPU creates run in-process (about 2 ms more each); optional, see docs/guide.md, \"The create server\"", p.err)
	case p.status == createproto.ServerSameBuild || p.status == createproto.ServerOtherBuild:
		return pass(CheckCreateServer, "a create server answers on %s (which runtime builds it serves: see the engine checks)", sock)
	case p.noAnswer || p.backlogFull:
		return info(CheckCreateServer, "%v; its listener is not root's (uid %d), which gantry-runtime does not believe: it leaves it at once", p.err, p.peerUID)
	case p.status == createproto.ServerNotOurs:
		return info(CheckCreateServer, "%v: gantry-runtime asks it and, getting no create server's answer, creates in-process at once; remove it or stop what listens there", p.err)
	}
	return info(CheckCreateServer, "not checked: %v", p.err)
}
