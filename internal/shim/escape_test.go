package shim

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/edits"
)

// escapeSrc is the library a hostile image names in LD_PRELOAD for the
// CVE-2025-23266 attack: runc runs a createContainer hook inside the
// container's mount namespace before pivot_root, with the working
// directory in the image, so /proc/self/cwd/evil.so is the image's file and
// the host's paths are still visible. Loaded anywhere, it leaves two marks:
// HOSTMARK, an absolute host path the container cannot see, and
// evil-rootfs-mark relative to its working directory (the image's root,
// both for a hook and for the container's own process).
const escapeSrc = `#include <stdio.h>
static void leave(const char *p) {
	FILE *f = fopen(p, "w");
	if (f) { fputs("loaded", f); fclose(f); }
}
__attribute__((constructor)) static void mark(void) {
	leave(HOSTMARK);
	leave("evil-rootfs-mark");
}
`

// hostileTOML is the configuration an image offers through GANTRY_CONFIG: a
// hook that read it would fail (an unknown GPU backend), so a container that
// starts shows it was not read.
const hostileTOML = `gpus = "opencl"
driver-root = "/proc/self/cwd"
[cdi]
hook-path = "/proc/self/cwd/evil"
`

// The CDI hook escape, end to end through real runc: an image whose
// environment has LD_PRELOAD=/proc/self/cwd/evil.so, LD_LIBRARY_PATH and
// GCONV_PATH into the image and GANTRY_CONFIG at its own file or /dev/zero
// consumes a spec `gantry cdi generate` wrote. The spec's kind is not
// gantry-runtime's own (example.com/gpu), so the name in the cdi.k8s.io
// annotation goes through its CDI injection (the CNCF library), and runc
// runs the spec's createContainer hooks, as every CDI engine does. Two hook
// binaries: the static gantry-cdi-hook, and the dynamically linked gantry
// CLI of older specs (`gantry hook ...`), where the spec's explicit env
// alone must keep the loader from reading LD_PRELOAD.
//
// The hooks run (the container finds libcuda through its SONAME link, its
// ld.so.cache lists it), evil.so never runs (no mark on the host, none in
// the image), and the host directory is unchanged.
func TestCDIHooksIgnoreImageEnv(t *testing.T) { eachRuntime(t, testCDIHooksIgnoreImageEnv) }

