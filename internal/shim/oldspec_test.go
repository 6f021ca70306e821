package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/edits"
)

// Issue 27 item 2: a CDI spec written before gantry-cdi-hook existed runs
// `gantry hook update-ldcache|create-symlinks` with no env. An engine that
// injects it itself (containerd, CRI-O, Podman: the CNCF library, as here)
// hands runc a createContainer hook without env, which runc before 1.2 runs
// with the image's environment: LD_PRELOAD=/proc/self/cwd/evil.so is loaded
// by gantry's dynamic loader as host root. What prevents it is the spec
// changing: `gantry cdi fix-hooks` rewrites the hooks to the static
// gantry-cdi-hook with an explicit env (a backup kept), after which no
// runtime hands the hook the image's environment and no loader runs.
//
// Per low-level runtime, run directly on the injected config.json (no
// gantry-runtime, which gives env-less hooks an env of its own):
//   - the old spec: where the runtime passes the image's environment (runc
//     1.1.5), evil.so runs (the attack, reproduced) and `gantry hook`
//     refuses to go on, so the container fails naming the fix; elsewhere it
//     runs, no mark;
//   - the same spec after gantry cdi fix-hooks: the container runs, its hooks
//     did their work, and evil.so never ran.
func TestOldCDISpecRewritten(t *testing.T) { eachRuntime(t, testOldCDISpecRewritten) }

