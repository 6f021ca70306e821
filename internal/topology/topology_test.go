package topology

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

func load(t testing.TB, profile string) *gpu.System {
	t.Helper()
	sys, err := sim.Load(profile)
	if err != nil {
		t.Fatal(err)
	}
	return sys
}

// uuids maps device indices to UUIDs; nil stays nil.
func uuids(sys *gpu.System, idx []int) []string {
	if idx == nil {
		return nil
	}
	out := make([]string, len(idx))
	for i, x := range idx {
		out[i] = sys.Devices[x].UUID
	}
	return out
}

// indices maps UUIDs back to device indices (-1 for none).
func indices(sys *gpu.System, ids []string) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = slices.IndexFunc(sys.Devices, func(d gpu.Device) bool { return d.UUID == id })
	}
	return out
}

func span(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// mesh builds an 8-GPU host without NVSwitch, GPUs 0-3 on NUMA node 0 and
// 4-7 on node 1, all on separate PCIe switches: GPUs 0-3 form a ring with
// two links per hop, GPUs 4-7 are fully connected with two links per pair,
// and GPU i has one link to GPU i+4. Links are listed on the lower-numbered
// GPU only, to check that one side is enough.
func mesh() *gpu.System {
	sys := &gpu.System{Backend: "test:mesh"}
	for i := range 8 {
		sys.Devices = append(sys.Devices, gpu.Device{
			Index:    i,
			UUID:     fmt.Sprintf("GPU-mesh-%d", i),
			PCIBusID: fmt.Sprintf("00000000:%02X:00.0", 0x10+0x20*i),
			NUMANode: i / 4,
		})
	}
	link := func(a, b, n int) {
		sys.Devices[a].NVLinks = append(sys.Devices[a].NVLinks, gpu.NVLink{PeerUUID: sys.Devices[b].UUID, Links: n})
	}
	link(0, 1, 2)
	link(1, 2, 2)
	link(2, 3, 2)
	link(0, 3, 2)
	for a := 4; a < 8; a++ {
		for b := a + 1; b < 8; b++ {
			link(a, b, 2)
		}
	}
	for i := range 4 {
		link(i, i+4, 1)
	}
	return sys
}

func TestPreferred(t *testing.T) {
	meshSys := mesh()
	for _, tc := range []struct {
		name       string
		sys        *gpu.System
		available  []int // nil: all GPUs
		must       []int
		size       int
		want       []int
		whyFailing string
	}{
		// PCIe only: two switches of two GPUs per socket.
		{name: "l40s one GPU", sys: load(t, "l40sx8"), size: 1, want: []int{0}},
		{name: "l40s pair behind one switch", sys: load(t, "l40sx8"), size: 2, want: []int{0, 1}},
		{name: "l40s four on one NUMA node", sys: load(t, "l40sx8"), size: 4, want: span(0, 3)},
		{name: "l40s must-include from node 1", sys: load(t, "l40sx8"), must: []int{5}, size: 4, want: []int{5, 4, 6, 7}},
		{name: "l40s must-include takes its switch partner", sys: load(t, "l40sx8"), must: []int{6}, size: 2, want: []int{6, 7}},
		{name: "l40s two must-includes", sys: load(t, "l40sx8"), must: []int{3, 1}, size: 3, want: []int{3, 1, 0}},
		{name: "l40s six", sys: load(t, "l40sx8"), size: 6, want: span(0, 5)},
		{name: "l40s all", sys: load(t, "l40sx8"), size: 8, want: span(0, 7)},
		{name: "l40s same node without a switch pair", sys: load(t, "l40sx8"), available: []int{0, 2, 4, 6}, size: 2, want: []int{0, 2}},
		{name: "l40s switch pair across the freed GPUs", sys: load(t, "l40sx8"), available: []int{0, 3, 4, 5}, size: 2, want: []int{4, 5}},
		{name: "l40s lone GPU taken to keep a pair", sys: load(t, "l40sx8"), available: []int{0, 1, 2}, size: 1, want: []int{2}},
		{name: "l40s leftovers decide between pairs", sys: load(t, "l40sx8"), available: []int{1, 2, 3, 4, 5}, size: 2, want: []int{4, 5}},
		{name: "l40s repeated IDs count once", sys: load(t, "l40sx8"), available: []int{4, 4, 5, 5}, must: []int{5, 5}, size: 2, want: []int{5, 4}},
		{name: "l40s must-include outside available", sys: load(t, "l40sx8"), available: []int{0, 1, 2}, must: []int{3}, size: 2, want: []int{3, 2}},

		// NVSwitch: every pair has the same links; NUMA breaks ties.
		{name: "h100 one", sys: load(t, "h100x8"), size: 1, want: []int{0}},
		{name: "h100 two", sys: load(t, "h100x8"), size: 2, want: []int{0, 1}},
		{name: "h100 three", sys: load(t, "h100x8"), size: 3, want: span(0, 2)},
		{name: "h100 four", sys: load(t, "h100x8"), size: 4, want: span(0, 3)},
		{name: "h100 five", sys: load(t, "h100x8"), size: 5, want: span(0, 4)},
		{name: "h100 eight", sys: load(t, "h100x8"), size: 8, want: span(0, 7)},
		{name: "h100 four on the whole node", sys: load(t, "h100x8"), available: span(1, 7), size: 4, want: span(4, 7)},
		{name: "h100 NUMA of must-include", sys: load(t, "h100x8"), must: []int{6}, size: 2, want: []int{6, 4}},
		{name: "h200 four", sys: load(t, "h200x8"), size: 4, want: span(0, 3)},
		{name: "h200 across sockets", sys: load(t, "h200x8"), available: []int{3, 4}, size: 2, want: []int{3, 4}},

		// Two A100s linked by NVLink (MIG devices play no part).
		{name: "a100 pair", sys: load(t, "a100x2-mig"), size: 2, want: []int{0, 1}},
		{name: "a100 one", sys: load(t, "a100x2-mig"), size: 1, want: []int{0}},

		// A partial NVLink mesh.
		{name: "mesh fully connected quad", sys: meshSys, size: 4, want: span(4, 7)},
		{name: "mesh ring with must-include", sys: meshSys, must: []int{0}, size: 4, want: span(0, 3)},
		{name: "mesh one link beats same NUMA", sys: meshSys, available: []int{0, 2, 4}, size: 2, want: []int{0, 4}},
		{name: "mesh two links beat one", sys: meshSys, available: []int{0, 1, 4}, must: []int{0}, size: 2, want: []int{0, 1}},
		{name: "mesh three of the quad", sys: meshSys, available: []int{0, 1, 2, 5, 6, 7}, size: 3, want: span(5, 7)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			avail := tc.available
			if avail == nil {
				avail = span(0, len(tc.sys.Devices)-1)
			}
			got, err := Preferred(tc.sys, uuids(tc.sys, avail), uuids(tc.sys, tc.must), tc.size)
			if err != nil {
				t.Fatal(err)
			}
			if gi := indices(tc.sys, got); !slices.Equal(gi, tc.want) {
				t.Errorf("Preferred(%v, must %v, %d) = GPUs %v, want %v", avail, tc.must, tc.size, gi, tc.want)
			}
		})
	}
}

