//go:build cgo && !nonvml

package nvml

import "testing"

func TestBitList(t *testing.T) {
	for _, c := range []struct {
		words []uint
		want  string
		one   int
	}{
		{nil, "", -1},
		{[]uint{0, 0}, "", -1},
		{[]uint{1}, "0", 0},
		{[]uint{^uint(0)}, "0-63", -1},
		{[]uint{^uint(0), 0, ^uint(0)}, "0-63,128-191", -1},
		{[]uint{0, 1 << 3}, "67", 67},
		{[]uint{0b1011}, "0-1,3", -1},
		{[]uint{0, 1 << 63}, "127", 127},
	} {
		if got := bitList(c.words); got != c.want {
			t.Errorf("bitList(%x) = %q, want %q", c.words, got, c.want)
		}
		n, one := onlyBit(c.words)
		if one != (c.one >= 0) || (one && n != c.one) {
			t.Errorf("onlyBit(%x) = %d, %v, want %d", c.words, n, one, c.one)
		}
	}
}