func testOldCDISpecRewritten(t *testing.T) {
	f := need(t)
	if !dynamic(t, f.gantry) {
		t.Fatalf("%s is statically linked: the attack would prove nothing", f.gantry)
	}
	hostMark := filepath.Join(t.TempDir(), "evil-was-loaded")
	src := filepath.Join(t.TempDir(), "evil.c")
	if err := os.WriteFile(src, []byte(escapeSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	evil := filepath.Join(t.TempDir(), "evil.so")
	if err := run("gcc", "-shared", "-fPIC", "-DHOSTMARK=\""+hostMark+"\"", "-o", evil, src); err != nil {
		t.Fatal(err)
	}
	evilBytes, err := os.ReadFile(evil)
	if err != nil {
		t.Fatal(err)
	}

	// The old spec: what gantry cdi generate wrote with the hook in the
	// gantry CLI, before hooks had an env.
	specDir := t.TempDir()
	specFile := filepath.Join(specDir, "gpu.yaml")
	cfg := filepath.Join(t.TempDir(), "gantry.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("gpus = \"sim:h100x8\"\ndriver-root = %q\n[runtime]\ncache-dir = %q\n[cdi]\nhook-path = %q\n", f.driver.Root, filepath.Join(specDir, "cache"), f.gantry)), 0o644); err != nil {
		t.Fatal(err)
	}
	gen := exec.Command(f.gantry, "cdi", "generate", "--kind", "example.com/gpu", "--output", specFile)
	gen.Env = append(os.Environ(), "GANTRY_CONFIG="+cfg)
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("gantry cdi generate: %v\n%s", err, out)
	}
	spec, err := cdi.ReadSpec(specFile, 0)
	if err != nil {
		t.Fatal(err)
	}
	old := spec.Spec
	nOld := 0
	for _, e := range append([]*cdispecs.ContainerEdits{&old.ContainerEdits}, devEdits(old)...) {
		for _, h := range e.Hooks {
			if h.Args[1] != "hook" {
				t.Fatalf("generated hook %q: want the gantry hook form", h.Args)
			}
			h.Env = nil
			nOld++
		}
	}
	b, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(specFile)
	specFile = filepath.Join(specDir, "gpu.json")
	if err := os.WriteFile(specFile, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// attempt injects the spec in specDir as an engine does and runs the
	// low-level runtime on it, with the hostile image environment.
	attempt := func(t *testing.T) (marks []string, out, stderr string, err error) {
		c := newContainer(t, opts{
			env:  []string{"LD_PRELOAD=/proc/self/cwd/evil.so", "LD_LIBRARY_PATH=/proc/self/cwd/evil-libs", "GCONV_PATH=/proc/self/cwd/evil-gconv"},
			args: []string{"sh", "-c", "readlink " + libDir + "/libcuda.so.1"},
			mutate: func(r string) {
				os.Remove(filepath.Join(r, "evil.so"))
				if err := os.WriteFile(filepath.Join(r, "evil.so"), evilBytes, 0o755); err != nil {
					t.Fatal(err)
				}
			},
		})
		cache, err := cdi.NewCache(cdi.WithSpecDirs(specDir), cdi.WithAutoRefresh(false))
		if err != nil {
			t.Fatal(err)
		}
		var oci ocispecs.Spec
		if err := json.Unmarshal(c.configJSON(), &oci); err != nil {
			t.Fatal(err)
		}
		if unresolved, err := cache.InjectDevices(&oci, "example.com/gpu=0"); err != nil {
			t.Fatalf("CDI injection: %v (unresolved %v)", err, unresolved)
		}
		cj, _ := json.MarshalIndent(&oci, "", "\t")
		if err := os.WriteFile(filepath.Join(c.bundle, "config.json"), cj, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(c.low, "--root", c.state, "run", "--bundle", c.bundle, c.id)
		t.Cleanup(func() { exec.Command(c.low, "--root", c.state, "delete", "--force", c.id).Run() })
		var ob, eb strings.Builder
		cmd.Stdout, cmd.Stderr = &ob, &eb
		err = cmd.Run()
		for _, m := range []string{hostMark, filepath.Join(c.rootfs, "evil-rootfs-mark")} {
			if _, serr := os.Lstat(m); serr == nil {
				marks = append(marks, m)
			}
		}
		os.Remove(hostMark)
		return marks, ob.String(), eb.String(), err
	}

	t.Run("old spec", func(t *testing.T) {
		marks, out, stderr, err := attempt(t)
		if len(marks) == 0 {
			t.Logf("%s does not hand an env-less hook the image's environment: no mark (container: %v %q)", filepath.Base(runtimeFor(t, f)), err, out)
			if err != nil {
				t.Errorf("the old spec's container failed on a runtime that gives the hook no image environment: %v\n%s", err, stderr)
			}
			return
		}
		// The attack reproduced: the loader of gantry ran evil.so as root.
		t.Logf("attack reproduced on %s: evil.so left %q", filepath.Base(runtimeFor(t, f)), marks)
		if err == nil || !strings.Contains(stderr, "refusing to run") || !strings.Contains(stderr, "gantry cdi fix-hooks") {
			t.Errorf("gantry hook ran on with the image's loader variables: %v\n%s", err, stderr)
		}
	})

	t.Run("after gantry cdi fix-hooks", func(t *testing.T) {
		fix := exec.Command(f.gantry, "cdi", "fix-hooks", specDir)
		out, err := fix.CombinedOutput()
		if err != nil {
			t.Fatalf("gantry cdi fix-hooks: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "rewrote "+specFile) {
			t.Errorf("fix-hooks said %q", out)
		}
		if _, err := os.Stat(specFile + ".bak"); err != nil {
			t.Errorf("no backup: %v", err)
		}
		fixed, err := cdi.ReadSpec(specFile, 0)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range append([]*cdispecs.ContainerEdits{&fixed.Spec.ContainerEdits}, devEdits(fixed.Spec)...) {
			for _, h := range e.Hooks {
				n++
				if h.Path != filepath.Join(filepath.Dir(f.gantry), "gantry-cdi-hook") || h.Args[0] != "gantry-cdi-hook" || strings.Join(h.Env, " ") != strings.Join(edits.HookEnv(), " ") {
					t.Errorf("rewritten hook %s %q env %q", h.Path, h.Args, h.Env)
				}
			}
		}
		if n != nOld {
			t.Errorf("%d hooks after the rewrite, %d before", n, nOld)
		}
		marks, cout, stderr, err := attempt(t)
		if len(marks) > 0 {
			t.Fatalf("the image's LD_PRELOAD ran in a hook of the rewritten spec: %q\n%s", marks, stderr)
		}
		if err != nil {
			t.Fatalf("run: %v\n%s", err, stderr)
		}
		if !strings.HasPrefix(strings.TrimSpace(cout), "libcuda.so.") {
			t.Errorf("the create-symlinks hook did not run: container said %q", cout)
		}
		// Once is enough: a second run finds nothing to change.
		again, err := exec.Command(f.gantry, "cdi", "fix-hooks", specDir).CombinedOutput()
		if err != nil || !strings.Contains(string(again), "no CDI spec") {
			t.Errorf("second fix-hooks: %v %s", err, again)
		}
	})
}

func devEdits(s *cdispecs.Spec) []*cdispecs.ContainerEdits {
	var out []*cdispecs.ContainerEdits
	for i := range s.Devices {
		out = append(out, &s.Devices[i].ContainerEdits)
	}
	return out
}

// make install rewrites the old specs in /etc/cdi and /var/run/cdi (under
// DESTDIR here) to run the gantry-cdi-hook it installs under PREFIX, with
// the fixed env, keeping each original as FILE.bak; a spec with no old hook
// (another vendor's, whose hook has an env) is left byte for byte.
func TestMakeInstallRewritesOldSpecs(t *testing.T) {
	f := need(t)
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	dest := t.TempDir()
	bin := filepath.Join(dest, "usr/bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(f.gantry, filepath.Join(bin, "gantry")); err != nil {
		t.Fatal(err)
	}
	oldSpec := `cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  hooks:
  - hookName: createContainer
    path: /usr/bin/gantry
    args: [gantry, hook, create-symlinks, --link, "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"]
  - hookName: createContainer
    path: /usr/bin/gantry
    args: [gantry, hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, chmod, --mode, "755", --path, /dev/dri]
`
	other := `cdiVersion: 0.5.0
kind: example.com/fpga
devices:
- name: f0
  containerEdits:
    hooks:
    - hookName: createContainer
      path: /usr/bin/fpga-hook
      args: [fpga-hook]
      env: [A=1]
`
	files := map[string]string{"etc/cdi/nvidia.yaml": oldSpec, "var/run/cdi/nvidia.json": "", "etc/cdi/fpga.yaml": other}
	for name, body := range files {
		p := filepath.Join(dest, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if body == "" {
			s, err := cdi.ParseSpec([]byte(oldSpec))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(s)
			body = string(b)
			files[name] = body
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dry, err := exec.Command("make", "-C", "../..", "-n", "install").CombinedOutput()
	if err != nil || !strings.Contains(string(dry), "install-cdi-fix") {
		t.Errorf("make -n install does not rewrite old specs: %v\n%s", err, dry)
	}
	out, err := exec.Command("make", "-C", "../..", "install-cdi-fix", "DESTDIR="+dest, "PREFIX=/usr").CombinedOutput()
	if err != nil {
		t.Fatalf("make install-cdi-fix: %v\n%s", err, out)
	}
	for _, name := range []string{"etc/cdi/nvidia.yaml", "var/run/cdi/nvidia.json"} {
		p := filepath.Join(dest, name)
		if b, err := os.ReadFile(p + ".bak"); err != nil || string(b) != files[name] {
			t.Errorf("%s.bak: %v, not the original", name, err)
		}
		s, err := cdi.ReadSpec(p, 0)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		hooks := s.Spec.ContainerEdits.Hooks
		if len(hooks) != 3 {
			t.Fatalf("%s: %d hooks", name, len(hooks))
		}
		want := [][]string{
			{"/usr/bin/gantry-cdi-hook", "gantry-cdi-hook create-symlinks --link libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"},
			{"/usr/bin/gantry-cdi-hook", "gantry-cdi-hook update-ldcache --folder /usr/lib/x86_64-linux-gnu"},
			{"/usr/bin/nvidia-ctk", "nvidia-ctk hook chmod --mode 755 --path /dev/dri"},
		}
		for i, h := range hooks {
			if h.Path != want[i][0] || strings.Join(h.Args, " ") != want[i][1] || strings.Join(h.Env, " ") != edits.HookPATH {
				t.Errorf("%s hook %d: %s %q env %q, want %s %q env %s", name, i, h.Path, h.Args, h.Env, want[i][0], want[i][1], edits.HookPATH)
			}
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "etc/cdi/fpga.yaml")); string(b) != other {
		t.Errorf("another vendor's spec changed:\n%s", b)
	}
	if _, err := os.Stat(filepath.Join(dest, "etc/cdi/fpga.yaml.bak")); err == nil {
		t.Errorf("a backup of a spec that needed no change")
	}
}
