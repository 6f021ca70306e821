package doctor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/discover"
)

// The engines' processes. A program an engine's configuration names
// without a slash (daemon.json's runtime path, containerd's BinaryName,
// CRI-O's runtime_path) is looked up in the engine's own PATH, and
// docker run --gpus looks the hook up in dockerd's: doctor's PATH (a login
// shell's, sudo's secure_path) proves nothing about either. When several
// daemons of one name run (a second dockerd for rootless or a test), the
// one judged is the one listening on the socket doctor was pointed at.

// engineProcess is how an engine's daemon is found: its comm, the socket
// doctor asks it on, and the PATH it runs with when not running (systemd's
// default service PATH, what its unit gives it without an Environment=).
type engineProcess struct {
	comm   string
	socket string
}

// enginePATH returns the PATH of the running daemon p (its
// /proc/PID/environ) and where it came from; without a running daemon on
// p's socket, servicePATH (Options.ServicePATH: systemd's default service
// PATH unless a test names its own).
func enginePATH(proc, servicePATH string, p engineProcess) (path, source string) {
	pid, note := findDaemon(proc, p)
	if pid == "" {
		return servicePATH, note + "; systemd's default service PATH"
	}
	envFile := filepath.Join(proc, pid, "environ")
	env, err := os.ReadFile(envFile)
	if err != nil {
		return servicePATH, fmt.Sprintf("%s (pid %s): %v; systemd's default service PATH", p.comm, pid, err)
	}
	for _, kv := range strings.Split(string(env), "\x00") {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			return v, fmt.Sprintf("%s's PATH from %s", p.comm, envFile)
		}
	}
	// Go's exec.LookPath with no PATH set uses none: nothing is found.
	return "", fmt.Sprintf("%s (pid %s) has no PATH in %s", p.comm, pid, envFile)
}

// findDaemon returns the pid of the daemon named p.comm that listens on
// p.socket, and a note saying why none was taken: the socket's peer (the
// kernel's answer over a connection), else the socket's inode among each
// daemon's open files, else its -H flag. Among several daemons, one of
// them must be found listening there, never the first one found; a lone
// daemon is taken (its socket may be mounted elsewhere for doctor).
func findDaemon(proc string, p engineProcess) (pid, note string) {
	// The process that listens on the socket, as the kernel says when
	// asked over a connection (its pid in doctor's pid namespace; pid 1
	// for a socket systemd made and passed on, then the tables decide).
	if peer := socketPeer(p.socket); peer > 1 {
		pidStr := strconv.Itoa(peer)
		if comm, err := os.ReadFile(filepath.Join(proc, pidStr, "comm")); err == nil && strings.TrimSpace(string(comm)) == p.comm {
			return pidStr, ""
		}
	}
	entries, _ := os.ReadDir(proc)
	var all, unknown []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(proc, e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != p.comm {
			continue
		}
		all = append(all, e.Name())
		switch listensOn(proc, e.Name(), p.socket) {
		case yes:
			return e.Name(), ""
		case unknown_:
			unknown = append(unknown, e.Name())
		}
	}
	switch {
	case len(all) == 0:
		return "", fmt.Sprintf("no running %s in %s", p.comm, proc)
	case len(all) == 1:
		// The only one: its socket may be another path for the same
		// file (doctor in a container, the socket mounted elsewhere).
		return all[0], ""
	case len(unknown) > 0:
		return "", fmt.Sprintf("%d %s processes (pids %s) and none is known to listen on %s (their sockets cannot be read)", len(all), p.comm, strings.Join(all, ", "), p.socket)
	}
	return "", fmt.Sprintf("no running %s listens on %s (%s pids %s listen elsewhere)", p.comm, p.socket, p.comm, strings.Join(all, ", "))
}

// socketPeer is the pid of the process listening on the unix socket
// path (SO_PEERCRED of a connection to it), or 0.
func socketPeer(path string) int {
	if path == "" {
		return 0
	}
	conn, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return 0
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0
	}
	var pid int
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}

type tristate int

const (
	no tristate = iota
	yes
	unknown_
)

// listensOn says whether process pid holds the listening unix socket
// bound at socket: the socket's inode from the process's own
// net/unix, matched against its open files (a socket systemd passed, -H
// fd://, is one of them too); else its -H/--host flags.
func listensOn(proc, pid, socket string) tristate {
	if socket == "" {
		return unknown_
	}
	want := samePath(socket)
	inodes := listeningInodes(filepath.Join(proc, pid, "net/unix"), socket)
	fds, err := os.ReadDir(filepath.Join(proc, pid, "fd"))
	if err == nil && holdsAny(proc, pid, fds, inodes) {
		return yes
	}
	if cmdline, err := os.ReadFile(filepath.Join(proc, pid, "cmdline")); err == nil {
		args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
		for i, a := range args {
			var v string
			switch {
			case a == "-H" || a == "--host" || a == "--address" || a == "-a":
				if i+1 < len(args) {
					v = args[i+1]
				}
			case strings.HasPrefix(a, "-H="), strings.HasPrefix(a, "--host="), strings.HasPrefix(a, "--address="):
				_, v, _ = strings.Cut(a, "=")
			}
			if v != "" && samePath(strings.TrimPrefix(v, "unix://")) == want {
				return yes
			}
		}
	}
	if err != nil {
		return unknown_ // its open files cannot be read: not root, or another user's
	}
	return no
}

