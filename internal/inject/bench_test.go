package inject

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/request"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// fakeDriverConfig is the per-file layout over a fake driver root (root
// user, gcc), the simulated GPUs of profile, and the inventory cache, in a
// temporary directory (returned too).
func fakeDriverConfig(tb testing.TB, profile string) (config.Config, string) {
	tb.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		tb.Skip("gcc not installed: cannot build the fake driver root (make deps installs it)")
	}
	if os.Geteuid() != 0 {
		tb.Skip("needs root: the fake driver's device nodes")
	}
	dir := tb.TempDir()
	root := filepath.Join(dir, "driver")
	if _, err := fakedriver.Build(root, fakedriver.Options{DeviceNodes: true}); err != nil {
		tb.Fatal(err)
	}
	cfg := config.Default()
	cfg.GPUs, cfg.DriverRoot = "sim:"+profile, root
	cfg.Runtime.CacheDir = filepath.Join(dir, "cache")
	// The default layout is the tree: its trees here, not on the host.
	cfg.Runtime.DriverTreeDir = filepath.Join(dir, "trees")
	return cfg, dir
}

// benchConfig is fakeDriverConfig with eight simulated H100s.
func benchConfig(b *testing.B) config.Config {
	cfg, _ := fakeDriverConfig(b, "h100x8")
	return cfg
}

// BenchmarkLoadHost is the "host" phase of a create with the inventory
// cache warm: the driver version and loader-cache stamps, the cache file
// read and decoded, the (simulated) GPUs.
func BenchmarkLoadHost(b *testing.B) {
	cfg := benchConfig(b)
	if _, _, _, _, err := loadHost(cfg, false); err != nil { // writes the cache
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, _, src, err := loadHost(cfg, false); err != nil || src != fromCache {
			b.Fatal(src, err)
		}
	}
}

// BenchmarkReadCache is the inventory cache alone: open, check, read,
// decode.
func BenchmarkReadCache(b *testing.B) {
	cfg := benchConfig(b)
	if _, _, _, _, err := loadHost(cfg, false); err != nil {
		b.Fatal(err)
	}
	version, _, _ := driver.CurrentVersion(cfg.DriverRoot)
	key := cacheKey{Format: cacheFormat, DriverRoot: cfg.DriverRoot, DevRoot: cfg.EffectiveDevRoot(), SearchPaths: cfg.LibrarySearchPaths,
		Version: version, LDCache: fileStamp(filepath.Join(cfg.DriverRoot, "etc/ld.so.cache")),
		Nodes: driver.Stamp(cfg.DriverRoot, cfg.EffectiveDevRoot())}
	path := cachePath(cfg.Runtime.CacheDir, key)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if readCache(path, key) == nil {
			b.Fatal("no cache")
		}
	}
}

// BenchmarkFinishRootfs is the "rootfs" phase of an all-GPU create: the
// SONAME links and the ld.so.cache entries written into a root filesystem
// whose ld.so.cache is this machine's (a distribution's, hundreds of
// entries, as in real images). The root is restored outside the timer.
func BenchmarkFinishRootfs(b *testing.B) {
	cfg := benchConfig(b)
	req, err := request.Parse(request.Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, discover.RequestOptions(cfg))
	if err != nil {
		b.Fatal(err)
	}
	plan, err := Prepare(cfg, req, Options{ForwardCompat: true}, NewRecord(FrontEndRuntime, "", ""))
	if err != nil {
		b.Fatal(err)
	}
	cache, err := os.ReadFile("/etc/ld.so.cache")
	if err != nil {
		b.Skipf("no host ld.so.cache to stand for an image's: %v", err)
	}
	dir := b.TempDir()
	reset := func() {
		if err := os.RemoveAll(dir); err != nil {
			b.Fatal(err)
		}
		for _, d := range []string{"etc/ld.so.conf.d", "usr/lib/x86_64-linux-gnu"} {
			if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "etc/ld.so.cache"), cache, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	open := func() (*rootfs.Root, error) {
		r, err := rootfs.Open(dir)
		if err == nil {
			r.SkipSync()
		}
		return r, err
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		reset()
		b.StartTimer()
		if err := plan.FinishRootfs(open, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrepare is a whole all-GPU, compute,utility plan with the
// inventory and tree caches warm, in each driver layout: the tree's share
// is its set of files (treeSet, SetKey), the tree cache read and the edits
// rewritten (UseTree).
func BenchmarkPrepare(b *testing.B) {
	for _, layout := range []string{config.DriverLayoutFiles, config.DriverLayoutTree} {
		b.Run(layout, func(b *testing.B) {
			cfg := benchConfig(b)
			cfg.Runtime.DriverLayout = layout
			req, err := request.Parse(request.Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}}, discover.RequestOptions(cfg))
			if err != nil {
				b.Fatal(err)
			}
			prepare := func() {
				rec := NewRecord(FrontEndRuntime, "", "")
				if _, err := Prepare(cfg, req, Options{}, rec); err != nil {
					b.Fatal(err)
				}
				if rec.Layout != layout && layout == config.DriverLayoutTree {
					b.Fatalf("layout %q: %v", rec.Layout, rec.Notes)
				}
			}
			prepare() // the caches
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				prepare()
			}
		})
	}
}
