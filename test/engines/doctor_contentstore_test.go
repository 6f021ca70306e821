//go:build linux

package engines

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/doctor"
)

// TestDoctorContentStore: a real containerd serving CRI, with the test
// images in its content store (the blobs a task checkpoint is kept as).
// doctor, given only the CRI socket, takes containerd's root from its CRI
// status and judges it as the kernel does: nobody reads a blob exactly when
// the check warns. A root made 0711 (as containerd before the fix of
// CVE-2024-25621 makes it) is WARN; the printed fix, run as printed, makes
// it PASS, containerd still serves its content, and the root stays 0700
// across a restart.
func TestDoctorContentStore(t *testing.T) {
	e := startCRI(t)
	f := e.f
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv (util-linux): cannot read as nobody")
	}
	root := filepath.Join(e.dir, "containerd", "root")
	// The test's own directories above the root are 0700: open them, so
	// that containerd's directories decide.
	for _, d := range []string{filepath.Dir(e.dir), e.dir, filepath.Join(e.dir, "containerd")} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	blobDir := filepath.Join(root, "io.containerd.content.v1.content", "blobs", "sha256")
	blobs, _ := filepath.Glob(filepath.Join(blobDir, "*"))
	if len(blobs) == 0 {
		t.Fatalf("no blobs in %s after the image import", root)
	}
	blob := blobDir + "/*"
	// nobodyReads: user nobody can read one of the blobs there now (each
	// read afresh: containerd may collect a blob no image refers to while
	// the test runs, which a busy machine made happen to a blob picked once).
	nobodyReads := func() bool {
		bs, _ := filepath.Glob(filepath.Join(blobDir, "*"))
		for _, b := range bs {
			if exec.Command(setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", "cat", b).Run() == nil {
				return true
			}
		}
		return false
	}
	mode := func() os.FileMode {
		st, err := os.Stat(root)
		if err != nil {
			t.Fatal(err)
		}
		return st.Mode().Perm()
	}
	none := filepath.Join(e.dir, "none")
	check := func() doctor.Check {
		t.Helper()
		c := one(t, runDoctor(t, f, e.env, "--cri-socket", e.sock, "--containerd-config", filepath.Join(none, "config.toml"),
			"--kubelet-dir", filepath.Join(none, "kubelet"), "--docker-socket", filepath.Join(none, "docker.sock"),
			"--create-server-socket", filepath.Join(none, "runtime.sock")), doctor.CheckContentStore)
		if !strings.Contains(c.Evidence, root) || !strings.Contains(c.Evidence, "from its CRI status at "+e.sock) {
			t.Fatalf("the root is not the running containerd's %s: %+v", root, c)
		}
		return c
	}
	version, _ := command(e.env, "containerd", "--version")
	c := check()
	t.Logf("%s: root %04o as it made it: %s %s", strings.TrimSpace(version), mode(), c.Status, c.Evidence)
	if want := map[bool]doctor.Status{true: doctor.Warn, false: doctor.Pass}[nobodyReads()]; c.Status != want {
		t.Fatalf("nobody reads a blob: %v, but doctor says %s", nobodyReads(), c.Status)
	}

	// As containerd before the fix makes it.
	if err := os.Chmod(root, 0o711); err != nil {
		t.Fatal(err)
	}
	c = check()
	if c.Status != doctor.Warn || !c.OK || !nobodyReads() {
		t.Fatalf("root 0711: %+v (nobody reads %s: %v), want WARN", c, blob, nobodyReads())
	}
	m := regexp.MustCompile(`^chmod 700 (\S+) `).FindStringSubmatch(c.Fix)
	if m == nil || m[1] != root {
		t.Fatalf("the fix names no chmod 700 of %s: %s", root, c.Fix)
	}
	if out, err := exec.Command("chmod", "700", m[1]).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if c := check(); c.Status != doctor.Pass || nobodyReads() {
		t.Fatalf("after the printed fix: %+v (nobody reads %s: %v), want PASS", c, blob, nobodyReads())
	}
	// containerd still serves its content, and keeps the mode across a
	// restart (one with the fix sets 0700 itself; one without keeps it).
	blobs, _ = filepath.Glob(filepath.Join(blobDir, "*"))
	if len(blobs) == 0 {
		t.Fatalf("no blobs left in %s", blobDir)
	}
	digest := "sha256:" + filepath.Base(blobs[0])
	if out, err := command(e.env, "ctr", "--address", e.sock, "--namespace", "k8s.io", "content", "get", digest); err != nil {
		t.Fatalf("containerd cannot read its own content after the fix: %v\n%.300s", err, out)
	}
	e.d.stop(t)
	e.start(t)
	if got := mode(); got != 0o700 {
		t.Fatalf("after a restart the root is %04o, want 0700", got)
	}
	if c := check(); c.Status != doctor.Pass {
		t.Fatalf("after a restart: %+v", c)
	}
}
