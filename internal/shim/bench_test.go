package shim

import (
	"os"
	"path/filepath"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/inject"
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
			cfg.Runtime.DriverTreeDir = filepath.Join(dir, "trees")
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

// BenchmarkSpecEdit is the "spec" phase's work on a runc-shaped config.json
// without the write: the plan applied by patchSpec (the fields the edits
// own) and by the whole spec's round trip (fullSpec, the fallback), from
// the file's bytes to the new file's.
func BenchmarkSpecEdit(b *testing.B) {
	f := need(b)
	cfg := config.Default()
	cfg.GPUs = "sim:h100x8"
	cfg.DriverRoot = f.driver.Root
	cfg.Runtime.DriverTreeDir = b.TempDir()
	cfg.Runtime.CacheDir = b.TempDir()
	rec := inject.NewRecord(inject.FrontEndRuntime, "", "")
	req, err := inject.ReadRequest(&ocispecs.Spec{Process: &ocispecs.Process{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}}, cfg, rec)
	if err != nil {
		b.Fatal(err)
	}
	plan, err := inject.Prepare(cfg, req, inject.Options{CDI: true}, rec)
	if err != nil {
		b.Fatal(err)
	}
	raw := []byte(specCases["runc spec"])
	b.Run("patch", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			top, err := decodeObject(raw)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := patchSpec(top, plan); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("full", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := fullSpec(raw, plan); err != nil {
				b.Fatal(err)
			}
		}
	})
}
