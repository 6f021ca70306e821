package topology

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// ErrUnknownDevice is matched (errors.Is) by the error for IDs that name no
// GPU of the graph.
var ErrUnknownDevice = errors.New("unknown device")

// ErrSize is matched (errors.Is) by the error for a size that no answer can
// have: below 1, below the number of must-include devices, or above the
// number of devices to choose from.
var ErrSize = errors.New("impossible allocation size")

// maxExhaustive is the most candidate sets searched one by one; C(16,8) is
// 12870, so every request on a host of up to 16 GPUs is answered exactly.
const maxExhaustive = 1 << 15

// Graph is the interconnect of one host's GPUs, read once from a gpu.System.
// It is immutable, so one Graph serves concurrent requests.
type Graph struct {
	uuids  []string       // by position; positions follow device index
	byUUID map[string]int // UUID -> position
	pair   [][]score      // pair[i][j]: what GPUs i and j share (zero on the diagonal)
	from   string         // the System's backend, for error messages
}

// score measures a set of GPUs (or one pair) by the three sums of the
// package comment, compared in that order.
type score struct {
	links       int // NVLink links between members
	switchPairs int // pairs without NVLink behind one PCIe switch
	numaPairs   int // pairs on one NUMA node
}

func (s score) plus(t score) score {
	return score{s.links + t.links, s.switchPairs + t.switchPairs, s.numaPairs + t.numaPairs}
}

func (s score) cmp(t score) int {
	if c := s.links - t.links; c != 0 {
		return c
	}
	if c := s.switchPairs - t.switchPairs; c != 0 {
		return c
	}
	return s.numaPairs - t.numaPairs
}

// NewGraph reads the interconnect of sys's GPUs: NVLinks, NVSwitch links,
// PCI bus ids and NUMA nodes. MIG devices play no part; a nil System gives
// an empty graph.
func NewGraph(sys *gpu.System) *Graph {
	g := &Graph{byUUID: map[string]int{}}
	if sys == nil {
		return g
	}
	g.from = sys.Backend
	devs := slices.Clone(sys.Devices)
	slices.SortStableFunc(devs, func(a, b gpu.Device) int { return a.Index - b.Index })
	devs = slices.DeleteFunc(devs, func(d gpu.Device) bool {
		if _, dup := g.byUUID[d.UUID]; dup || d.UUID == "" {
			return true
		}
		g.byUUID[d.UUID] = len(g.uuids)
		g.uuids = append(g.uuids, d.UUID)
		return false
	})
	g.pair = make([][]score, len(devs))
	for i := range devs {
		g.pair[i] = make([]score, len(devs))
	}
	for i := range devs {
		for j := i + 1; j < len(devs); j++ {
			s := pairScore(devs[i], devs[j])
			g.pair[i][j], g.pair[j][i] = s, s
		}
	}
	return g
}

// pairScore is what two distinct GPUs share.
func pairScore(a, b gpu.Device) score {
	var s score
	// A link listed on one side only still counts: a hand-written simulated
	// host may name the peer once, and NVML reports both ends alike.
	s.links = max(directLinks(a, b.UUID), directLinks(b, a.UUID))
	if sa, sb := switchLinks(a), switchLinks(b); sa > 0 && sb > 0 {
		s.links += min(sa, sb)
	}
	if s.links == 0 && sameSwitch(a, b) {
		s.switchPairs = 1
	}
	if a.NUMANode >= 0 && a.NUMANode == b.NUMANode {
		s.numaPairs = 1
	}
	return s
}

func directLinks(d gpu.Device, peer string) int {
	n := 0
	for _, l := range d.NVLinks {
		if !l.Switch && l.PeerUUID == peer {
			n += l.Links
		}
	}
	return n
}

func switchLinks(d gpu.Device) int {
	n := 0
	for _, l := range d.NVLinks {
		if l.Switch {
			n += l.Links
		}
	}
	return n
}

// sameSwitch guesses from the bus ids whether a and b sit behind one PCIe
// switch; see the package comment for the rule and its limits.
func sameSwitch(a, b gpu.Device) bool {
	if a.NUMANode >= 0 && b.NUMANode >= 0 && a.NUMANode != b.NUMANode {
		return false
	}
	pa, errA := gpu.ParsePCIAddress(a.PCIBusID)
	pb, errB := gpu.ParsePCIAddress(b.PCIBusID)
	if errA != nil || errB != nil {
		return false
	}
	return pa.Domain == pb.Domain && pa.Bus>>4 == pb.Bus>>4
}

