package deviceplugin

import (
	"bytes"
	"context"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	gconfig "github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/health"
	"github.com/gantry-gpu/gantry/internal/topology"
)

// syncBuffer is a log sink that the plugin's goroutines may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRealGPUs runs the plugin on the host's GPUs through NVML, with NVML
// health events, against the fake kubelet. It needs a GPU host (nvidia-smi
// in PATH); elsewhere it skips.
func TestRealGPUs(t *testing.T) {
	smi, err := exec.LookPath("nvidia-smi")
	if err != nil {
		t.Skip("no nvidia-smi in PATH: not a GPU host")
	}
	out, err := exec.Command(smi, "--query-gpu=uuid,mig.mode.current", "--format=csv,noheader").Output()
	if err != nil {
		t.Skipf("nvidia-smi failed (%v): no usable GPU", err)
	}
	var uuids []string
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		uuid, mig, _ := strings.Cut(line, ",")
		if strings.TrimSpace(mig) == "Enabled" {
			t.Skip("a GPU is in MIG mode; this test compares whole GPUs")
		}
		uuids = append(uuids, strings.TrimSpace(uuid))
	}
	gcfg := gconfig.Default()
	sys, err := discover.GPUs(gcfg, false)
	if err != nil {
		t.Fatalf("NVML discovery on a host where nvidia-smi works: %v", err)
	}

	cfg := DefaultConfig()
	dir := shortTempDir(t)
	cfg.Gantry.KubeletDir = dir
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	k := startKubelet(t, dir)
	p, err := New(Options{Config: cfg, System: sys, Health: health.NewNVML("/", health.DefaultPolicy()), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		t.Logf("plugin log:\n%s", logs.String())
	}()

	k.registration()
	list := k.list("nvidia.com/gpu")
	var ids []string
	for _, d := range list {
		ids = append(ids, d.ID)
		if d.Health != pluginapi.Healthy {
			t.Errorf("%s is %s", d.ID, d.Health)
		}
	}
	if !slices.Equal(ids, uuids) {
		t.Errorf("advertised %v, nvidia-smi lists %v", ids, uuids)
	}
	c := k.client("nvidia-gpu.sock")
	resp, err := allocate(t, c, ids[:1])
	if err != nil || resp.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"] != ids[0] {
		t.Errorf("Allocate: %v, %v", resp, err)
	}
	size := max(1, len(ids)/2)
	got := preferred(t, c, ids, nil, size)
	want, err := topology.Preferred(sys, ids, nil, size)
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("preferred %d of %d = %v, topology says %v (%v)", size, len(ids), got, want, err)
	}
	t.Logf("GPUs %v; preferred %d: %v", ids, size, got)
	if strings.Contains(logs.String(), "health checks stopped") {
		t.Errorf("NVML health checks failed:\n%s", logs.String())
	}
}
