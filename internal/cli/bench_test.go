package cli

import (
	"path/filepath"
	"testing"
)

// BenchmarkCDIGenerate is `gantry cdi generate --output FILE` in-process on a
// simulated 8-GPU H100 host over the fake driver root (bench/cdi-generate.sh
// times the whole process, start-up included). Profile it with
// go test -run '^$' -bench CDIGenerate -cpuprofile cpu.prof ./internal/cli.
func BenchmarkCDIGenerate(b *testing.B) {
	root := fakeRoot(b)
	out := filepath.Join(b.TempDir(), "nvidia.yaml")
	args := []string{"--gpus", "sim:h100x8", "--driver-root", root, "cdi", "generate", "--output", out}
	b.ReportAllocs()
	for b.Loop() {
		if _, errOut, code := run(args...); code != 0 {
			b.Fatalf("exit %d: %s", code, errOut)
		}
	}
}
