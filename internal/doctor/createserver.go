package doctor

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/internal/createproto"
)

// The create server (gantry-runtime --create-server) takes the Go start
// off each GPU create of the gantry-runtime of its own build. The engine
// checks ask it, with a ping, whether it runs the build of each registered
// Gantry runtime: a note on the PASS line either way, since without it
// (or with another build) creates run in-process, as correct, only
// slower.

// serverPing is one ping's outcome.
type serverPing struct {
	status createproto.ServerStatus
	err    error
}

// gantryProgram reports whether the program p is a Gantry binary, whose C
// start asks the create server: gantry-runtime, or gantry installed under
// a runtime's name. NVIDIA's own runtime is never pinged (a ping with its
// identity would stop the server).
func gantryProgram(p string) bool {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return false
	}
	b := filepath.Base(real)
	return b == "gantry-runtime" || b == "gantry"
}

// createServerNotes pings the create server at opts.RuntimeSocket with
// each of runtimes (real Gantry binaries; one ping per file, once per
// doctor run) and says what it found: good for a server of that build,
// notes for anything else.
func createServerNotes(opts Options, runtimes []string) (good, notes []string) {
	sock := opts.RuntimeSocket
	if sock == "" || len(runtimes) == 0 {
		return nil, nil
	}
	if p := probeCreateServer(opts); p.hung() {
		// Each ping would wait as long again.
		return nil, []string{fmt.Sprintf("the create server's socket %s does not answer: each GPU create waits for it (see %s)", sock, CheckCreateServer)}
	}
	seen := map[string]bool{}
	for _, rt := range runtimes {
		real, err := filepath.EvalSymlinks(rt)
		if err != nil || seen[real] {
			continue
		}
		seen[real] = true
		key := sock + "\x00" + real
		p, ok := opts.serverPings[key]
		if !ok {
			p.status, p.err = createproto.PingServer(sock, real)
			if opts.serverPings != nil {
				opts.serverPings[key] = p
			}
		}
		switch p.status {
		case createproto.ServerSameBuild:
			good = append(good, "create server: same build, listening on "+sock)
		case createproto.ServerAbsent:
			why := strings.TrimPrefix(p.err.Error(), "no create server: ")
			notes = append(notes, fmt.Sprintf("create server not running (%s): each GPU create starts Go (about 2 ms more); see docs/guide.md, \"The create server\"", why))
		case createproto.ServerOtherBuild:
			notes = append(notes, fmt.Sprintf("create server on %s is another build than %s: its creates are not served; after an upgrade of that file the server stops by itself (or: systemctl restart %s), otherwise it runs another file: make the unit's ExecStart %s", sock, rt, serverService, real))
		case createproto.ServerNotOurs:
			notes = append(notes, fmt.Sprintf("%v: GPU creates ask it first, then run in-process; remove it or stop what listens there", p.err))
		default:
			notes = append(notes, fmt.Sprintf("create server not checked: %v", p.err))
		}
	}
	return good, notes
}

// serverService is the create server's systemd service
// (deployments/systemd).
const serverService = "gantry-runtime-server.service"