func testCDIHooksIgnoreImageEnv(t *testing.T) {
	f := need(t)
	if !dynamic(t, f.gantry) {
		t.Fatalf("%s is statically linked: its LD_PRELOAD case would prove nothing", f.gantry)
	}
	hostDir := filepath.Join(t.TempDir(), "host-only")
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostDir, "precious"), []byte("host file"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostMark := filepath.Join(hostDir, "evil-was-loaded")
	src := filepath.Join(t.TempDir(), "evil.c")
	if err := os.WriteFile(src, []byte(escapeSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	evil := filepath.Join(t.TempDir(), "evil.so")
	if err := run("gcc", "-shared", "-fPIC", "-DHOSTMARK=\""+hostMark+"\"", "-o", evil, src); err != nil {
		t.Fatal(err)
	}
	imageEnv := func(config string) []string {
		return []string{
			"LD_PRELOAD=/proc/self/cwd/evil.so",
			"LD_LIBRARY_PATH=/proc/self/cwd/evil-libs:/proc/self/cwd",
			"GCONV_PATH=/proc/self/cwd/evil-gconv",
			"GANTRY_CONFIG=" + config,
		}
	}
	addEvil := func(r string) {
		for _, d := range []string{"evil-libs", "evil-gconv", "etc"} {
			if err := os.MkdirAll(filepath.Join(r, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		b, err := os.ReadFile(evil)
		if err != nil {
			t.Fatal(err)
		}
		// The bundle's root is a hard-linked copy of the fixture's image,
		// which has an evil.so of its own: replace the link, never write
		// through it.
		os.Remove(filepath.Join(r, "evil.so"))
		if err := os.WriteFile(filepath.Join(r, "evil.so"), b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r, "etc/gantry-evil.toml"), []byte(hostileTOML), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	marks := func(rootfs string) []string {
		var found []string
		for _, m := range []string{hostMark, filepath.Join(rootfs, "evil-rootfs-mark")} {
			if _, err := os.Lstat(m); err == nil {
				found = append(found, m)
			}
		}
		return found
	}

	// The control: evil.so does leave both marks when a dynamically
	// linked program on the host loads it the way a hook would (working
	// directory in the image, the image's LD_PRELOAD).
	ctl := t.TempDir()
	addEvil(ctl)
	cmd := exec.Command(f.gantry, "--version")
	cmd.Dir, cmd.Env = ctl, imageEnv("/dev/null")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("control: %v\n%s", err, out)
	}
	if got := marks(ctl); len(got) != 2 {
		t.Fatalf("control failed: evil.so left marks %q, want both: the test proves nothing", got)
	}
	os.Remove(hostMark)
	before := snapshot(t, hostDir)

	for _, form := range []struct{ name, hookPath string }{
		{"gantry-cdi-hook", ""}, // the default: beside gantry
		{"gantry hook", f.gantry},
	} {
		t.Run(form.name, func(t *testing.T) {
			specDir := t.TempDir()
			cfg := filepath.Join(t.TempDir(), "gantry.toml")
			conf := fmt.Sprintf("gpus = \"sim:h100x8\"\ndriver-root = %q\n[runtime]\ncache-dir = %q\n", f.driver.Root, filepath.Join(specDir, "cache"))
			if form.hookPath != "" {
				conf += fmt.Sprintf("[cdi]\nhook-path = %q\n", form.hookPath)
			}
			if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
				t.Fatal(err)
			}
			gen := exec.Command(f.gantry, "cdi", "generate", "--kind", "example.com/gpu", "--output", filepath.Join(specDir, "gpu.yaml"))
			gen.Env = append(os.Environ(), "GANTRY_CONFIG="+cfg)
			if out, err := gen.CombinedOutput(); err != nil {
				t.Fatalf("gantry cdi generate: %v\n%s", err, out)
			}
			for _, config := range []string{"/proc/self/cwd/etc/gantry-evil.toml", "/dev/zero"} {
				t.Run(filepath.Base(config), func(t *testing.T) {
					c := newContainer(t, opts{
						env: imageEnv(config),
						// busybox is static: the preload cannot take in the
						// container's own process; the probe runs without it.
						args:        []string{"sh", "-c", "readlink " + libDir + "/libcuda.so.1; env -u LD_PRELOAD -u LD_LIBRARY_PATH -u GCONV_PATH probe"},
						config:      fmt.Sprintf("[cdi]\nspec-dirs = [%q]", specDir),
						annotations: map[string]string{"cdi.k8s.io/gpu": "example.com/gpu=0"},
						mutate:      addEvil,
					})
					out, stderr, err := c.run()
					if got := marks(c.rootfs); len(got) > 0 {
						os.Remove(hostMark)
						t.Fatalf("the image's LD_PRELOAD library ran in a hook: marks %q\n%s\n%s", got, out, stderr)
					}
					sameSnapshot(t, hostDir, before, snapshot(t, hostDir))
					if err != nil {
						t.Fatalf("run: %v\n%s\n%s", err, out, stderr)
					}
					// The hooks did run: the SONAME link, the cache entry, the
					// folder list, and the probe finds libcuda through them.
					lines := strings.Split(strings.TrimSpace(out), "\n")
					wantProbe := fmt.Sprintf("cuda=%d path=%s/libcuda.so.1", f.driver.CUDAVersion, libDir)
					if len(lines) != 2 || !strings.HasPrefix(lines[0], "libcuda.so.") || lines[1] != wantProbe {
						t.Errorf("container output %q: want the libcuda.so.1 link's target and %q", out, wantProbe)
					}
					cache, err := os.ReadFile(filepath.Join(c.rootfs, "etc/ld.so.cache"))
					if err != nil || !bytes.Contains(cache, []byte("libcuda.so.1\x00")) {
						t.Errorf("the image's ld.so.cache has no libcuda.so.1 entry (%v)", err)
					}
					if _, err := os.Stat(filepath.Join(c.rootfs, "etc/ld.so.conf.d/000-gantry.conf")); err != nil {
						t.Errorf("update-ldcache did not run: %v", err)
					}
					// What runc was given: the spec's hooks, each with the
					// fixed environment and nothing of the image's.
					var spec ocispecs.Spec
					if err := json.Unmarshal(c.configJSON(), &spec); err != nil {
						t.Fatal(err)
					}
					if spec.Hooks == nil || len(spec.Hooks.CreateContainer) != 2 {
						t.Fatalf("createContainer hooks in config.json: %+v", spec.Hooks)
					}
					for _, h := range spec.Hooks.CreateContainer {
						if !slices.Equal(h.Env, edits.HookEnv()) {
							t.Errorf("hook %q has env %q, want %q", h.Args, h.Env, edits.HookEnv())
						}
						if form.hookPath == "" && filepath.Base(h.Path) != "gantry-cdi-hook" {
							t.Errorf("hook path %s, want gantry-cdi-hook", h.Path)
						}
					}
				})
			}
		})
	}
}

// gantry-runtime's CDI injection gives a hook of another vendor's spec that
// has no env the fixed one, so that runc does not run it with the image's
// environment; a hook with its own env keeps it. Checked through real runc:
// the hook (a shell script) writes the environment it got into the bundle.
func TestInjectedHooksGetEnv(t *testing.T) { eachRuntime(t, testInjectedHooksGetEnv) }

func testInjectedHooksGetEnv(t *testing.T) {
	need(t)
	specDir := t.TempDir()
	out := t.TempDir()
	script := filepath.Join(t.TempDir(), "hook.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nenv > \"$1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf(`cdiVersion: "0.6.0"
kind: example.com/fpga
devices:
- name: f0
  containerEdits:
    hooks:
    - hookName: createContainer
      path: %[1]s
      args: [hook.sh, %[2]s/device]
containerEdits:
  hooks:
  - hookName: createContainer
    path: %[1]s
    args: [hook.sh, %[2]s/spec]
  - hookName: createContainer
    path: %[1]s
    args: [hook.sh, %[2]s/own]
    env: [VENDOR_SETTING=1]
`, script, out)
	if err := os.WriteFile(filepath.Join(specDir, "fpga.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newContainer(t, opts{
		env:         []string{"LD_PRELOAD=/proc/self/cwd/evil.so", "IMAGE_SECRET=1"},
		args:        []string{"true"},
		config:      fmt.Sprintf("[cdi]\nspec-dirs = [%q]", specDir),
		annotations: map[string]string{"cdi.k8s.io/fpga": "example.com/fpga=f0"},
	})
	if o, stderr, err := c.run(); err != nil {
		t.Fatalf("run: %v\n%s\n%s", err, o, stderr)
	}
	for name, want := range map[string]string{"device": edits.HookPATH, "spec": edits.HookPATH, "own": "VENDOR_SETTING=1"} {
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatalf("the %s hook did not run: %v", name, err)
		}
		env := string(b)
		if !strings.Contains(env, want) || strings.Contains(env, "LD_PRELOAD") || strings.Contains(env, "IMAGE_SECRET") {
			t.Errorf("the %s hook ran with\n%s\nwant %s and nothing of the image's", name, env, want)
		}
	}
}

// dynamic reports whether the ELF program at path asks for a program
// interpreter (the dynamic loader).
func dynamic(t *testing.T, path string) bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// A CDI spec whose hook names a relative path: runc and crun run hooks
// from the container's root filesystem, so the image's file of that name
// runs as root on the host (runc 1.1.5 and 1.5.2 reproduced in the review
// of sec1). gantry-runtime refuses to inject it, naming the spec, and the
// image's program does not run.
func TestInjectedRelativeHookRefused(t *testing.T) { eachRuntime(t, testInjectedRelativeHookRefused) }

func testInjectedRelativeHookRefused(t *testing.T) {
	need(t)
	specDir := t.TempDir()
	mark := filepath.Join(t.TempDir(), "evilhook-ran")
	spec := `cdiVersion: "0.6.0"
kind: example.com/fpga
devices:
- name: f0
  containerEdits:
    env: [FPGA=1]
containerEdits:
  hooks:
  - hookName: createContainer
    path: evilhook
    args: [evilhook]
    env: [PATH=/bin]
`
	if err := os.WriteFile(filepath.Join(specDir, "fpga.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newContainer(t, opts{
		args:        []string{"true"},
		config:      fmt.Sprintf("[cdi]\nspec-dirs = [%q]", specDir),
		annotations: map[string]string{"cdi.k8s.io/fpga": "example.com/fpga=f0"},
		mutate: func(rootfs string) {
			if err := os.WriteFile(filepath.Join(rootfs, "evilhook"), []byte("#!/bin/sh\nid -u > "+mark+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		},
	})
	o, stderr, err := c.run()
	if _, serr := os.Stat(mark); serr == nil {
		t.Errorf("the image's evilhook ran on the host")
	}
	if err == nil || !strings.Contains(stderr, `the relative path "evilhook"`) {
		t.Errorf("run: %v\n%s\n%s\nwant a refusal naming the relative hook path", err, o, stderr)
	}
}