// TestPairScore checks what the graph reads from each profile, independently
// of the search.
func TestPairScore(t *testing.T) {
	l40s := NewGraph(load(t, "l40sx8"))
	for _, tc := range []struct {
		g    *Graph
		a, b int
		want score
	}{
		{l40s, 0, 1, score{0, 1, 1}}, // PIX: one switch
		{l40s, 1, 2, score{0, 0, 1}}, // NODE: same socket
		{l40s, 3, 4, score{0, 0, 0}}, // SYS: across sockets
		{l40s, 6, 7, score{0, 1, 1}}, // 0xB1, 0xB2
		{NewGraph(load(t, "h100x8")), 0, 7, score{18, 0, 0}},
		{NewGraph(load(t, "h100x8")), 6, 7, score{18, 0, 1}}, // 0xD1, 0xDF: NVLink, so no switch pair
		{NewGraph(load(t, "a100x2-mig")), 0, 1, score{12, 0, 1}},
		{NewGraph(mesh()), 1, 0, score{2, 0, 1}},
		{NewGraph(mesh()), 7, 3, score{1, 0, 0}},
		{NewGraph(mesh()), 0, 2, score{0, 0, 1}},
	} {
		if got := tc.g.pair[tc.a][tc.b]; got != tc.want {
			t.Errorf("%s: pair %d-%d = %+v, want %+v", tc.g.from, tc.a, tc.b, got, tc.want)
		}
	}
}