// Preferred is NewGraph(sys).Preferred(available, mustInclude, size), for a
// caller that answers a single request.
func Preferred(sys *gpu.System, available, mustInclude []string, size int) ([]string, error) {
	return NewGraph(sys).Preferred(available, mustInclude, size)
}

// Preferred chooses size GPUs (by UUID) from available and mustInclude: all
// of mustInclude, and the rest from available so that the whole set has the
// best interconnect (see the package comment). The answer lists mustInclude
// in the order given, then the other GPUs by device index. Repeated IDs count
// once; must-include IDs need not be repeated in available.
//
// The error wraps ErrUnknownDevice for IDs that are not GPUs of the graph and
// ErrSize for a size below 1, below len(mustInclude) or above the number of
// GPUs to choose from; either names the IDs at fault.
func (g *Graph) Preferred(available, mustInclude []string, size int) ([]string, error) {
	must, err := g.positions(mustInclude, nil)
	if err != nil {
		return nil, err
	}
	pool, err := g.positions(available, must)
	if err != nil {
		return nil, err
	}
	switch {
	case size < 1:
		return nil, fmt.Errorf("%w: size %d: ask for at least 1 GPU", ErrSize, size)
	case size < len(must):
		return nil, fmt.Errorf("%w: size %d is below the %d must-include GPUs %s: ask for at least %d",
			ErrSize, size, len(must), g.names(must), len(must))
	case size > len(pool):
		return nil, fmt.Errorf("%w: size %d is above the %d GPUs to choose from %s: ask for at most %d",
			ErrSize, size, len(pool), g.names(pool), len(pool))
	}
	free := slices.DeleteFunc(slices.Clone(pool), func(p int) bool { return slices.Contains(must, p) })
	slices.Sort(free)
	need := size - len(must)

	var chosen []int
	if need > 0 {
		s := searcher{g: g, pool: pool, must: must, free: free, need: need}
		if combinations(len(free), need) <= maxExhaustive {
			chosen = s.exhaustive()
		} else {
			chosen = s.greedy()
		}
	}
	out := make([]string, 0, size)
	for _, p := range must {
		out = append(out, g.uuids[p])
	}
	for _, p := range chosen {
		out = append(out, g.uuids[p])
	}
	return out, nil
}

// positions turns ids into graph positions, dropping repeats and the
// positions already in seed, and returns seed followed by the new ones. IDs
// the graph does not know make an error naming all of them.
func (g *Graph) positions(ids []string, seed []int) ([]int, error) {
	out := slices.Clone(seed)
	var unknown []string
	for _, id := range ids {
		p, ok := g.byUUID[id]
		switch {
		case !ok:
			if !slices.Contains(unknown, id) {
				unknown = append(unknown, id)
			}
		case !slices.Contains(out, p):
			out = append(out, p)
		}
	}
	if len(unknown) > 0 {
		host := g.from
		if host == "" {
			host = "this host"
		}
		return nil, fmt.Errorf("%w: %s: not GPUs of %s (%d GPUs); ask with the GPU UUIDs the device plugin advertises",
			ErrUnknownDevice, strings.Join(unknown, ", "), host, len(g.uuids))
	}
	return out, nil
}

func (g *Graph) names(ps []int) string {
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = g.uuids[p]
	}
	return "[" + strings.Join(ids, ", ") + "]"
}

// setScore sums the pair scores of the members of set.
func (g *Graph) setScore(set []int) score {
	var s score
	for i, a := range set {
		for _, b := range set[i+1:] {
			s = s.plus(g.pair[a][b])
		}
	}
	return s
}

// combinations is C(n,k), or maxExhaustive+1 once it passes maxExhaustive.
func combinations(n, k int) int {
	k = min(k, n-k)
	c := 1
	for i := 1; i <= k; i++ {
		c = c * (n - k + i) / i // exact: c is C(n-k+i-1, i-1) before the step
		if c > maxExhaustive {
			return maxExhaustive + 1
		}
	}
	return c
}

// Explain says why a set of GPUs (by UUID) ranks where it does: the three
// sums of the package comment over its pairs, in words, for logs (the
// device plugin's preferred-allocation line). IDs the graph does not know
// make the ErrUnknownDevice error.
func (g *Graph) Explain(ids []string) (string, error) {
	set, err := g.positions(ids, nil)
	if err != nil {
		return "", err
	}
	s := g.setScore(set)
	return fmt.Sprintf("%d GPUs: NVLink links %d, pairs behind one PCIe switch %d, pairs on one NUMA node %d",
		len(set), s.links, s.switchPairs, s.numaPairs), nil
}
