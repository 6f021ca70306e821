package deviceplugin

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/health"
)

// logLines are the lines logged into b so far.
func logLines(b *syncBuffer) []string {
	return strings.Split(strings.TrimSpace(b.String()), "\n")
}

// TestMissingKubeletDirWaitsQuietly starts the plugin before the kubelet
// has made its directory (two levels of it missing): it logs one line, no
// warnings, and registers as soon as the directory and a kubelet appear.
// The directory removed and made again later is waited for the same way.
// With a fast periodic check, racing the file-system events, and with one
// that never comes during the test: inotify alone finds the directory.
func TestMissingKubeletDirWaitsQuietly(t *testing.T) {
	for _, resync := range []time.Duration{5 * time.Millisecond, time.Hour} {
		t.Run(resync.String(), func(t *testing.T) { testMissingKubeletDir(t, resync) })
	}
}

func testMissingKubeletDir(t *testing.T, resync time.Duration) {
	base := shortTempDir(t)
	dir := filepath.Join(base, "kubelet", "dp")
	logs := &syncBuffer{}
	cfg := DefaultConfig()
	cfg.Gantry.KubeletDir = dir
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{
		Config: cfg, System: loadSim(t, "h100x1"),
		Health: health.NewSim(filepath.Join(base, "health.sock"), health.DefaultPolicy()),
		Log:    slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Resync: resync,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// Many fast periodic checks' worth of waiting.
	time.Sleep(quiet)
	checkQuiet := func(when string) {
		t.Helper()
		var waiting int
		for _, l := range logLines(logs) {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				t.Errorf("%s: logged %q", when, l)
			}
			if strings.Contains(l, "does not exist yet") {
				waiting++
			}
		}
		if waiting != 1 {
			t.Errorf("%s: %d lines about the missing directory, want 1:\n%s", when, waiting, strings.Join(logLines(logs), "\n"))
		}
	}
	checkQuiet("while the directory is missing")

	// The kubelet makes its directory level by level, then listens.
	if err := os.Mkdir(filepath.Join(base, "kubelet"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	k := startKubelet(t, dir)
	if r := k.registration(); r.ResourceName != "nvidia.com/gpu" {
		t.Errorf("registration %v", r)
	}
	if _, err := os.Stat(filepath.Join(dir, "nvidia-gpu.sock")); err != nil {
		t.Errorf("plugin socket: %v", err)
	}
	checkQuiet("after the kubelet came")

	// The whole directory goes away and comes back.
	k.stop()
	// The plugin may make its socket again between RemoveAll's unlink and
	// rmdir (it serves while the directory is there): remove again.
	for i := 0; ; i++ {
		err := os.RemoveAll(filepath.Join(base, "kubelet"))
		if err == nil {
			break
		}
		if i == 20 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(quiet)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	k2 := startKubelet(t, dir)
	if r := k2.registration(); r.ResourceName != "nvidia.com/gpu" {
		t.Errorf("registration after the directory came back: %v", r)
	}
	for _, l := range logLines(logs) {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Errorf("directory removed and made again: logged %q", l)
		}
	}
}

// TestRegistrationFailureWarnsAfterGrace: a kubelet.sock that nothing
// listens on (a kubelet killed, not restarted, its socket left behind) is
// retried quietly for registerGrace, then warned about; a kubelet that
// then starts gets the registration.
func TestRegistrationFailureWarnsAfterGrace(t *testing.T) {
	dir := shortTempDir(t)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, KubeletSocketName), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	logs := &syncBuffer{}
	cfg := DefaultConfig()
	cfg.Gantry.KubeletDir = dir
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{
		Config: cfg, System: loadSim(t, "h100x1"),
		Log:    slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Resync: 5 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	warned := func() bool { return strings.Contains(logs.String(), "kubelet registration pending") }
	for !warned() {
		if time.Since(start) > registerGrace+waitFor {
			t.Fatalf("no warning %v after the failures began:\n%s", registerGrace+waitFor, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := time.Since(start); d < registerGrace {
		t.Errorf("warned after %v, before registerGrace %v", d, registerGrace)
	}
	if k := restartKubelet(t, dir); k.registration().ResourceName != "nvidia.com/gpu" {
		t.Error("no registration with the kubelet that started")
	}
}
