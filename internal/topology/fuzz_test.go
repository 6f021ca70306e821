package topology

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// byteReader hands out the fuzzer's bytes, then zeros.
type byteReader []byte

func (r *byteReader) next() int {
	if len(*r) == 0 {
		return 0
	}
	b := (*r)[0]
	*r = (*r)[1:]
	return int(b)
}

// fuzzRequest builds a host of 1 to 20 GPUs (NUMA nodes, bus ids, NVSwitch
// and peer links, some of them one-sided or to the GPU itself) and a request
// against it from data.
func fuzzRequest(data []byte) (sys *gpu.System, available, must []string, size int) {
	r := byteReader(data)
	n := 1 + r.next()%20
	sys = &gpu.System{Backend: "fuzz"}
	for i := range n {
		b := r.next()
		d := gpu.Device{
			Index:    i,
			UUID:     fmt.Sprintf("GPU-fuzz-%02d", i),
			PCIBusID: fmt.Sprintf("00000000:%02X:00.0", r.next()),
			NUMANode: b%3 - 1,
		}
		if b&8 != 0 {
			d.NVLinks = append(d.NVLinks, gpu.NVLink{Switch: true, Links: 1 + b>>4})
		}
		if p := r.next(); p&1 != 0 {
			d.NVLinks = append(d.NVLinks, gpu.NVLink{PeerUUID: fmt.Sprintf("GPU-fuzz-%02d", (p>>1)%n), Links: 1 + r.next()%4})
		}
		sys.Devices = append(sys.Devices, d)
	}
	for _, d := range sys.Devices {
		b := r.next()
		if b&1 != 0 {
			available = append(available, d.UUID)
		}
		if b&6 == 6 {
			must = append(must, d.UUID)
		}
		if b == 0xff {
			available = append(available, d.UUID) // a repeat
		}
	}
	if r.next() == 0xee {
		available = append(available, "GPU-not-here")
	}
	return sys, available, must, r.next()%(n+3) - 1
}

// FuzzPreferred checks that any request either gets a one-line error of the
// documented kinds or an answer of the right size that holds every
// must-include GPU and only GPUs it was offered; and that on small hosts the
// answer scores as well as the best set found by brute force.
func FuzzPreferred(f *testing.F) {
	f.Add([]byte{7, 1, 0x1a, 1, 2, 0x1b, 0, 0, 0x3d, 3, 1, 0x3e, 0, 4, 0x88, 0, 1, 0x89, 0, 9, 0xb1, 0, 3, 0xb2, 0, 1, 1, 1, 7, 1, 1, 1, 1, 0, 4})
	f.Add([]byte{19, 0x19, 0x18, 0, 0x28, 0x2a, 0, 0x38, 0x3a, 5, 2})
	f.Add([]byte{2, 0x18, 0x07, 1, 3, 0x18, 0x0f, 0, 0xff, 0xff, 0xee, 2})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		sys, available, must, size := fuzzRequest(data)
		g := NewGraph(sys)
		got, err := g.Preferred(available, must, size)

		offered := map[string]bool{}
		for _, id := range append(slices.Clone(available), must...) {
			offered[id] = true
		}
		wantMust := slices.Compact(slices.Clone(must)) // fuzzRequest never repeats a must-include ID
		possible := !offered["GPU-not-here"] && size >= 1 && size >= len(wantMust) && size <= len(offered)
		if err != nil {
			if !errors.Is(err, ErrUnknownDevice) && !errors.Is(err, ErrSize) {
				t.Fatalf("error of no documented kind: %v", err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
			if possible {
				t.Fatalf("Preferred(%v, %v, %d) failed: %v", available, must, size, err)
			}
			return
		}
		if !possible {
			t.Fatalf("Preferred(%v, %v, %d) = %v, want an error", available, must, size, got)
		}
		if len(got) != size {
			t.Fatalf("got %d GPUs %v, want %d", len(got), got, size)
		}
		if !slices.Equal(got[:len(wantMust)], wantMust) {
			t.Fatalf("answer %v does not start with the must-include GPUs %v", got, wantMust)
		}
		seen := map[string]bool{}
		for _, id := range got {
			if !offered[id] || seen[id] {
				t.Fatalf("answer %v repeats or was not offered %s", got, id)
			}
			seen[id] = true
		}

		// Brute force on small hosts: no set of the right size holding the
		// must-include GPUs scores higher than the answer.
		if len(offered) > 12 || combinations(len(offered)-len(wantMust), size-len(wantMust)) > maxExhaustive {
			return
		}
		var pool []int // graph positions are device indices here
		for i, d := range sys.Devices {
			if offered[d.UUID] {
				pool = append(pool, i)
			}
		}
		answer := g.setScore(positionsOf(t, g, got))
		for m := 0; m < 1<<len(pool); m++ {
			if bits.OnesCount(uint(m)) != size {
				continue
			}
			var set []int
			for j, p := range pool {
				if m&(1<<j) != 0 {
					set = append(set, p)
				}
			}
			if !containsAll(g, set, wantMust) {
				continue
			}
			if s := g.setScore(set); s.cmp(answer) > 0 {
				t.Fatalf("Preferred(%v, %v, %d) = %v scoring %+v; %v scores %+v", available, must, size, got, answer, set, s)
			}
		}
	})
}

func positionsOf(t *testing.T, g *Graph, ids []string) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		p, ok := g.byUUID[id]
		if !ok {
			t.Fatalf("no GPU %s", id)
		}
		out[i] = p
	}
	return out
}

func containsAll(g *Graph, set []int, ids []string) bool {
	for _, id := range ids {
		if !slices.Contains(set, g.byUUID[id]) {
			return false
		}
	}
	return true
}
