package docs

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/createproto"
)

// unitKeys reads a systemd unit's Key=value lines (the last value of each
// key wins, as systemd's do for these).
func unitKeys(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' || l[0] == ';' || l[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			t.Fatalf("%s: line %q is not Key=value", path, l)
		}
		keys[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return keys
}

// TestSystemdUnits: make install installs the create server's units
// (deployments/systemd) in systemd's unit directory under PREFIX, enabling
// nothing where that is no directory systemd reads (or with CREATE_SERVER=0,
// or where systemd does not run) and printing the command that does; the service runs the
// gantry-runtime make install installs, as root in the host's mount
// namespace (the server serves only callers in its own), on the socket
// gantry-runtime looks for; and systemd-analyze verify accepts them where
// it is installed.
func TestSystemdUnits(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	prefix := filepath.Join(t.TempDir(), "prefix")
	makeCmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("make", append(args, "PREFIX="+prefix, "DESTDIR=")...)
		cmd.Dir = repoRoot
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// Where make install puts gantry-runtime (a dry run: nothing built).
	dry := makeCmd("-n", "install")
	m := regexp.MustCompile(`(?m)^install -m 0755 bin/gantry-runtime (\S+)$`).FindStringSubmatch(dry)
	if m == nil {
		t.Fatalf("make -n install installs no bin/gantry-runtime:\n%s", dry)
	}
	installed := m[1]
	if !strings.Contains(dry, "install-systemd") {
		t.Errorf("make install does not install the systemd units:\n%s", dry)
	}

	out := makeCmd("install-systemd")
	if !strings.Contains(out, "systemctl enable --now gantry-runtime-server.socket") || !strings.Contains(out, "not enabled") {
		t.Errorf("make install-systemd does not print the enable command:\n%s", out)
	}
	unitDir := filepath.Join(prefix, "lib/systemd/system")
	socket := filepath.Join(unitDir, "gantry-runtime-server.socket")
	service := filepath.Join(unitDir, "gantry-runtime-server.service")
	var files []string
	filepath.WalkDir(prefix, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if strings.Join(files, " ") != service+" "+socket {
		t.Errorf("make install-systemd wrote %q, want the two units only (nothing enabled)", files)
	}
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o644 {
			t.Errorf("%s: mode %v (%v), want 0644", f, st.Mode().Perm(), err)
		}
	}

	sk := unitKeys(t, socket)
	if sk["ListenStream"] != createproto.DefaultServerSocket || sk["SocketMode"] != "0600" || sk["DirectoryMode"] != "0755" {
		t.Errorf("socket unit: ListenStream=%q SocketMode=%q DirectoryMode=%q, want %s, 0600, 0755",
			sk["ListenStream"], sk["SocketMode"], sk["DirectoryMode"], createproto.DefaultServerSocket)
	}
	if sk["Accept"] == "yes" {
		t.Errorf("socket unit: Accept=yes starts a server per connection")
	}
	sv := unitKeys(t, service)
	if want := installed + " " + createproto.ServerFlag; sv["ExecStart"] != want {
		t.Errorf("service ExecStart=%q, want %q (what make install installs)", sv["ExecStart"], want)
	}
	if sv["Restart"] != "on-failure" {
		t.Errorf("service Restart=%q, want on-failure", sv["Restart"])
	}
	// Anything that gives the service a mount namespace of its own, or
	// another user, makes the server refuse every caller.
	for _, k := range []string{"User", "Group", "DynamicUser", "PrivateUsers", "ProtectSystem", "ProtectHome", "PrivateTmp",
		"PrivateDevices", "PrivateMounts", "ReadOnlyPaths", "ReadWritePaths", "InaccessiblePaths", "TemporaryFileSystem",
		"BindPaths", "BindReadOnlyPaths", "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
		"ProtectControlGroups", "ProtectProc", "ProtectHostname", "ProtectClock", "RootDirectory", "RootImage", "MountFlags",
		"NetworkNamespacePath", "IPCNamespacePath"} {
		if v, ok := sv[k]; ok {
			t.Errorf("service sets %s=%s: the server would serve no caller (another user or mount namespace)", k, v)
		}
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("no systemd-analyze: units not verified")
		return
	}
	// ExecStart must exist for verify: the gantry-runtime TestMain built.
	if err := os.MkdirAll(filepath.Dir(installed), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(binDir, "gantry-runtime"), installed); err != nil {
		t.Fatal(err)
	}
	vout, err := exec.Command(analyze, "verify", socket, service).CombinedOutput()
	if err != nil || strings.Contains(string(vout), unitDir) {
		t.Errorf("systemd-analyze verify: %v\n%s", err, vout)
	}
}
