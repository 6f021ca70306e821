package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// gantry cdi fix-hooks handles what engines load: a spec that is a link
// (NixOS) is rewritten, a relative hook path to gantry is made the absolute
// gantry-cdi-hook, and what it cannot handle (a relative path to another
// program, a spec it cannot read) is an error naming it, exit status 1.
// Review of sec1: the link was skipped with "no CDI spec ... has hooks of
// the old forms", exit 0.
func TestFixHooksLinksAndFailures(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the link's target must be in root's directories")
	}
	spec := func(kind, path, args string) string {
		return "cdiVersion: 0.5.0\nkind: example.com/" + kind + "\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/null\ncontainerEdits:\n  hooks:\n  - hookName: createContainer\n    path: " + path + "\n    args: [" + args + "]\n"
	}
	dir, store := t.TempDir(), t.TempDir()
	target := filepath.Join(store, "link.yaml")
	if err := os.WriteFile(target, []byte(spec("link", "/usr/bin/gantry", "gantry, hook, update-ldcache")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "link.yaml")); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run("cdi", "fix-hooks", "--hook-path", "/usr/bin/gantry-cdi-hook", dir)
	if code != 0 || !strings.Contains(out, "rewrote "+target+" ("+filepath.Join(dir, "link.yaml")+" links to it)") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if b, _ := os.ReadFile(target); !strings.Contains(string(b), "path: /usr/bin/gantry-cdi-hook") {
		t.Errorf("the target:\n%s", b)
	}

	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("relative.yaml", spec("relative", "gantry", "gantry, hook, update-ldcache"))
	write("evil.yaml", spec("evil", "evilhook", "evilhook"))
	write("broken.yaml", "not: [a spec")
	out, errOut, code = run("cdi", "fix-hooks", "--hook-path", "/usr/bin/gantry-cdi-hook", dir)
	if code != 1 || !strings.Contains(out, "rewrote "+filepath.Join(dir, "relative.yaml")) ||
		!strings.Contains(errOut, `the relative path "evilhook"`) || !strings.Contains(errOut, "broken.yaml") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "relative.yaml")); !strings.Contains(string(b), "path: /usr/bin/gantry-cdi-hook") {
		t.Errorf("relative.yaml:\n%s", b)
	}
	t.Logf("%s%s", out, errOut)
}
