package cdispec

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gantry-gpu/gantry/internal/edits"
)

// Which hooks are old: the gantry CLI or nvidia-ctk hook with no env. A
// gantry hook that has an env, another vendor's hook and nvidia-cdi-hook
// are left alone, and a link to a spec found is read once; a file that is not a spec is an error of
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

const oldSpecBody = `cdiVersion: 0.5.0
kind: example.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/null
containerEdits:
  hooks:
  - hookName: createContainer
    path: /usr/bin/gantry
    args: [gantry, hook, update-ldcache, --folder, /usr/lib]
`

// loadedHooks is what the CNCF CDI library (as engines use it) loads from
// dir for example.com/gpu=0: its spec-wide hooks.
func loadedHooks(t *testing.T, dir string) []string {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	d := cache.GetDevice("example.com/gpu=0")
	if d == nil {
		t.Fatalf("the CDI library loads no example.com/gpu=0 from %s: %v", dir, cache.GetErrors())
	}
	var out []string
	for _, h := range d.GetSpec().ContainerEdits.Hooks {
		out = append(out, h.Path+" "+strings.Join(h.Args, " ")+" env="+strings.Join(h.Env, ","))
	}
	return out
}

// A spec in a spec directory that is a link to a file (NixOS writes
// /etc/cdi's specs so) is loaded by the CDI library the engines use, so
// fix-hooks and doctor find it: its target is rewritten in place when the
// target's directories are root's alone, else the link is replaced by the
// rewritten spec and kept as the backup. Review of sec1: links were
// skipped, found nothing, reported nothing.
func TestOldSpecBehindLink(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: root-owned directories")
	}
	hook := func(string) (string, error) { return "/opt/gantry/bin/gantry-cdi-hook", nil }
	for _, tc := range []struct {
		name    string
		perm    os.FileMode // of the target's directory
		inPlace bool
	}{
		{"target dir root's", 0o755, true},
		{"target dir writable by others", 0o777, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, store := t.TempDir(), filepath.Join(t.TempDir(), "store")
			if err := os.Mkdir(store, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(store, tc.perm); err != nil {
				t.Fatal(err)
			}
			target := filepath.Join(store, "gpu.yaml")
			if err := os.WriteFile(target, []byte(oldSpecBody), 0o644); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(dir, "gpu.yaml")
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			if h := loadedHooks(t, dir); !strings.Contains(h[0], "/usr/bin/gantry gantry hook") {
				t.Fatalf("the library loads %q", h)
			}
			found, errs := FindOldSpecs([]string{dir})
			if len(found) != 1 || len(errs) != 0 || found[0].Path != link || found[0].Target != target {
				t.Fatalf("FindOldSpecs: %+v %v", found, errs)
			}
			written, backup, err := RewriteOldSpecFile(found[0], hook)
			if err != nil {
				t.Fatal(err)
			}
			if h := loadedHooks(t, dir); len(h) != 1 || h[0] != "/opt/gantry/bin/gantry-cdi-hook gantry-cdi-hook update-ldcache --folder /usr/lib env="+edits.HookPATH {
				t.Errorf("after the rewrite the library loads %q", h)
			}
			st, err := os.Lstat(link)
			if err != nil {
				t.Fatal(err)
			}
			orig, _ := os.ReadFile(target)
			if tc.inPlace {
				if written != target || backup != target+".bak" || st.Mode()&os.ModeSymlink == 0 {
					t.Errorf("wrote %s, backup %s, link %v", written, backup, st.Mode())
				}
			} else {
				if written != link || backup != link+".bak" || !st.Mode().IsRegular() || string(orig) != oldSpecBody {
					t.Errorf("wrote %s, backup %s, link now %v, target %q", written, backup, st.Mode(), orig)
				}
				if dest, err := os.Readlink(backup); err != nil || dest != target {
					t.Errorf("backup %s: %q %v, want the link to %s", backup, dest, err, target)
				}
			}
			if found, errs := FindOldSpecs([]string{dir}); len(found) != 0 || len(errs) != 0 {
				t.Errorf("after the rewrite: %+v %v", found, errs)
			}
		})
	}
}

