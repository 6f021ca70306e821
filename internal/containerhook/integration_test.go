package containerhook

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gantry-gpu/gantry/internal/edits"
)

var (
	gantryOnce sync.Once
	gantryBin  string // cmd/gantry, as make build builds it (cgo)
	hookBin    string // cmd/gantry-cdi-hook, as make build builds it (CGO_ENABLED=0)
	gantryErr  string
)

// buildGantry builds the gantry command and the CDI hook binary once, with
// the go tool that runs the tests, and returns gantry's path.
func buildGantry(t *testing.T) string {
	t.Helper()
	gantryOnce.Do(func() {
		goTool := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			if goTool, err = exec.LookPath("go"); err != nil {
				gantryErr = "skip: no go tool to build gantry"
				return
			}
		}
		gantryBin = filepath.Join(artifacts, "gantry")
		hookBin = filepath.Join(artifacts, "gantry-cdi-hook")
		for _, b := range []struct{ out, pkg, cgo string }{
			{gantryBin, "cmd/gantry", "1"},
			{hookBin, "cmd/gantry-cdi-hook", "0"},
		} {
			cmd := exec.Command(goTool, "build", "-o", b.out, "github.com/gantry-gpu/gantry/"+b.pkg)
			cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
			if out, err := cmd.CombinedOutput(); err != nil {
				gantryErr = "go build ./" + b.pkg + ": " + err.Error() + "\n" + string(out)
				return
			}
		}
	})
	if strings.HasPrefix(gantryErr, "skip: ") {
		t.Skip(gantryErr)
	}
	if gantryErr != "" {
		t.Fatal(gantryErr)
	}
	return gantryBin
}

// buildHook is buildGantry for the CDI hook binary.
func buildHook(t *testing.T) string {
	t.Helper()
	buildGantry(t)
	return hookBin
}

// The hooks exactly as a runtime runs them from a spec Gantry generates:
// the hook entries of edits.CDI (path, args and env), executed with the OCI
// state on stdin for a bundle whose config.json names the image root. The
// real loader in the image then finds libcuda. Three spec forms: the static
// gantry-cdi-hook, the same binary under NVIDIA's name nvidia-cdi-hook
// (subcommands dispatch whatever the name), and the gantry CLI's
// `gantry hook ...` of specs written before.
func TestGantryHookCommands(t *testing.T) {
	bin := buildGantry(t)
	hook := buildHook(t)
	nvName := filepath.Join(t.TempDir(), "nvidia-cdi-hook")
	if err := os.Symlink(hook, nvName); err != nil {
		t.Fatal(err)
	}
	for _, hookPath := range []string{hook, nvName, bin} {
		t.Run(filepath.Base(hookPath), func(t *testing.T) {
			dir := imageRoot(t, nil)
			if out, err := probe(t, dir); err == nil {
				t.Fatalf("probe found libcuda before the hooks ran: %s", out)
			}
			state := bundle(t, dir)
			e := &edits.Edits{
				Symlinks:    []edits.Symlink{{Target: driverLib, Link: nvDir + "/libcuda.so.1"}},
				LibraryDirs: []string{nvDir},
			}
			hooks := e.CDI(hookPath).Hooks
			if len(hooks) != 2 {
				t.Fatalf("edits.CDI gave %d hooks, want 2", len(hooks))
			}
			for _, h := range hooks {
				cmd := &exec.Cmd{Path: h.Path, Args: h.Args, Env: h.Env, Stdin: bytes.NewReader(state)}
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				if err := cmd.Run(); err != nil {
					t.Fatalf("%s: %v\n%s", strings.Join(h.Args, " "), err, stderr.String())
				}
			}
			if out, err := probe(t, dir); err != nil || out != wantVersion {
				t.Fatalf("probe after the hooks: %q, %v; want %s", out, err, wantVersion)
			}

			// Failures: non-zero exit and one line on stderr.
			base := hooks[0].Args[:len(hooks[0].Args)-3] // less create-symlinks --link T::L
			for _, tc := range []struct {
				stdin string
				args  []string
				want  string
			}{
				{"", []string{"update-ldcache", "--folder", nvDir}, "no container state on stdin"},
				{string(state), []string{"update-ldcache", "--folder", "/missing"}, "/missing"},
				{string(state), []string{"create-symlinks", "--link", "nolink"}, "TARGET::LINK"},
				{string(state), []string{"update-ldcache"}, "need at least one --folder"},
			} {
				cmd := &exec.Cmd{Path: hookPath, Args: append(slices.Clone(base), tc.args...), Stdin: strings.NewReader(tc.stdin)}
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				err := cmd.Run()
				msg := stderr.String()
				if err == nil || !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 {
					t.Errorf("%s: err %v, stderr %q; want a failure, one line containing %q", strings.Join(cmd.Args, " "), err, msg, tc.want)
				}
			}

			// A hook this version does not know (a spec from a newer
			// nvidia-ctk) is a one-line warning and success, as with
			// NVIDIA's binary, also behind its global flags. The gantry
			// CLI's `gantry hook` is not what such specs run.
			if slices.Contains(base, "hook") {
				return
			}
			for _, args := range [][]string{{"enable-everything", "--flag", "x"}, {"--debug", "enable-everything"}, {"--quiet", "--no-such-flag"}} {
				cmd := &exec.Cmd{Path: hookPath, Args: append(slices.Clone(base), args...), Stdin: bytes.NewReader(state)}
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				err := cmd.Run()
				msg := stderr.String()
				if err != nil || !strings.Contains(msg, "warning: unsupported CDI hook") || strings.Count(msg, "\n") != 1 {
					t.Errorf("%s: err %v, stderr %q; want success and one warning line", strings.Join(cmd.Args, " "), err, msg)
				}
			}
			// A known hook with an unknown flag still fails: that is a
			// malformed spec, not a newer one.
			cmd := &exec.Cmd{Path: hookPath, Args: append(slices.Clone(base), "chmod", "--mode", "755", "--no-such-flag"), Stdin: bytes.NewReader(state)}
			if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "no-such-flag") {
				t.Errorf("chmod --no-such-flag: err %v, output %q; want a usage error", err, out)
			}
		})
	}
}

