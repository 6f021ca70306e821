package deviceplugin

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	gconfig "github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
)

// TestNoInjectedDriverNamesBothFixes: a plugin whose container no runtime
// gave the driver (NVIDIA's static DaemonSets name no runtimeClassName)
// looks under the usual mounted driver roots, and when none holds one says
// the two fixes.
func TestNoInjectedDriverNamesBothFixes(t *testing.T) {
	g := gconfig.Default()
	g.GPUs = "nvml"
	if _, err := discover.GPUs(g, false); err == nil {
		t.Skip("this host has NVML: the fallback is not reached")
	}
	empty := t.TempDir()
	old := DriverRootCandidates
	DriverRootCandidates = []string{empty, empty + "/missing"}
	defer func() { DriverRootCandidates = old }()
	cfg := DefaultConfig()
	cfg.Gantry.GPUs = "nvml"
	_, err := initPlugin(&cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil {
		t.Fatal("initPlugin found GPUs without a driver")
	}
	for _, want := range []string{"runtimeClassName: nvidia", "--set-as-default", "--nvidia-driver-root", empty} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if cfg.Flags.NvidiaDriverRoot != "" {
		t.Errorf("driver root set to %q with no driver found", cfg.Flags.NvidiaDriverRoot)
	}
}