// Hooks named by a relative path: a runtime resolves one in the
// container's root filesystem (runc's cwd for hooks is the rootfs) and
// runs the image's file as root on the host. The hook programs Gantry
// knows are rewritten to the absolute gantry-cdi-hook; any other is an
// error naming it, and Validate refuses them all.
func TestRelativeHookPaths(t *testing.T) {
	if HookBeside("gantry") != "" || HookBeside("bin/gantry") != "" {
		t.Error("HookBeside gave a path for a relative gantry")
	}
	hookPath := func(g string) (string, error) {
		if p := HookBeside(g); p != "" {
			return p, nil
		}
		return "/usr/bin/gantry-cdi-hook", nil
	}
	for _, tc := range []struct{ path, args, env, want string }{
		{"gantry", "gantry, hook, update-ldcache, --folder, /usr/lib", "", "gantry-cdi-hook update-ldcache --folder /usr/lib"},
		{"nvidia-ctk", "nvidia-ctk, hook, create-symlinks, --link, a::/b", "", "gantry-cdi-hook create-symlinks --link a::/b"},
		{"gantry-cdi-hook", "gantry-cdi-hook, update-ldcache", "PATH=/bin", "gantry-cdi-hook update-ldcache"},
		{"./nvidia-cdi-hook", "nvidia-cdi-hook, update-ldcache", "", "gantry-cdi-hook update-ldcache"},
	} {
		spec, err := cdi.ParseSpec([]byte(strings.Replace(oldSpecBody, "    path: /usr/bin/gantry\n    args: [gantry, hook, update-ldcache, --folder, /usr/lib]\n",
			"    path: "+tc.path+"\n    args: ["+tc.args+"]\n    env: ["+tc.env+"]\n", 1)))
		if err != nil {
			t.Fatal(err)
		}
		if err := Validate(spec); err == nil || !strings.Contains(err.Error(), "relative path") {
			t.Errorf("%s: Validate: %v", tc.path, err)
		}
		if old := OldHooks(spec); len(old) != 1 || old[0].Why != whyRelative {
			t.Errorf("%s: OldHooks %v", tc.path, old)
		}
		n, err := FixOldHooks(spec, hookPath)
		h := spec.ContainerEdits.Hooks[0]
		if err != nil || n != 1 || h.Path != "/usr/bin/gantry-cdi-hook" || strings.Join(h.Args, " ") != tc.want || strings.Join(h.Env, " ") != edits.HookPATH {
			t.Errorf("%s: %d %v: %s %q %q", tc.path, n, err, h.Path, h.Args, h.Env)
		}
		if err := Validate(spec); err != nil {
			t.Errorf("%s: the rewritten spec: %v", tc.path, err)
		}
	}

	dir := t.TempDir()
	p := filepath.Join(dir, "evil.yaml")
	body := strings.Replace(oldSpecBody, "path: /usr/bin/gantry\n    args: [gantry, hook, update-ldcache, --folder, /usr/lib]", "path: evilhook\n    args: [evilhook]\n    env: [PATH=/bin]", 1)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	found, errs := FindOldSpecs([]string{dir})
	if len(found) != 1 || len(errs) != 0 || !strings.Contains(found[0].Hooks[0].String(), "relative path") {
		t.Fatalf("FindOldSpecs: %+v %v", found, errs)
	}
	if _, err := RewriteOldSpec(found[0], hookPath); err == nil || !strings.Contains(err.Error(), `the relative path "evilhook"`) {
		t.Errorf("RewriteOldSpec: %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != body {
		t.Errorf("the spec changed:\n%s", b)
	}
	if _, err := os.Stat(p + ".bak"); err == nil {
		t.Error("a backup was left")
	}
}

// The old forms under other spellings: nvidia-ctk with global flags before
// hook, gantry installed under another name (cdi.hook-path). Review of
// sec1: both were missed.
func TestOldHooksOtherSpellings(t *testing.T) {
	dir := t.TempDir()
	beside := filepath.Join(dir, "bin")
	if err := os.Mkdir(beside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(beside, "gantry-cdi-hook"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, args, wantPath, wantArgs string }{
		{"/usr/bin/nvidia-ctk", "nvidia-ctk, --debug, hook, update-ldcache", "/usr/bin/nvidia-ctk", "nvidia-ctk --debug hook update-ldcache"},
		{beside + "/gantry-0.3", "gantry-0.3, hook, update-ldcache, --folder, /usr/lib", beside + "/gantry-cdi-hook", "gantry-cdi-hook update-ldcache --folder /usr/lib"},
		{"/opt/x/gantry", "gantry, --debug, hook, create-symlinks", "/usr/bin/gantry-cdi-hook", "gantry-cdi-hook create-symlinks"},
	} {
		spec, err := cdi.ParseSpec([]byte(strings.Replace(oldSpecBody, "    path: /usr/bin/gantry\n    args: [gantry, hook, update-ldcache, --folder, /usr/lib]\n",
			"    path: "+tc.path+"\n    args: ["+tc.args+"]\n", 1)))
		if err != nil {
			t.Fatal(err)
		}
		n, err := FixOldHooks(spec, func(g string) (string, error) {
			if p := HookBeside(g); p != "" {
				return p, nil
			}
			return "/usr/bin/gantry-cdi-hook", nil
		})
		h := spec.ContainerEdits.Hooks[0]
		if err != nil || n != 1 || h.Path != tc.wantPath || strings.Join(h.Args, " ") != tc.wantArgs || strings.Join(h.Env, " ") != edits.HookPATH {
			t.Errorf("%s %s: %d %v: rewritten as %s %q %q", tc.path, tc.args, n, err, h.Path, h.Args, h.Env)
		}
	}
}

// The rewrite keeps the spec's mode and owner (an administrator's 0640
// spec of group gpu stays so). Review of sec1: it became 0644 root:root.
func TestRewriteKeepsModeAndOwner(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: chown")
	}
	p := filepath.Join(t.TempDir(), "gpu.yaml")
	if err := os.WriteFile(p, []byte(oldSpecBody), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	found, _ := FindOldSpecs([]string{p})
	if len(found) != 1 {
		t.Fatalf("found %+v", found)
	}
	if _, err := RewriteOldSpec(found[0], func(string) (string, error) { return "/usr/bin/gantry-cdi-hook", nil }); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if st.Mode().Perm() != 0o640 || sys.Uid != 1234 || sys.Gid != 5678 {
		t.Errorf("rewritten spec: mode %v owner %d:%d, want 0640 1234:5678", st.Mode().Perm(), sys.Uid, sys.Gid)
	}
}
