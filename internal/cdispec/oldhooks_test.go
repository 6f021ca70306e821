package cdispec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/edits"
)

// Which hooks are old: the gantry CLI or nvidia-ctk hook with no env. A
// gantry hook that has an env, another vendor's hook, nvidia-cdi-hook and a
// link to a spec are left alone; a file that is not a spec is an error of
// its own and the search goes on.
func TestFindOldSpecs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hook := func(path, args, env string) string {
		s := "  - hookName: createContainer\n    path: " + path + "\n    args: [" + args + "]\n"
		if env != "" {
			s += "    env: [" + env + "]\n"
		}
		return s
	}
	spec := func(hooks ...string) string {
		return "cdiVersion: 0.5.0\nkind: example.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/null\ncontainerEdits:\n  hooks:\n" + strings.Join(hooks, "")
	}
	old := write("old.yaml", spec(hook("/usr/local/bin/gantry", "gantry, hook, update-ldcache, --folder, /usr/lib", ""),
		hook("/usr/bin/nvidia-ctk", "nvidia-ctk, hook, create-symlinks, --link, a::/b", ""),
		hook("/usr/bin/fpga-hook", "fpga-hook", "")))
	write("withenv.yaml", spec(hook("/usr/bin/gantry", "gantry, hook, update-ldcache", "PATH=/bin")))
	write("static.yaml", spec(hook("/usr/bin/nvidia-cdi-hook", "nvidia-cdi-hook, update-ldcache", "")))
	write("ctk-other.yaml", spec(hook("/usr/bin/nvidia-ctk", "nvidia-ctk, cdi, list", "")))
	write("broken.yaml", "not: [a spec")
	write("ignored.txt", spec(hook("/usr/bin/gantry", "gantry, hook, update-ldcache", "")))
	if err := os.Symlink(old, filepath.Join(dir, "link.yaml")); err != nil {
		t.Fatal(err)
	}
	found, errs := FindOldSpecs([]string{dir, filepath.Join(dir, "missing")})
	if len(found) != 1 || found[0].Path != old || len(found[0].Hooks) != 2 {
		t.Fatalf("found %+v", found)
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "broken.yaml") {
		t.Errorf("errors %v, want broken.yaml's", errs)
	}
	n, err := FixOldHooks(found[0].Spec, func(g string) (string, error) { return filepath.Join(filepath.Dir(g), "gantry-cdi-hook"), nil })
	if err != nil || n != 2 {
		t.Fatalf("FixOldHooks: %d %v", n, err)
	}
	hs := found[0].Spec.ContainerEdits.Hooks
	if hs[0].Path != "/usr/local/bin/gantry-cdi-hook" || strings.Join(hs[0].Args, " ") != "gantry-cdi-hook update-ldcache --folder /usr/lib" || strings.Join(hs[0].Env, " ") != edits.HookPATH {
		t.Errorf("gantry hook rewritten as %s %q %q", hs[0].Path, hs[0].Args, hs[0].Env)
	}
	if hs[1].Path != "/usr/bin/nvidia-ctk" || hs[1].Args[1] != "hook" || strings.Join(hs[1].Env, " ") != edits.HookPATH {
		t.Errorf("nvidia-ctk hook rewritten as %s %q %q", hs[1].Path, hs[1].Args, hs[1].Env)
	}
	if len(hs[2].Env) != 0 {
		t.Errorf("another vendor's hook changed: %q", hs[2].Env)
	}
}
