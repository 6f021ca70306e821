package shim

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