// evilSrc is what a hostile image sets LD_PRELOAD to: loaded into any
// dynamically linked program, it leaves a mark.
const evilSrc = `#include <stdio.h>
__attribute__((constructor)) static void mark(void) {
	FILE *f = fopen(MARK, "w");
	if (f) { fputs("loaded", f); fclose(f); }
}
`

// The hook binary is static: with the environment a spec without env would
// hand it (the image's: LD_PRELOAD, LD_LIBRARY_PATH, GCONV_PATH,
// GANTRY_CONFIG=/dev/zero) it still does its work, and the preloaded
// library never runs. The control: the same library does run in gantry,
// which is dynamically linked, so the absence of the mark means something.
func TestHookBinaryIgnoresLoaderEnv(t *testing.T) {
	needArtifacts(t)
	hook := buildHook(t)
	dir := t.TempDir()
	mark := filepath.Join(dir, "evil-was-loaded")
	src := filepath.Join(dir, "evil.c")
	writeFile(t, src, evilSrc)
	evil := filepath.Join(dir, "evil.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-DMARK=\""+mark+"\"", "-o", evil, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc evil.so: %v\n%s", err, out)
	}
	hostile := []string{"LD_PRELOAD=" + evil, "LD_LIBRARY_PATH=" + dir, "GCONV_PATH=" + dir, "GANTRY_CONFIG=/dev/zero"}

	root := basicRoot(t)
	state := bundle(t, root)
	for _, args := range [][]string{
		{"create-symlinks", "--link", driverLib + "::" + nvDir + "/libcuda.so.1"},
		{"update-ldcache", "--folder", nvDir},
	} {
		cmd := &exec.Cmd{Path: hook, Args: append([]string{"gantry-cdi-hook"}, args...), Env: hostile, Stdin: bytes.NewReader(state)}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gantry-cdi-hook %s: %v\n%s", args[0], err, out)
		}
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("LD_PRELOAD ran in gantry-cdi-hook")
	}
	if target, err := os.Readlink(filepath.Join(root, nvDir, "libcuda.so.1")); err != nil || target != driverLib {
		t.Errorf("link %q, %v", target, err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/ld.so.cache")); err != nil {
		t.Errorf("no cache written: %v", err)
	}

	cmd := &exec.Cmd{Path: buildGantry(t), Args: []string{"gantry", "--version"}, Env: hostile}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("control: gantry --version: %v\n%s", err, out)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Fatal("control failed: evil.so left no mark even in the dynamically linked gantry: the test proves nothing")
	}
}