func TestPreferredErrors(t *testing.T) {
	sys := load(t, "l40sx8")
	all := uuids(sys, span(0, 7))
	for _, tc := range []struct {
		name      string
		available []string
		must      []string
		size      int
		is        error
		mentions  []string
	}{
		{"unknown available", append(slices.Clone(all), "GPU-nope", "GPU-nope"), nil, 2, ErrUnknownDevice, []string{"GPU-nope", "sim:l40sx8"}},
		{"unknown must-include", all, []string{all[1], "MIG-x", "GPU-y"}, 2, ErrUnknownDevice, []string{"MIG-x, GPU-y"}},
		{"zero size", all, nil, 0, ErrSize, []string{"size 0"}},
		{"negative size", all, nil, -3, ErrSize, []string{"size -3"}},
		{"size below must-include", all, all[2:5], 2, ErrSize, []string{all[2], all[3], all[4], "at least 3"}},
		{"size above available", all[:3], nil, 4, ErrSize, []string{all[0], all[1], all[2], "at most 3"}},
		{"nothing available", nil, nil, 1, ErrSize, []string{"at most 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Preferred(sys, tc.available, tc.must, tc.size)
			if !errors.Is(err, tc.is) {
				t.Fatalf("got %v, %v; want an error matching %v", got, err, tc.is)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
			for _, m := range tc.mentions {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
	if _, err := Preferred(nil, []string{"GPU-a"}, nil, 1); !errors.Is(err, ErrUnknownDevice) || !strings.Contains(err.Error(), "this host (0 GPUs)") {
		t.Errorf("nil System: %v", err)
	}
}

// TestGraphConcurrent shares one graph between goroutines; -race checks that
// requests do not write to it.
func TestGraphConcurrent(t *testing.T) {
	sys := load(t, "l40sx8")
	g := NewGraph(sys)
	all := uuids(sys, span(0, 7))
	want := make([][]string, 9)
	for k := 1; k <= 8; k++ {
		want[k], _ = g.Preferred(all, nil, k)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for k := 1; k <= 8; k++ {
				got, err := g.Preferred(all, nil, k)
				if err != nil || !slices.Equal(got, want[k]) {
					t.Errorf("size %d: %v %v, want %v", k, got, err, want[k])
				}
			}
		})
	}
	wg.Wait()
}

// islands is a host of n groups of 8 GPUs, each group fully connected by
// NVLink (2 links a pair) and on its own NUMA node, with no links between
// groups: too many candidate sets for the exhaustive search.
func islands(n int) *gpu.System {
	sys := &gpu.System{Backend: "test:islands"}
	for i := range 8 * n {
		sys.Devices = append(sys.Devices, gpu.Device{
			Index:    i,
			UUID:     fmt.Sprintf("GPU-island-%02d", i),
			PCIBusID: fmt.Sprintf("%08X:01:00.0", i),
			NUMANode: i / 8,
		})
	}
	for a := range sys.Devices {
		for b := range sys.Devices {
			if a != b && a/8 == b/8 {
				sys.Devices[a].NVLinks = append(sys.Devices[a].NVLinks, gpu.NVLink{PeerUUID: sys.Devices[b].UUID, Links: 2})
			}
		}
	}
	return sys
}

func TestPreferredGreedy(t *testing.T) {
	sys := islands(4)
	if c := combinations(32, 8); c <= maxExhaustive {
		t.Fatalf("C(32,8) counted as %d: the greedy search would not run", c)
	}
	for _, tc := range []struct {
		name      string
		available []int
		must      []int
		size      int
		want      []int
	}{
		{"first island", span(0, 31), nil, 8, span(0, 7)},
		{"first whole island", append([]int{0, 1, 2}, span(8, 31)...), nil, 8, span(8, 15)},
		{"island of must-include", span(0, 31), []int{20}, 8, append([]int{20}, append(span(16, 19), span(21, 23)...)...)},
		{"two islands", span(0, 31), nil, 16, span(0, 15)},
		{"island holding most of must-include", span(0, 31), []int{9, 17, 18, 19}, 10, []int{9, 17, 18, 19, 8, 16, 20, 21, 22, 23}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Preferred(sys, uuids(sys, tc.available), uuids(sys, tc.must), tc.size)
			if err != nil {
				t.Fatal(err)
			}
			if gi := indices(sys, got); !slices.Equal(gi, tc.want) {
				t.Errorf("got GPUs %v, want %v", gi, tc.want)
			}
		})
	}
}

// TestGreedyMatchesExhaustive runs both searches on the 8-GPU hosts: on these
// the greedy search must find a set as good as the best.
func TestGreedyMatchesExhaustive(t *testing.T) {
	for _, sys := range []*gpu.System{load(t, "l40sx8"), load(t, "h100x8"), mesh()} {
		g := NewGraph(sys)
		all := span(0, len(sys.Devices)-1)
		for k := 1; k <= len(all); k++ {
			ex := searcher{g: g, pool: all, free: all, need: k}
			gr := searcher{g: g, pool: all, free: all, need: k}
			ex.exhaustive()
			gr.greedy()
			if ex.bestSet != gr.bestSet {
				t.Errorf("%s size %d: exhaustive %v %+v, greedy %v %+v", sys.Backend, k, ex.best, ex.bestSet, gr.best, gr.bestSet)
			}
		}
	}
}

func TestCombinations(t *testing.T) {
	for _, tc := range [][3]int{{8, 0, 1}, {8, 1, 8}, {8, 4, 70}, {8, 8, 1}, {16, 8, 12870}, {18, 9, maxExhaustive + 1}, {64, 32, maxExhaustive + 1}} {
		if got := combinations(tc[0], tc[1]); got != tc[2] {
			t.Errorf("combinations(%d, %d) = %d, want %d", tc[0], tc[1], got, tc[2])
		}
	}
}

func BenchmarkNewGraph(b *testing.B) {
	sys := load(b, "h100x8")
	for b.Loop() {
		NewGraph(sys)
	}
}

// BenchmarkPreferred8 answers requests for 1 to 8 of 8 free GPUs from a graph
// built once, as the device plugin does.
func BenchmarkPreferred8(b *testing.B) {
	for _, profile := range []string{"h100x8", "l40sx8"} {
		sys := load(b, profile)
		g := NewGraph(sys)
		all := uuids(sys, span(0, 7))
		for k := 1; k <= 8; k++ {
			b.Run(fmt.Sprintf("%s/size=%d", profile, k), func(b *testing.B) {
				for b.Loop() {
					if _, err := g.Preferred(all, nil, k); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	b.Run("l40sx8/must=1/size=4", func(b *testing.B) {
		sys := load(b, "l40sx8")
		g := NewGraph(sys)
		all, must := uuids(sys, span(0, 7)), uuids(sys, []int{5})
		for b.Loop() {
			if _, err := g.Preferred(all, must, 4); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPreferredGreedy32 takes 8 of 32 GPUs, past the exhaustive search.
func BenchmarkPreferredGreedy32(b *testing.B) {
	sys := islands(4)
	g := NewGraph(sys)
	all := uuids(sys, span(0, 31))
	for b.Loop() {
		if _, err := g.Preferred(all, nil, 8); err != nil {
			b.Fatal(err)
		}
	}
}

// TestExplain: the sums that rank a set, in words; an unknown ID is an error.
func TestExplain(t *testing.T) {
	sys := load(t, "h100x8")
	g := NewGraph(sys)
	for _, tc := range []struct {
		idx  []int
		want string
	}{
		// One socket: 18 links through the NVSwitch fabric, one NUMA pair.
		{[]int{4, 5}, "2 GPUs: NVLink links 18, pairs behind one PCIe switch 0, pairs on one NUMA node 1"},
		// Across the sockets: the same links, no NUMA pair.
		{[]int{3, 4}, "2 GPUs: NVLink links 18, pairs behind one PCIe switch 0, pairs on one NUMA node 0"},
		{[]int{0, 1, 2}, "3 GPUs: NVLink links 54, pairs behind one PCIe switch 0, pairs on one NUMA node 3"},
	} {
		got, err := g.Explain(uuids(sys, tc.idx))
		if err != nil || got != tc.want {
			t.Errorf("Explain(%v) = %q, %v; want %q", tc.idx, got, err, tc.want)
		}
	}
	if _, err := g.Explain([]string{"GPU-nope"}); !errors.Is(err, ErrUnknownDevice) {
		t.Errorf("Explain of an unknown ID: %v, want ErrUnknownDevice", err)
	}
}
