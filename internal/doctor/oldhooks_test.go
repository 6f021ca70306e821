package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/cdispec"
)

// A spec written before gantry-cdi-hook existed (issue 27.2), of any kind,
// in a configured spec directory: doctor FAILs naming the file, its hooks
// and the command that rewrites it; after that rewrite (what the command
// runs) it passes, and the hooks run the static hook with an env.
func TestOldCDIHooks(t *testing.T) {
	h := newHost(t)
	expect(t, Run(h.opts), CheckOldCDIHooks, Pass, []string{"no spec in " + h.opts.Config.CDI.SpecDirs[0]}, "")

	path := filepath.Join(h.opts.Config.CDI.SpecDirs[0], "old-gpu.yaml")
	h.write(t, path, `cdiVersion: 0.5.0
kind: example.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    hooks:
    - hookName: createContainer
      path: /usr/bin/gantry
      args: [gantry, hook, create-symlinks, --link, "libcuda.so.1::/usr/lib/libcuda.so"]
containerEdits:
  hooks:
  - hookName: createContainer
    path: /usr/bin/gantry
    args: [gantry, hook, update-ldcache, --folder, /usr/lib]
`)
	c := expect(t, Run(h.opts), CheckOldCDIHooks, Fail,
		[]string{path, "device 0 createContainer gantry hook create-symlinks", "spec-wide createContainer gantry hook update-ldcache", "LD_PRELOAD"},
		"sudo gantry cdi fix-hooks "+path)
	t.Log(c.Evidence)

	found, errs := cdispec.FindOldSpecs(h.opts.Config.CDI.SpecDirs)
	if len(found) != 1 || len(errs) != 0 {
		t.Fatalf("FindOldSpecs: %v %v", found, errs)
	}
	hook := filepath.Join(h.bin, "gantry-cdi-hook")
	backup, err := cdispec.RewriteOldSpec(found[0], func(string) (string, error) { return hook, nil })
	if err != nil || backup != path+".bak" {
		t.Fatalf("RewriteOldSpec: %q %v", backup, err)
	}
	expect(t, Run(h.opts), CheckOldCDIHooks, Pass, nil, "")
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), hook) || strings.Contains(string(b), "/usr/bin/gantry\n") || !strings.Contains(string(b), "PATH=") {
		t.Errorf("rewritten spec:\n%s", b)
	}
}

// Specs doctor must not pass: an old spec reached through a link (NixOS's
// /etc/cdi; the CDI library engines use follows it), a hook named by a
// relative path (runc runs the image's file of that name as host root),
// and a spec it cannot read (its hooks are unknown). Review of sec1: the
// link and the unreadable spec passed.
func TestOldCDIHooksLinksRelativeUnreadable(t *testing.T) {
	h := newHost(t)
	dir := h.opts.Config.CDI.SpecDirs[0]
	spec := func(kind, path, args, env string) string {
		return "cdiVersion: 0.5.0\nkind: example.com/" + kind + "\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/null\ncontainerEdits:\n  hooks:\n  - hookName: createContainer\n    path: " + path + "\n    args: [" + args + "]\n    env: [" + env + "]\n"
	}
	store := filepath.Join(t.TempDir(), "gpu.yaml")
	if err := os.WriteFile(store, []byte(spec("linked", "/usr/bin/gantry", "gantry, hook, update-ldcache", "")), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "linked.yaml")
	if err := os.Symlink(store, link); err != nil {
		t.Fatal(err)
	}
	expect(t, Run(h.opts), CheckOldCDIHooks, Fail, []string{link, "spec-wide createContainer gantry hook update-ldcache"}, "sudo gantry cdi fix-hooks "+link)
	os.Remove(link)

	rel := filepath.Join(dir, "relative.yaml")
	h.write(t, rel, spec("relative", "evilhook", "evilhook", "PATH=/bin"))
	expect(t, Run(h.opts), CheckOldCDIHooks, Fail, []string{rel, "relative path"}, "")
	os.Remove(rel)

	broken := filepath.Join(dir, "broken.yaml")
	h.write(t, broken, "not: [a spec")
	expect(t, Run(h.opts), CheckOldCDIHooks, Fail, []string{broken, "cannot tell whether its hooks are old"}, "")
}
