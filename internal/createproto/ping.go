package createproto

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"syscall"
	"time"
)

// ServerStatus is what PingServer found at a create server's socket.
type ServerStatus int

const (
	// ServerUnknown: PingServer could not tell (its error says why).
	ServerUnknown ServerStatus = iota
	// ServerAbsent: no socket, or nobody listens on it: every GPU
	// create runs in-process.
	ServerAbsent
	// ServerSameBuild: a create server of the build at runtimePath
	// answers: gantry-runtime's GPU creates go to it.
	ServerSameBuild
	// ServerOtherBuild: a create server of another build answered:
	// runtimePath's creates are not served. It stops by itself when its
	// own file was replaced (an upgrade), as at a create of the new build.
	ServerOtherBuild
	// ServerNotOurs: something else is at the socket (not a socket, or
	// no answer, or not the protocol's).
	ServerNotOurs
)

func (s ServerStatus) String() string {
	switch s {
	case ServerAbsent:
		return "not running"
	case ServerSameBuild:
		return "same build"
	case ServerOtherBuild:
		return "another build"
	case ServerNotOurs:
		return "not a create server"
	}
	return "unknown"
}

// ErrNoAnswer is wrapped by PingServer's error when something accepted
// the connection (or let it queue) and did not answer in PingTimeout.
var ErrNoAnswer = errors.New("no answer")

// PingTimeout bounds PingServer's wait for the answer.
var PingTimeout = 5 * time.Second

// PingServer asks the create server at sock whether it is of the build at
// runtimePath (a gantry-runtime executable, or a link to one): a request
// with runtimePath's identity, no bundle and no container. The error, nil
// only for ServerSameBuild, says what was found.
//
// A server of another build whose own file was replaced (an upgrade) stops
// when asked, as it does for a create of the new build: a ping with an
// installed gantry-runtime does what its next GPU create would do. The server answers a ping with its own identity,
// so an unserved caller (another user, another mount namespace), which
// only ever gets a bare "do it yourself", is told apart (ServerUnknown).
func PingServer(sock, runtimePath string) (ServerStatus, error) {
	id, err := ExeIdentity(runtimePath)
	if err != nil {
		return ServerUnknown, fmt.Errorf("the runtime to compare with: %w", err)
	}
	st, err := os.Lstat(sock)
	if errors.Is(err, fs.ErrNotExist) {
		return ServerAbsent, fmt.Errorf("no create server: %s does not exist", sock)
	}
	if err != nil {
		return ServerUnknown, err
	}
	if st.Mode()&fs.ModeSocket == 0 {
		return ServerNotOurs, fmt.Errorf("%s is not a socket (%v)", sock, st.Mode().Type())
	}
	c, err := net.DialTimeout("unix", sock, PingTimeout)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return ServerAbsent, fmt.Errorf("no create server: nobody listens on %s (a stale socket)", sock)
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM):
		return ServerUnknown, fmt.Errorf("cannot connect to %s: %v (the create server serves root only: ask as root)", sock, err)
	case err != nil:
		return ServerUnknown, fmt.Errorf("cannot connect to %s: %w", sock, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(PingTimeout))
	msg := Ping{Exe: id}.Encode()
	// A server that does not serve this caller answers before it reads
	// and closes: the ping may then fail to go out, or the connection be
	// reset after the answer; the answer is read all the same.
	_, werr := c.Write(msg)
	// The answer, 'Y' or 'N' and the server's identity, then EOF.
	b, err := io.ReadAll(io.LimitReader(c, 256))
	if err != nil && !(len(b) > 0 && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))) {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return ServerNotOurs, fmt.Errorf("%s did not answer a create server's ping in %v: not a create server: %w", sock, PingTimeout, ErrNoAnswer)
		}
		if werr != nil {
			err = werr
		}
		return ServerNotOurs, fmt.Errorf("%s: no create server's answer: %v", sock, err)
	}
	// Every server answer starts with ServerAccepted (a server of a build
	// before it sends none).
	if len(b) > 0 && b[0] == ServerAccepted {
		b = b[1:]
	}
	if len(b) == 0 {
		return ServerNotOurs, fmt.Errorf("%s closed the connection without a create server's answer: not a create server", sock)
	}
	if string(b) == string(rune(AnswerSelf)) {
		// What a server answers a caller it does not serve, before
		// reading anything.
		return ServerUnknown, fmt.Errorf("the create server on %s did not serve this check: it serves only its own user (root) in its own mount namespace; ask as root on the host", sock)
	}
	a, err := DecodePingAnswer(b)
	switch {
	case err == nil && a.Answer == AnswerDone && a.Exe == id:
		return ServerSameBuild, nil
	case err == nil && a.Answer == AnswerSelf && a.Exe != id:
		return ServerOtherBuild, fmt.Errorf("the create server on %s runs another build (%s) than %s (%s): it serves none of its creates", sock, a.Exe, runtimePath, id)
	}
	return ServerNotOurs, fmt.Errorf("%s answered %q, not a create server's answer", sock, b)
}
