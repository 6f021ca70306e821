package shim

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The C fast path and Main must exec the same runtime with the same
// arguments; the fast path must do it before the Go runtime starts.
// GODEBUG=inittrace=1 makes a Go program print "init runtime" first thing,
// and the low-level runtime here is a shell script, so that line on stderr
// means Go ran.
func TestPassThroughFastPath(t *testing.T) {
	_, rt := buildGantry(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "argv")
	script := filepath.Join(dir, "lowlevel", "fake-runc")
	if err := os.MkdirAll(filepath.Dir(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, []byte("#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > "+out+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A directory earlier in PATH with "runc" being gantry itself: both
	// paths must skip it rather than exec themselves forever.
	selfDir := filepath.Join(dir, "self")
	if err := os.MkdirAll(selfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(rt, filepath.Join(selfDir, "runc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(script, filepath.Join(filepath.Dir(script), "runc")); err != nil {
		t.Fatal(err)
	}
	path := selfDir + ":" + filepath.Dir(script) + ":/usr/bin:/bin"

	conf := func(body string) string {
		p := filepath.Join(dir, "c.toml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name   string
		config string
		env    []string
		args   []string
		fast   bool
		want   string // argv[0] the low-level runtime got
	}{
		{"table key", "[runtime]\nlow-level = '" + script + "'\n", nil, []string{"--root", "/r", "state", "id1"}, true, script},
		{"dotted key, comments", "# c\ngpus = \"nvml\"\nruntime.low-level = \"" + script + "\" # x\n", nil, []string{"delete", "--force", "id1"}, true, script},
		{"PATH lookup skips gantry itself", "[runtime]\nlow-level = \"runc\"\n", nil, []string{"kill", "id1", "KILL"}, true, filepath.Join(filepath.Dir(script), "runc")},
		{"escapes: left to Go", "[runtime]\nlow-level = \"" + strings.ReplaceAll(script, "/", "\\u002f") + "\"\n", nil, []string{"start", "id1"}, false, script},
		{"turned off", "[runtime]\nlow-level = '" + script + "'\n", []string{"GANTRY_NO_FASTPATH=1"}, []string{"start", "id1"}, false, script},
		{"global value flag named like a subcommand", "[runtime]\nlow-level = '" + script + "'\n", nil, []string{"--log", "create", "start", "id1"}, true, script},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(out)
			cmd := exec.Command(rt, tc.args...)
			cmd.Env = append([]string{"PATH=" + path, "GANTRY_CONFIG=" + conf(tc.config), "GODEBUG=inittrace=1"}, tc.env...)
			stderr, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("the low-level runtime did not run: %v\n%s", err, stderr)
			}
			want := strings.Join(append([]string{tc.want}, tc.args...), "\n") + "\n"
			if string(got) != want {
				t.Errorf("low-level runtime got argv\n%s\nwant\n%s", got, want)
			}
			ranGo := strings.Contains(string(stderr), "init runtime")
			if ranGo == tc.fast {
				t.Errorf("fast path taken = %v, want %v (stderr %q)", !ranGo, tc.fast, stderr)
			}
		})
	}
}

// A configuration path that is a FIFO or /dev/zero (GANTRY_CONFIG comes
// from the engine's environment, but a mistake there must not hang every
// container operation): neither the C fast path nor Main blocks or reads
// without end. state goes on to the low-level runtime with the defaults (as
// for any unreadable configuration); create fails naming the file.
func TestConfigNotRegularFile(t *testing.T) {
	_, rt := buildGantry(t)
	fifo := filepath.Join(t.TempDir(), "config.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, "/dev/zero"} {
		for _, args := range [][]string{{"state", "id1"}, {"create", "--bundle", t.TempDir(), "id1"}} {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			cmd := exec.CommandContext(ctx, rt, args...)
			cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "GANTRY_CONFIG=" + p}
			out, err := cmd.CombinedOutput()
			timedOut := ctx.Err() != nil
			cancel()
			if timedOut {
				t.Fatalf("GANTRY_CONFIG=%s: gantry-runtime %s still running after 20s", p, args[0])
			}
			if args[0] == "create" && (err == nil || !strings.Contains(string(out), p) || !strings.Contains(string(out), "not a regular file")) {
				t.Errorf("GANTRY_CONFIG=%s: create: err %v, output %q; want a failure naming the file as not a regular file", p, err, out)
			}
		}
	}
}
