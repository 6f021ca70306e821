package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// hookBundle makes a bundle whose rootfs has /etc and returns the file
// holding its OCI state, as a runtime writes it to a hook's stdin.
func hookBundle(t *testing.T) (bundle, state string) {
	t.Helper()
	bundle = t.TempDir()
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs/etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.0.2","root":{"path":"rootfs"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	state = filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(state, []byte(`{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":1,"bundle":"`+bundle+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return bundle, state
}

// The hook commands of old specs run as root with whatever environment the
// spec gives them (the image's, for a spec without env): the configuration
// GANTRY_CONFIG names is not theirs to read. A configuration that would make
// every other command fail leaves them working.
func TestHookCommandsReadNoConfig(t *testing.T) {
	bundle, state := hookBundle(t)
	old := stdin
	t.Cleanup(func() { stdin = old })
	stdin = func() *os.File { f, _ := os.Open(state); return f }
	hostile := filepath.Join(t.TempDir(), "hostile.toml")
	if err := os.WriteFile(hostile, []byte("gpus = \"opencl\"\nlog-level = \"debug\"\n[cdi]\nhook-path = \"/proc/self/cwd/evil\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(bundle, "rootfs/usr/lib/libcuda.so.1")
	for _, cfg := range []string{hostile, "/nonexistent/gantry.toml"} {
		t.Run(filepath.Base(cfg), func(t *testing.T) {
			t.Setenv("GANTRY_CONFIG", cfg)
			// The control: an ordinary command does read it, and fails.
			if _, errOut, code := run("--gpus", "sim:h100x1", "info"); code == 0 || !strings.Contains(errOut, cfg) {
				t.Fatalf("gantry info with GANTRY_CONFIG=%s: exit %d, %q; want a failure naming it (else this test proves nothing)", cfg, code, errOut)
			}
			os.Remove(link)
			if _, errOut, code := run("hook", "create-symlinks", "--link", "libcuda.so.580.159.04::/usr/lib/libcuda.so.1"); code != 0 || errOut != "" {
				t.Fatalf("hook create-symlinks with GANTRY_CONFIG=%s: exit %d, %q", cfg, code, errOut)
			}
			if target, err := os.Readlink(link); err != nil || target != "libcuda.so.580.159.04" {
				t.Errorf("link = %q, %v", target, err)
			}
			if _, errOut, code := run("hook", "update-ldcache", "--folder", "/usr/lib"); code != 0 {
				t.Errorf("hook update-ldcache with GANTRY_CONFIG=%s: exit %d, %q", cfg, code, errOut)
			}
		})
	}
	// Nor do they take --config (or any global flag): old specs never gave
	// one, and a hook has no use for it.
	for _, args := range [][]string{
		{"hook", "create-symlinks", "--config", hostile, "--link", "a::/usr/lib/a"},
		{"--config", hostile, "hook", "update-ldcache", "--folder", "/usr/lib"},
		{"hook", "update-ldcache", "--gpus", "sim:h100x1", "--folder", "/usr/lib"},
	} {
		if _, errOut, code := run(args...); code != 2 || !strings.Contains(errOut, "flag provided but not defined") {
			t.Errorf("gantry %q: exit %d, %q; want a usage error", args, code, errOut)
		}
	}
}

// GANTRY_CONFIG=/dev/zero, which a configuration reader would read until it
// is killed for memory, in a child process (the test binary running the hook)
// watched from here: it must finish at once, small.
func TestHookCommandsIgnoreDevZeroConfig(t *testing.T) {
	if os.Getenv("GANTRY_TEST_HOOK_CHILD") == "1" {
		code := Main(strings.Fields(os.Getenv("GANTRY_TEST_HOOK_ARGS")), os.Stdout, os.Stderr)
		os.Exit(code)
	}
	bundle, state := hookBundle(t)
	for _, args := range []string{
		"hook create-symlinks --link libcuda.so.580.159.04::/usr/lib/libcuda.so.1",
		"hook update-ldcache --folder /usr/lib",
	} {
		in, err := os.Open(state)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHookCommandsIgnoreDevZeroConfig$")
		cmd.Env = append(os.Environ(), "GANTRY_TEST_HOOK_CHILD=1", "GANTRY_TEST_HOOK_ARGS="+args, "GANTRY_CONFIG=/dev/zero")
		cmd.Stdin = in
		var errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &errOut, &errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill the child long before it could threaten the machine.
		done := make(chan struct{})
		var rss int
		go func() {
			for {
				select {
				case <-done:
					return
				case <-time.After(20 * time.Millisecond):
				}
				if kb := vmRSS(cmd.Process.Pid); kb > 512<<10 {
					rss = kb
					cmd.Process.Kill()
					return
				}
			}
		}()
		err = cmd.Wait()
		close(done)
		cancel()
		in.Close()
		if rss > 0 {
			t.Fatalf("gantry %s with GANTRY_CONFIG=/dev/zero grew to %d MiB: it reads the configuration", args, rss>>10)
		}
		if err != nil {
			t.Fatalf("gantry %s with GANTRY_CONFIG=/dev/zero: %v\n%s", args, err, errOut.String())
		}
	}
	if _, err := os.Readlink(filepath.Join(bundle, "rootfs/usr/lib/libcuda.so.1")); err != nil {
		t.Errorf("the hook did not make its link: %v", err)
	}
}

// vmRSS is pid's resident memory in KiB (0 when unknown).
func vmRSS(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

// gantry hook is dynamically linked: with the loader's variables in its
// environment (an old spec's hook without env, on runc 1.1.5), the loader
// has already acted on them, so it refuses, naming the command that
// rewrites the spec (TestOldCDISpecRewritten runs this through real runc).
// A clean environment, or a command it does not serve, goes on.
func TestHookRefusesLoaderEnv(t *testing.T) {
	for _, v := range []string{"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_DEBUG", "GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv(v, "/proc/self/cwd/evil")
			err := HookGuard("update-ldcache", []string{"--folder", "/usr/lib"})
			if err == nil || !strings.Contains(err.Error(), v) || !strings.Contains(err.Error(), "gantry cdi fix-hooks") || !strings.Contains(err.Error(), "gantry doctor") {
				t.Errorf("HookGuard with %s set: %v", v, err)
			}
		})
	}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "LD_") || name == "GCONV_PATH" || name == "GLIBC_TUNABLES" || name == "LOCPATH" {
			t.Setenv(name, "") // restored after the test
			os.Unsetenv(name)
		}
	}
	t.Setenv("NVIDIA_VISIBLE_DEVICES", "all")
	// This test binary has no gantry-cdi-hook beside it: the hook runs here.
	if err := HookGuard("update-ldcache", []string{"--folder", "/usr/lib"}); err != nil {
		t.Errorf("clean environment: %v", err)
	}
	t.Setenv("LD_PRELOAD", "x")
	if err := HookGuard("--help", nil); err != nil {
		t.Errorf("--help: %v", err)
	}
}
