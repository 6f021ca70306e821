package doctor

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// contentRoot lays out a containerd root under a fresh directory that
// others may search (t.TempDir's own parent is 0700), as containerd makes
// it: the root with rootMode, the content store's directories 0755 and one
// blob 0444, the checkpoint's memory. It returns the root and the blob.
func contentRoot(t *testing.T, rootMode os.FileMode) (root, blob string) {
	t.Helper()
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	root = filepath.Join(base, "containerd")
	sha := filepath.Join(root, contentStoreDir, "blobs", "sha256")
	if err := os.MkdirAll(sha, 0o755); err != nil {
		t.Fatal(err)
	}
	blob = filepath.Join(sha, "0b5c4d0e1f7a4c559a1e3d0c2b7e9f106a1f9e2c7b3d4e8f9c0a1d2e3f4a5b6c")
	if err := os.WriteFile(blob, []byte("the container's memory"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, rootMode); err != nil {
		t.Fatal(err)
	}
	return root, blob
}

// readsAsNobody reports whether user nobody can read path, by running cat
// as nobody (setpriv), so the check's verdict is tested against the
// kernel's; skipped without root or setpriv.
func readsAsNobody(t *testing.T, path string) bool {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and setpriv (util-linux) to read as nobody")
	}
	return exec.Command(setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", "cat", path).Run() == nil
}

// TestContentStore: containerd's content store under a root of 0711 (what
// containerd made before the fix of CVE-2024-25621) is WARN, and the blob is
// in fact readable by nobody; the fix doctor prints, run as printed, makes
// it PASS and the blob unreadable; no root is SKIP.
func TestContentStore(t *testing.T) {
	root, blob := contentRoot(t, 0o711)
	c := checkContentStore(root, "--containerd-root")
	if c.Status != Warn || !c.OK || !strings.Contains(c.Evidence, "others can list "+filepath.Dir(blob)) || !strings.Contains(c.Evidence, "mode 0711") {
		t.Fatalf("root 0711, blobs 0755: %+v, want WARN (OK) saying others list and read the blobs", c)
	}
	if !readsAsNobody(t, blob) {
		t.Fatalf("the check warns, but nobody cannot read %s: the test's layout is wrong", blob)
	}
	m := regexp.MustCompile(`^chmod 700 (\S+) `).FindStringSubmatch(c.Fix)
	if m == nil || m[1] != root {
		t.Fatalf("fix names no chmod 700 of the root %s: %s", root, c.Fix)
	}
	if out, err := exec.Command("chmod", "700", m[1]).CombinedOutput(); err != nil {
		t.Fatalf("chmod 700 %s: %v\n%s", m[1], err, out)
	}
	if c := checkContentStore(root, "--containerd-root"); c.Status != Pass || !strings.Contains(c.Evidence, root+" is mode 0700") {
		t.Fatalf("after the fix: %+v, want PASS naming the root's mode", c)
	}
	if readsAsNobody(t, blob) {
		t.Fatalf("after the fix nobody still reads %s", blob)
	}

	if c := checkContentStore(filepath.Join(t.TempDir(), "none"), "containerd's default"); c.Status != Skip || !strings.Contains(c.Evidence, "no containerd root") {
		t.Errorf("no root: %+v, want SKIP", c)
	}
}

// TestContentStoreModes: what decides is every directory from / down: a
// parent that keeps others out is PASS; a blob directory others cannot list
// is still WARN (a digest is enough); a root whose content store containerd
// has not made yet is WARN (it will make it 0755); a root reached through
// a link is judged where it leads.
func TestContentStoreModes(t *testing.T) {
	t.Run("parent 0700", func(t *testing.T) {
		root, blob := contentRoot(t, 0o711)
		parent := filepath.Dir(root)
		if err := os.Chmod(parent, 0o700); err != nil {
			t.Fatal(err)
		}
		if c := checkContentStore(root, "x"); c.Status != Pass || !strings.Contains(c.Evidence, parent+" is mode 0700") {
			t.Errorf("%+v, want PASS naming %s", c, parent)
		}
		if readsAsNobody(t, blob) {
			t.Errorf("PASS, but nobody reads %s", blob)
		}
	})
	t.Run("blobs unlistable", func(t *testing.T) {
		root, blob := contentRoot(t, 0o711)
		if err := os.Chmod(filepath.Dir(blob), 0o711); err != nil {
			t.Fatal(err)
		}
		if c := checkContentStore(root, "x"); c.Status != Warn || !strings.Contains(c.Evidence, "cannot list") || !strings.Contains(c.Evidence, "whose digest they learn") {
			t.Errorf("%+v, want WARN: readable by digest", c)
		}
		if !readsAsNobody(t, blob) {
			t.Errorf("WARN, but nobody cannot read %s by its name", blob)
		}
	})
	t.Run("no content store yet", func(t *testing.T) {
		root, _ := contentRoot(t, 0o711)
		if err := os.RemoveAll(filepath.Join(root, contentStoreDir)); err != nil {
			t.Fatal(err)
		}
		if c := checkContentStore(root, "x"); c.Status != Warn || !strings.Contains(c.Evidence, "does not exist yet") {
			t.Errorf("%+v, want WARN: containerd will make it 0755", c)
		}
	})
	t.Run("blobs 0700", func(t *testing.T) {
		root, blob := contentRoot(t, 0o711)
		if err := os.Chmod(filepath.Dir(blob), 0o700); err != nil {
			t.Fatal(err)
		}
		if c := checkContentStore(root, "x"); c.Status != Pass || !strings.Contains(c.Evidence, filepath.Dir(blob)+" is mode 0700") {
			t.Errorf("%+v, want PASS naming the blob directory", c)
		}
		if readsAsNobody(t, blob) {
			t.Errorf("PASS, but nobody reads %s", blob)
		}
	})
	t.Run("no content store yet, root 0700", func(t *testing.T) {
		root, _ := contentRoot(t, 0o700)
		if err := os.RemoveAll(filepath.Join(root, contentStoreDir)); err != nil {
			t.Fatal(err)
		}
		if c := checkContentStore(root, "x"); c.Status != Pass || !strings.Contains(c.Evidence, root+" is mode 0700") {
			t.Errorf("%+v, want PASS", c)
		}
	})
	t.Run("root 0700 is PASS", func(t *testing.T) {
		root, _ := contentRoot(t, 0o700)
		if c := checkContentStore(root, "x"); c.Status != Pass {
			t.Errorf("%+v, want PASS", c)
		}
	})
	t.Run("root through a link", func(t *testing.T) {
		real, _ := contentRoot(t, 0o711)
		link := filepath.Join(t.TempDir(), "containerd")
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		if c := checkContentStore(link, "x"); c.Status != Warn {
			t.Errorf("%+v, want WARN through the link", c)
		}
		if err := os.Chmod(real, 0o700); err != nil {
			t.Fatal(err)
		}
		if c := checkContentStore(link, "x"); c.Status != Pass || !strings.Contains(c.Evidence, real+" is mode 0700") {
			t.Errorf("%+v, want PASS naming the link's target", c)
		}
	})
}

// TestContentStoreRoot: the root is --containerd-root, else the one
// containerd's config (or an import) sets, else /var/lib/containerd; Run
// reports the check with the root's source, and as not failed.
func TestContentStoreRoot(t *testing.T) {
	root, _ := contentRoot(t, 0o711)
	dir := t.TempDir()
	config := filepath.Join(dir, "config.toml")
	none := []string{filepath.Join(dir, "none.sock")}
	if err := os.WriteFile(config, []byte("version = 2\nroot = \""+root+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(Options{ContainerdConfig: config, CRISockets: none})
	if got, source := e.containerdRoot(); got != root || source != "root in "+config {
		t.Errorf("from the config: %s (%s), want %s", got, source, root)
	}
	e = newEnv(Options{ContainerdConfig: config, CRISockets: none, ContainerdRoot: "/x"})
	if got, source := e.containerdRoot(); got != "/x" || source != "--containerd-root" {
		t.Errorf("named: %s (%s)", got, source)
	}
	e = newEnv(Options{ContainerdConfig: filepath.Join(dir, "absent.toml"), CRISockets: none})
	if got, _ := e.containerdRoot(); got != DefaultContainerdRoot {
		t.Errorf("no config: %s, want %s", got, DefaultContainerdRoot)
	}

	// Through Run: a WARN fails nothing, and Write prints its fix.
	checks := newEnv(Options{ContainerdConfig: config, CRISockets: none}).run(only(CheckContentStore))
	c := find(t, checks, CheckContentStore)
	if c.Status != Warn || Failed(checks) || !strings.Contains(c.Evidence, "root in "+config) {
		t.Fatalf("%+v", c)
	}
	if out := dump(checks); !strings.Contains(out, "WARN "+CheckContentStore+": ") || !strings.Contains(out, "     fix: chmod 700 "+root) {
		t.Errorf("Write:\n%s", out)
	}
}
