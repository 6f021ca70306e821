package createproto

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ServerProtocol opens every create request and ping; fastpath.c's
// gantry_server_magic holds the same text (fastpath's TestConstants).
const ServerProtocol = "gantry-create/1"

// HookProtocol opens a prestart hook's request (fastpath.c's
// gantry_hook_magic): Docker's --gpus path, where the C constructor of
// gantry-hook (nvidia-container-runtime-hook) sends the OCI state it read
// from stdin, and the server does what the hook's Go code would (package
// hook's Prestart) for the hook's process.
const HookProtocol = "gantry-hook/1"

// MaxHookState bounds the OCI state the constructor sends (fastpath.c's
// gantry_max_hook_state): a state is a few hundred bytes, and one message
// of this size arrives whole; a larger one is left to the hook's Go code.
const MaxHookState = 32 << 10

// MaxRequest bounds a create request: four paths and a few numbers
// (fastpath.c's message buffer). A hook's request may be MaxHookState
// longer.
const MaxRequest = 4 * 4096

// DefaultServerSocket is where gantry-runtime looks for the create server,
// unless ServerSocketEnv names another socket (fastpath.c has both).
const (
	DefaultServerSocket = "/run/gantry/runtime.sock"
	ServerSocketEnv     = "GANTRY_RUNTIME_SOCKET"
)

// ServerFlag, first on gantry-runtime's command line, runs the server.
const ServerFlag = "--create-server"

// How long the C constructor (fastpath.c's gantry_server_*_ms) waits for a
// create server before it does the work in-process: a server that is
// stopped, frozen or never accepts (its backlog full, or a listener that
// is not a server) must not cost a create more than a fraction of a
// second. The server writes ServerAccepted as soon as it takes the
// connection; only then does the caller wait ServerAnswerTimeout for the
// work itself.
const (
	// ServerConnectTimeout bounds the connect and the send of the request
	// (SO_SNDTIMEO: on a unix socket it bounds a connect to a full
	// backlog too).
	ServerConnectTimeout = 300 * time.Millisecond
	// ServerAckTimeout bounds the wait for ServerAccepted once the
	// request went out.
	ServerAckTimeout = 500 * time.Millisecond
	// ServerAnswerTimeout bounds the wait for the answer after
	// ServerAccepted: the first create of a new driver version may build
	// its tree, a copy of a few hundred MB across filesystems.
	ServerAnswerTimeout = 15 * time.Second
)

// ServerAccepted is the byte the server writes first on every connection
// it takes, before it reads the request; the answer (AnswerDone or
// AnswerSelf) follows. A caller of an older build reads it as "do it
// yourself", as it reads anything but AnswerDone.
const ServerAccepted = '+'

// The one-byte answers: done (execute the low-level runtime) or do it
// yourself (in-process Go). fastpath.c reads 'Y' as done and anything
// else as not.
const (
	AnswerDone = 'Y'
	AnswerSelf = 'N'
)

// Create is one create as the constructor sends it: the protocol, then
// each field ended by a NUL, in this order.
type Create struct {
	Exe        string // the caller's executable identity (ExeIdentity)
	ConfigPath string // absolute, or "" for none
	Explicit   bool   // the configuration was named ($GANTRY_CONFIG)
	Bundle     string // as given on the command line, for the log
	Container  string
	StartNS    int64 // the caller's constructor, CLOCK_MONOTONIC
}

// Encode is c as fastpath.c writes it (server_header, server_create).
func (c Create) Encode() []byte {
	return encode(ServerProtocol, c.Exe, c.ConfigPath, flag(c.Explicit), c.Bundle, c.Container, strconv.FormatInt(c.StartNS, 10))
}

// DecodeCreate reads a create request (or a ping): exactly its fields,
// each ended by a NUL, with an identity, a config path that is absolute
// or empty, and a bundle whenever a container is named.
func DecodeCreate(b []byte) (Create, error) {
	f, ok := fields(b, ServerProtocol, 6)
	if !ok {
		return Create{}, errors.New("not a " + ServerProtocol + " request")
	}
	start, err := strconv.ParseInt(f[5], 10, 64)
	if err != nil || (f[2] != "0" && f[2] != "1") || f[0] == "" || (f[4] == "" && f[3] != "") || (f[1] != "" && !filepath.IsAbs(f[1])) {
		return Create{}, errors.New("malformed " + ServerProtocol + " request")
	}
	return Create{Exe: f[0], ConfigPath: f[1], Explicit: f[2] == "1", Bundle: f[3], Container: f[4], StartNS: start}, nil
}

// IsPing reports whether c is a health probe (Ping): no bundle and no
// container; it comes without a bundle directory, and a create always
// names both.
func (c Create) IsPing() bool { return c.Bundle == "" && c.Container == "" }

// Hook is a prestart hook's request: the protocol, then each field ended
// by a NUL, the OCI state last.
type Hook struct {
	Exe        string
	ConfigPath string
	Explicit   bool
	StartNS    int64
	State      []byte
}

