package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/cudackpt"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// gantry checkpoint --probe-remap against the fake driver: two GPUs of one
// model, the verdict printed and kept in runtime.cache-dir; with the fake
// driver's remap switch on, the verdict is unsupported and the exit 1.
func TestCheckpointProbeRemap(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: the fake libcuda is built with it")
	}
	dir := t.TempDir()
	ck := filepath.Join(dir, "calls")
	if err := os.Mkdir(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	ids := []fakedriver.Identity{
		{Minor: 0, UUID: "GPU-aaaaaaaa-0000-4000-8000-000000000000", Name: "NVIDIA H200"},
		{Minor: 1, UUID: "GPU-bbbbbbbb-0000-4000-8000-000000000001", Name: "NVIDIA H200"},
	}
	res, err := fakedriver.Build(filepath.Join(dir, "driver"), fakedriver.Options{Version: "580.159.04", GPUs: 2, CheckpointDir: ck, Identities: ids})
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "cache")
	cfg := filepath.Join(dir, "gantry.toml")
	if err := os.WriteFile(cfg, []byte("driver-root = \""+res.Root+"\"\n[runtime]\ncache-dir = \""+cache+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run("--config", cfg, "checkpoint", "--probe-remap")
	if code != 0 || !strings.Contains(out, "remap: supported") || !strings.Contains(out, ids[0].UUID+" -> "+ids[1].UUID) || !strings.Contains(out, cudackpt.CacheFile(cache, "580.159.04")) {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if v, found, err := cudackpt.ReadCache(cache, "580.159.04"); err != nil || !found || v.Remap != cudackpt.RemapSupported {
		t.Errorf("kept verdict: %+v %v %v", v, found, err)
	}
	if err := os.WriteFile(filepath.Join(ck, "fail"), []byte("remap\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = run("--config", cfg, "checkpoint", "--probe-remap")
	if code != 1 || !strings.Contains(out, "remap: unsupported") || !strings.Contains(out, "CUDA_ERROR_NOT_SUPPORTED") {
		t.Errorf("with a driver that cannot remap: exit %d\n%s%s", code, out, errOut)
	}
}