// listeningInodes returns the fd link names ("socket:[INODE]") of the
// listening unix sockets (flag __SO_ACCEPTCON) bound at socket, read from
// a net/unix file (/proc/net/unix or /proc/PID/net/unix).
func listeningInodes(netUnix, socket string) map[string]bool {
	want := samePath(socket)
	inodes := map[string]bool{}
	f, err := os.Open(netUnix)
	if err != nil {
		return inodes
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode Path
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || samePath(fields[7]) != want {
			continue
		}
		if flags, err := strconv.ParseUint(fields[3], 16, 32); err == nil && flags&0x10000 != 0 {
			inodes["socket:["+fields[6]+"]"] = true
		}
	}
	return inodes
}

// holdsAny says whether one of process pid's open files (fds, its fd
// directory) is one of inodes.
func holdsAny(proc, pid string, fds []os.DirEntry, inodes map[string]bool) bool {
	if len(inodes) == 0 {
		return false
	}
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join(proc, pid, "fd", fd.Name())); err == nil && inodes[l] {
			return true
		}
	}
	return false
}

// samePath is p with its directory's symbolic links resolved (/var/run is
// /run), for comparing socket paths.
func samePath(p string) string {
	p = filepath.Clean(p)
	if d, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		return filepath.Join(d, filepath.Base(p))
	}
	return p
}

// The engines whose processes doctor judges programs with.
func dockerdProcess(opts Options) engineProcess {
	return engineProcess{comm: "dockerd", socket: opts.DockerSocket}
}

func containerdProcess(opts Options) engineProcess {
	s := opts.CRISocket
	if s == "" {
		s = DefaultCRISockets[0]
	}
	return engineProcess{comm: "containerd", socket: s}
}

func crioProcess(opts Options) engineProcess {
	s := opts.CRISocket
	if s == "" || s == DefaultCRISockets[0] {
		s = "/run/crio/crio.sock"
	}
	return engineProcess{comm: "crio", socket: s}
}

// engineFor is the engine process of an engine check.
func engineFor(opts Options, check string) engineProcess {
	switch check {
	case CheckContainerd:
		return containerdProcess(opts)
	case CheckCRIO:
		return crioProcess(opts)
	case CheckDocker:
		return dockerdProcess(opts)
	}
	if d, ok := engineOfCheck(check); ok {
		// An engine without a socket doctor knows: its lone daemon.
		return engineProcess{comm: d.Program}
	}
	return dockerdProcess(opts)
}

// program is a program an engine will run, judged as the engine will.
type program struct {
	// path is where the engine finds it; "" when it cannot run it.
	path string
	// problem says why it cannot; chmod is the file to make executable,
	// onDoctorPath where doctor's own PATH finds a name the engine's
	// does not.
	problem      string
	chmod        string
	onDoctorPath string
}

// judgeProgram judges p as an engine's configuration names it: a name
// without a slash is looked up in the engine's PATH (path, read from
// source), as exec does; a path must be an executable regular file.
func judgeProgram(p, path, source string) program {
	if !strings.Contains(p, "/") {
		if lp, ok := discover.LookPathIn(p, path); ok {
			return program{path: lp}
		}
		if nx := nonExecutableIn(p, path); nx != "" {
			return program{problem: fmt.Sprintf("%s is on the engine's PATH as %s but is not executable (mode %s)", p, nx, modeOf(nx)), chmod: nx}
		}
		if lp, err := exec.LookPath(p); err == nil {
			abs, _ := filepath.Abs(lp)
			return program{problem: fmt.Sprintf("%s is not on the engine's PATH %q (%s); doctor's own PATH has it as %s, where the engine does not look", p, path, source, abs), onDoctorPath: abs}
		}
		return program{problem: fmt.Sprintf("%s is not on the engine's PATH %q (%s)", p, path, source)}
	}
	st, err := os.Stat(p)
	if err != nil {
		if lst, lerr := os.Lstat(p); lerr == nil && lst.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(p)
			return program{problem: fmt.Sprintf("%s is a dangling symbolic link (to %s, which does not exist)", p, target)}
		}
		if errors.Is(err, fs.ErrNotExist) {
			return program{problem: fmt.Sprintf("%s does not exist", p)}
		}
		return program{problem: fmt.Sprintf("%s: %v", p, err)}
	}
	if !st.Mode().IsRegular() {
		return program{problem: fmt.Sprintf("%s is not a regular file (%s)", p, st.Mode().Type())}
	}
	if st.Mode().Perm()&0o111 == 0 {
		return program{problem: fmt.Sprintf("%s exists but is not executable (mode %s): the engine's exec of it fails with \"permission denied\"", p, st.Mode().Perm()), chmod: p}
	}
	return program{path: p}
}

// nonExecutableIn is the first regular file called file in path's
// absolute directories that lacks an execute bit ("" if none).
func nonExecutableIn(file, path string) string {
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, file)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 == 0 {
			return p
		}
	}
	return ""
}

func modeOf(p string) string {
	if st, err := os.Stat(p); err == nil {
		return st.Mode().Perm().String()
	}
	return "?"
}

// restartFor is the command that makes the engine of an engine check
// read its configuration again.
func restartFor(check string) string {
	if d, ok := engineOfCheck(check); ok {
		return d.Restart
	}
	return "systemctl restart docker"
}
