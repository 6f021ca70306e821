package deviceplugin

import (
	"context"
	"log/slog"
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
// has made its directory (two levels of it missing), with a fast periodic
// check: it logs one line, no warnings, and registers as soon as the
// directory and a kubelet appear. The directory removed and made again
// later is waited for the same way.
func TestMissingKubeletDirWaitsQuietly(t *testing.T) {
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
		Resync: 5 * time.Millisecond,
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

	// Many periodic checks' worth of waiting.
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
	if err := os.RemoveAll(filepath.Join(base, "kubelet")); err != nil {
		t.Fatal(err)
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
