package shim

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gantry-gpu/gantry/internal/config"
)

// BenchmarkModify is the work gantry-runtime adds to a container create, in
// process (no exec): an all-GPU request on the simulated 8-GPU host with the
// inventory cache warm, from reading config.json to writing it back. The
// bundle is restored between iterations outside the timer.
func BenchmarkModify(b *testing.B) {
	for _, tc := range []struct{ name, env string }{{"all-gpus", "NVIDIA_VISIBLE_DEVICES=all"}, {"no-gpu", "NVIDIA_VISIBLE_DEVICES="}} {
		b.Run(tc.name, func(b *testing.B) {
			f := need(b)
			dir := b.TempDir()
			img := filepath.Join(dir, "bundle", "rootfs")
			if err := os.MkdirAll(filepath.Dir(img), 0o755); err != nil {
				b.Fatal(err)
			}
			if err := run("cp", "-a", f.imageDir, img); err != nil {
				b.Fatal(err)
			}
			cfg := config.Default()
			cfg.GPUs = "sim:h100x8"
			cfg.DriverRoot = f.driver.Root
			cfg.Runtime.CacheDir = filepath.Join(dir, "cache")
			spec := []byte(`{"ociVersion":"1.2.0","process":{"args":["true"],"env":["PATH=/bin","` + tc.env + `"],"cwd":"/"},"root":{"path":"rootfs"},"linux":{"namespaces":[{"type":"mount"}]}}`)
			cj := filepath.Join(dir, "bundle", "config.json")
			reset := func() {
				if err := os.WriteFile(cj, spec, 0o644); err != nil {
					b.Fatal(err)
				}
			}
			reset()
			if _, err := Modify(filepath.Join(dir, "bundle"), cfg); err != nil { // warms the cache
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				reset()
				b.StartTimer()
				if _, err := Modify(filepath.Join(dir, "bundle"), cfg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
