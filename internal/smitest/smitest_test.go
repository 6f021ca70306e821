package smitest

import (
	"slices"
	"testing"
)

// The shape nvidia-smi topo -m prints on an 8-GPU NVSwitch host (header
// underlined with escape codes, CPU and NUMA affinity columns after the GPUs).
func TestParse(t *testing.T) {
	out := "\t\x1b[4mGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n" +
		"GPU0\t X \tNV18\tNV18\t0-47\t0\t\tN/A\n" +
		"GPU1\tNV18\t X \tSYS\t0-47\t0\t\tN/A\n" +
		"GPU2\tNV18\tSYS\t X \t48-95\t1\t\tN/A\n\nLegend:\n\n  X    = Self\n"
	m := Parse(out)
	if len(m) != 3 || !slices.Equal(m[1], []string{"NV18", "X", "SYS"}) {
		t.Fatalf("Parse: %q", m)
	}
	if At(m, 2, 0) != "NV18" || At(m, 3, 0) != "?" {
		t.Errorf("At: %q %q", At(m, 2, 0), At(m, 3, 0))
	}
	if Parse("No devices were found\n") != nil {
		t.Error("output without a matrix gave one")
	}
}
