package mps_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/mps"
	"github.com/gantry-gpu/gantry/internal/mps/mpstest"
)

// A daemon's life with the fake control program: Start starts it (running
// before first), a second Start adopts it, SetDefaults reaches it by
// ordinal, Quit ends it; Check fails before and after.
func TestDaemonStartAdoptQuit(t *testing.T) {
	dir, err := os.MkdirTemp("", "mps") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &mps.Daemon{Pipe: filepath.Join(dir, "pipe"), Log: filepath.Join(dir, "log"), GPUs: []string{"GPU-a", "GPU-b"},
		Control: mpstest.BuildFake(t), Timeout: 2 * time.Minute}
	for _, p := range []string{d.Pipe, d.Log} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if d.Check(ctx) == nil {
		t.Fatal("Check passed with no daemon")
	}
	ran := 0
	before := func(context.Context) error { ran++; return nil }
	if adopted, err := d.Start(ctx, before); err != nil || adopted || ran != 1 {
		t.Fatalf("Start: adopted %v err %v before ran %d", adopted, err, ran)
	}
	if adopted, err := d.Start(ctx, before); err != nil || !adopted || ran != 1 {
		t.Fatalf("second Start: adopted %v err %v before ran %d, want adopted without before", adopted, err, ran)
	}
	if err := d.SetDefaults(ctx, 30, map[int]string{1: "512M", 5: "1M"}); err != nil {
		t.Fatal(err)
	}
	if err := d.Quit(ctx); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(d.Log, "control.log"))
	log := string(b)
	for _, want := range []string{"start GPU-a,GPU-b\n", "set_default_device_pinned_mem_limit 1 512M\n", "set_default_active_thread_percentage 30\nquit\n"} {
		if !strings.Contains(log, want) {
			t.Errorf("daemon log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, " 5 1M") {
		t.Error("a limit for an ordinal past the daemon's GPUs was sent")
	}
	if d.Check(ctx) == nil {
		t.Error("Check passed after quit")
	}
}

// A control program whose -d leaves a process holding its output: Start
// does not wait for that output, and reports the daemon that never answers.
func TestDaemonStartOutputHeld(t *testing.T) {
	dir := t.TempDir()
	control := filepath.Join(dir, "control")
	// The output is held for a minute: far longer than Start takes on a
	// busy machine, so a Start that waited for it is told apart.
	pids := filepath.Join(dir, "pids")
	if err := os.WriteFile(control, []byte("#!/bin/sh\nsleep 60 &\necho $! >>"+pids+"\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b, _ := os.ReadFile(pids)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	// Each run of the program has a generous bound; only the wait for an
	// answer is short, and the daemon never answers.
	d := &mps.Daemon{Pipe: filepath.Join(dir, "pipe"), Log: filepath.Join(dir, "log"), Control: control,
		Timeout: 2 * time.Minute, AnswerWait: time.Second}
	start := time.Now()
	_, err := d.Start(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "does not answer within 1s") || strings.Contains(err.Error(), "WaitDelay") {
		t.Errorf("Start: %v, want the daemon that does not answer", err)
	}
	if time.Since(start) > 45*time.Second {
		t.Errorf("Start took %v: it waited for the held output", time.Since(start))
	}
}

// The pipe directory is a container's to write (its clients' mount): a
// "control" there that is a link to another daemon's socket must not
// make Check pass, nor Quit and SetDefaults reach that other daemon.
func TestDaemonControlLinkRefused(t *testing.T) {
	dir, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	control := mpstest.BuildFake(t)
	mk := func(name string) *mps.Daemon {
		d := &mps.Daemon{Pipe: filepath.Join(dir, name, "pipe"), Log: filepath.Join(dir, name, "log"), GPUs: []string{"GPU-" + name},
			Control: control, Timeout: 2 * time.Minute}
		for _, p := range []string{d.Pipe, d.Log} {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	ctx := context.Background()
	victim, attacker := mk("b"), mk("a")
	if _, err := victim.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { victim.Quit(ctx) })
	if err := os.Symlink(filepath.Join(victim.Pipe, "control"), filepath.Join(attacker.Pipe, "control")); err != nil {
		t.Fatal(err)
	}
	if attacker.Check(ctx) == nil {
		t.Error("Check passed through a link to another daemon's socket")
	}
	if err := attacker.SetDefaults(ctx, 1, nil); err == nil {
		t.Error("SetDefaults went through a link to another daemon's socket")
	}
	if err := attacker.Quit(ctx); err == nil {
		t.Error("Quit went through a link to another daemon's socket")
	}
	if err := victim.Check(ctx); err != nil {
		t.Errorf("the other daemon no longer answers: %v", err)
	}
	b, _ := os.ReadFile(filepath.Join(victim.Log, "control.log"))
	if strings.Contains(string(b), "quit") || strings.Contains(string(b), "percentage 1\n") {
		t.Errorf("the other daemon got commands meant for this one:\n%s", b)
	}
}