// Encode is h as fastpath.c writes it (server_header, server_hook).
func (h Hook) Encode() []byte {
	return encode(HookProtocol, h.Exe, h.ConfigPath, flag(h.Explicit), strconv.FormatInt(h.StartNS, 10), string(h.State))
}

// DecodeHook reads a hook's request: exactly its fields, each ended by a
// NUL, with an identity, a config path that is absolute or empty, and a
// state.
func DecodeHook(b []byte) (Hook, error) {
	f, ok := fields(b, HookProtocol, 5)
	if !ok {
		return Hook{}, errors.New("not a " + HookProtocol + " request")
	}
	start, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil || (f[2] != "0" && f[2] != "1") || f[0] == "" || (f[1] != "" && !filepath.IsAbs(f[1])) || f[4] == "" {
		return Hook{}, errors.New("malformed " + HookProtocol + " request")
	}
	return Hook{Exe: f[0], ConfigPath: f[1], Explicit: f[2] == "1", StartNS: start, State: []byte(f[4])}, nil
}

// IsHook reports whether b opens a hook's request (else it is a create's
// or a ping's, or nothing).
func IsHook(b []byte) bool { return bytes.HasPrefix(b, []byte(HookProtocol+"\x00")) }

// Whole reports whether b holds a whole request: every field of its
// protocol, each ended by a NUL (a create or a ping has 7, a hook 6);
// anything else is as whole as it gets. A stream socket may deliver a
// long request in parts: the server reads on until it is whole.
func Whole(b []byte) bool {
	switch {
	case IsHook(b):
		return bytes.Count(b, []byte{0}) >= 6
	case bytes.HasPrefix(b, []byte(ServerProtocol+"\x00")):
		return bytes.Count(b, []byte{0}) >= 7
	}
	return true
}

// Ping is the health probe: a create request with the pinger's identity
// and no configuration, bundle or container. The server answers it with
// PingAnswer.
type Ping struct{ Exe string }

// Encode is the ping request.
func (p Ping) Encode() []byte { return Create{Exe: p.Exe}.Encode() }

// DecodePing reads a ping request: a create request that IsPing.
func DecodePing(b []byte) (Ping, error) {
	c, err := DecodeCreate(b)
	if err != nil {
		return Ping{}, err
	}
	if !c.IsPing() {
		return Ping{}, errors.New("a " + ServerProtocol + " create, not a ping")
	}
	return Ping{Exe: c.Exe}, nil
}

// PingAnswer is what a server that serves the pinger answers after
// ServerAccepted: AnswerDone when the pinger runs its build, else
// AnswerSelf, then the server's own identity (a caller that is not served
// gets a bare AnswerSelf).
type PingAnswer struct {
	Answer byte
	Exe    string // the server's identity
}

// Encode is the answer as the server writes it (without ServerAccepted).
func (a PingAnswer) Encode() []byte { return append([]byte{a.Answer}, a.Exe...) }

// DecodePingAnswer reads what a server wrote after ServerAccepted: a
// served ping's answer, an answer byte and an identity. A bare
// AnswerSelf, or anything else, is an error.
func DecodePingAnswer(b []byte) (PingAnswer, error) {
	if len(b) < 2 || (b[0] != AnswerDone && b[0] != AnswerSelf) || !IsIdentity(string(b[1:])) {
		return PingAnswer{}, fmt.Errorf("%q is not a served ping's answer", b)
	}
	return PingAnswer{Answer: b[0], Exe: string(b[1:])}, nil
}

// ExeIdentity names a file's identity as the constructor does: device,
// inode, size and modification time of what /proc/self/exe is. The server
// serves only callers whose identity is its own (the same build decides
// the same way).
func ExeIdentity(p string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d:%d:%d:%d.%09d", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec), nil
}

// IsIdentity reports whether s has ExeIdentity's form.
func IsIdentity(s string) bool {
	var dev, ino, size, sec, nsec uint64
	n, err := fmt.Sscanf(s, "%d:%d:%d:%d.%d", &dev, &ino, &size, &sec, &nsec)
	return err == nil && n == 5 && fmt.Sprintf("%d:%d:%d:%d.%09d", dev, ino, size, sec, nsec) == s
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// encode writes the protocol and each field, each ended by a NUL.
func encode(protocol string, f ...string) []byte {
	var b bytes.Buffer
	b.WriteString(protocol)
	b.WriteByte(0)
	for _, s := range f {
		b.WriteString(s)
		b.WriteByte(0)
	}
	return b.Bytes()
}

// fields splits b into the n fields after protocol, each ended by a NUL:
// ok false unless b holds exactly that.
func fields(b []byte, protocol string, n int) ([]string, bool) {
	f := strings.Split(string(b), "\x00")
	if len(f) != n+2 || f[n+1] != "" || f[0] != protocol {
		return nil, false
	}
	return f[1 : n+1], true
}
