package doctor

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fakeDaemon writes /proc/PID of a daemon: comm, environ with its PATH,
// cmdline, and, when socket is set, a listening unix socket bound there
// with its inode in net/unix and among its open files.
func fakeDaemon(t *testing.T, proc, pid, comm, path, socket, inode string, args ...string) {
	t.Helper()
	dir := filepath.Join(proc, pid)
	if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"comm":     comm + "\n",
		"environ":  "LANG=C\x00PATH=" + path + "\x00",
		"cmdline":  strings.Join(append([]string{"/usr/bin/" + comm}, args...), "\x00") + "\x00",
		"net/unix": "Num       RefCount Protocol Flags    Type St Inode Path\n",
	}
	if socket != "" {
		files["net/unix"] += "0000000000000000: 00000002 00000000 00010000 0001 01 " + inode + " " + socket + "\n"
		if err := os.Symlink("socket:["+inode+"]", filepath.Join(dir, "fd", "5")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/dev/null", filepath.Join(dir, "fd", "0")); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Two dockerds: the one whose PATH is read is the one on the socket doctor
// was pointed at, found by the socket's inode among its open files or by
// its -H flag; never the first in /proc.
func TestEnginePATHPicksTheDaemonOnTheSocket(t *testing.T) {
	proc := t.TempDir()
	sockDir := t.TempDir()
	a, b := filepath.Join(sockDir, "a.sock"), filepath.Join(sockDir, "b.sock")
	fakeDaemon(t, proc, "100", "dockerd", "/a/bin", a, "1111")
	fakeDaemon(t, proc, "200", "dockerd", "/b/bin", b, "2222")
	for sock, want := range map[string]string{a: "/a/bin", b: "/b/bin"} {
		path, source := enginePATH(proc, DefaultServicePATH, engineProcess{comm: "dockerd", socket: sock})
		if path != want || !strings.Contains(source, "dockerd's PATH from ") {
			t.Errorf("socket %s: PATH %q (%s), want %q", sock, path, source, want)
		}
	}
	// A third socket nobody listens on: systemd's default, not either PATH.
	path, source := enginePATH(proc, DefaultServicePATH, engineProcess{comm: "dockerd", socket: filepath.Join(sockDir, "c.sock")})
	if path != DefaultServicePATH || !strings.Contains(source, "no running dockerd listens on") || !strings.Contains(source, "100, 200") {
		t.Errorf("socket nobody listens on: %q (%s)", path, source)
	}
	// The -H flag, where the open files do not say (a socket in another
	// net namespace's table).
	fakeDaemon(t, proc, "300", "dockerd", "/c/bin", "", "", "-H", "unix://"+filepath.Join(sockDir, "c.sock"))
	if path, _ := enginePATH(proc, DefaultServicePATH, engineProcess{comm: "dockerd", socket: filepath.Join(sockDir, "c.sock")}); path != "/c/bin" {
		t.Errorf("by -H: %q", path)
	}
	// One dockerd whose sockets cannot be read (doctor not root): it.
	one := t.TempDir()
	fakeDaemon(t, one, "400", "dockerd", "/d/bin", "", "")
	if err := os.RemoveAll(filepath.Join(one, "400", "fd")); err != nil {
		t.Fatal(err)
	}
	if path, _ := enginePATH(one, DefaultServicePATH, engineProcess{comm: "dockerd", socket: a}); path != "/d/bin" {
		t.Errorf("the only dockerd, sockets unreadable: %q", path)
	}
}

// The hook check reads the PATH of the dockerd on --docker-socket.
func TestHookCheckUsesTheDockerdOnTheSocket(t *testing.T) {
	h := newHost(t)
	os.RemoveAll(filepath.Join(h.opts.Proc, "100"))
	empty := filepath.Join(h.dir, "empty-bin")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(h.dir, "other.sock")
	// The first dockerd in /proc has the hook on its PATH but listens
	// elsewhere; the one on the socket doctor asks has an empty PATH.
	fakeDaemon(t, h.opts.Proc, "100", "dockerd", h.bin, other, "1111")
	fakeDaemon(t, h.opts.Proc, "200", "dockerd", empty, h.opts.DockerSocket, "2222")
	h.write(t, h.opts.DockerConfig, `{}`)
	c := expect(t, Run(h.opts), CheckHook, Fail, []string{"not on dockerd's PATH \"" + empty + "\"", "/proc/200/environ"}, "")
	t.Log(c.Evidence)
	h.opts.DockerSocket = other
	expect(t, Run(h.opts), CheckHook, Pass, []string{"/proc/100/environ"}, "")
}

// A dangling hook link on dockerd's PATH: FAIL naming it, and ln -sf to
// the installed gantry-runtime; non-executable: chmod.
func TestHookDanglingLink(t *testing.T) {
	h := newHost(t)
	link := filepath.Join(h.bin, hookName)
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/opt/gone/gantry-runtime", link); err != nil {
		t.Fatal(err)
	}
	h.write(t, h.opts.DockerConfig, `{}`)
	c := expect(t, Run(h.opts), CheckHook, Fail, []string{link + " is a dangling symbolic link (to /opt/gone/gantry-runtime"},
		"ln -sf "+filepath.Join(h.bin, "gantry-runtime")+" "+link)
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
	// The fix as printed (ln -sf replaces the link).
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(h.bin, "gantry-runtime"), link); err != nil {
		t.Fatal(err)
	}
	expect(t, Run(h.opts), CheckHook, Pass, []string{link}, "")

	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	h.write(t, link, "#!/bin/sh\n")
	if err := os.Chmod(link, 0o644); err != nil {
		t.Fatal(err)
	}
	expect(t, Run(h.opts), CheckHook, Fail, []string{link + " is not executable"}, "chmod 755 "+link)
}

// The listening process the kernel names for a real socket (SO_PEERCRED)
// is taken first, whatever the tables in procfs say.
func TestEnginePATHBySocketPeer(t *testing.T) {
	proc := t.TempDir()
	sock := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fakeDaemon(t, proc, "1", "dockerd", "/first/bin", "", "") // sorts first
	fakeDaemon(t, proc, strconv.Itoa(os.Getpid()), "dockerd", "/peer/bin", "", "")
	if path, source := enginePATH(proc, DefaultServicePATH, engineProcess{comm: "dockerd", socket: sock}); path != "/peer/bin" {
		t.Fatalf("PATH %q (%s), want the socket's listener's", path, source)
	}
}
