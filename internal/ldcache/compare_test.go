package ldcache

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func sign(n int) int {
	switch {
	case n < 0:
		return -1
	case n > 0:
		return 1
	}
	return 0
}

func TestLibcmp(t *testing.T) {
	tests := []struct {
		a, b     string
		signed   int // expected sign with signed chars (x86)
		unsigned int // expected sign with unsigned chars (Arm)
	}{
		{"libfoo.so.1", "libfoo.so.1", 0, 0},
		{"libfoo.so.9", "libfoo.so.10", -1, -1},
		{"libfoo.so.10", "libfoo.so.9", 1, 1},
		{"libfoo.so.1.2", "libfoo.so.1.10", -1, -1},
		{"libfoo.so.01", "libfoo.so.1", 0, 0}, // leading zeros vanish numerically
		{"libfoo.so", "libfoo.so.1", -1, -1},
		{"libfoo.so.1", "libfoo.so", 1, 1},
		{"x2", "x10", -1, -1},
		{"a1", "ab", 1, 1}, // a digit sorts after any non-digit
		{"ab", "a1", -1, -1},
		{"a1", "a", 1, 1},
		{"a", "a1", -1, -1},
		{"libGL.so.1", "libgl.so.1", -1, -1},
		{"lib1a", "lib1b", -1, -1},
		{"", "", 0, 0},
		{"", "a", -1, -1},
		{"a", "", 1, 1},
		{"libc.so.6", "libc.so.6\x00junk", 0, 0}, // NUL ends a C string
		{"\x80", "a", -1, 1},
		{"a", "\x80", 1, -1},
		{"", "\x80", 1, -1}, // 0 - (char)0x80 is positive where char is signed
		{"\xff", "", -1, 1},
		// Digit runs accumulate in wrapping 32-bit ints, as in the loader:
		// 9999999999 mod 2^32 is 1410065407.
		{"lib9999999999", "lib1410065407", 0, 0},
		{"lib2147483648", "lib0", -1, -1}, // wraps to -2^31
	}
	for _, tt := range tests {
		if got := sign(libcmp(tt.a, tt.b, true)); got != tt.signed {
			t.Errorf("libcmp(%q, %q, signed) = %d, want %d", tt.a, tt.b, got, tt.signed)
		}
		if got := sign(libcmp(tt.a, tt.b, false)); got != tt.unsigned {
			t.Errorf("libcmp(%q, %q, unsigned) = %d, want %d", tt.a, tt.b, got, tt.unsigned)
		}
	}
}

// TestLibcmpAntisymmetric checks Compare on realistic names (short digit
// runs, ASCII), where it must be a consistent order for sorting to work.
func TestLibcmpAntisymmetric(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := "ab.-_019so"
	gen := func() string {
		b := make([]byte, r.IntN(8))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	for range 20000 {
		a, b, c := gen(), gen(), gen()
		ab, ba := sign(Compare(a, b)), sign(Compare(b, a))
		if ab != -ba {
			t.Fatalf("Compare(%q, %q) = %d but Compare(%q, %q) = %d", a, b, ab, b, a, ba)
		}
		if ab <= 0 && sign(Compare(b, c)) <= 0 && sign(Compare(a, c)) > 0 {
			t.Fatalf("not transitive: %q <= %q <= %q but %q > %q", a, b, c, a, c)
		}
	}
}

func TestSortOrder(t *testing.T) {
	x := FlagsX8664
	c := &Cache{Entries: []Entry{
		{Name: "libfoo.so.9", Path: "/l/9", Flags: x},
		{Name: "libfoo.so.1", Path: "/l/i386", Flags: FlagELFLibc6},
		{Name: "libfoo.so.1", Path: "/l/plain-first", Flags: x},
		{Name: "libfoo.so.1", Path: "/l/plain-second", Flags: x},
		{Name: "libfoo.so.1", Path: "/l/v3", Flags: x, HWCap: HWCapExtension, HWCapsSubdir: "x86-64-v3"},
		{Name: "libfoo.so.1", Path: "/l/v2", Flags: x, HWCap: HWCapExtension, HWCapsSubdir: "x86-64-v2"},
		{Name: "libfoo.so.1", Path: "/l/legacy", Flags: x, HWCap: 0x3},
		{Name: "libfoo.so.10", Path: "/l/10", Flags: x},
		{Name: "libbar.so.2", Path: "/l/bar", Flags: x},
		{Name: "libzz.so", Path: "/l/zz", Flags: x},
	}}
	c.Sort()
	var got []string
	for _, e := range c.Entries {
		got = append(got, e.Path)
	}
	want := []string{
		"/l/zz",
		"/l/10", "/l/9",
		// libfoo.so.1: x86-64 before i386 (higher flags), hwcaps first and
		// by name, then more legacy hwcap bits, then file order.
		"/l/v2", "/l/v3", "/l/legacy", "/l/plain-first", "/l/plain-second", "/l/i386",
		"/l/bar",
	}
	if !slices.Equal(got, want) {
		t.Errorf("sorted paths:\n got %q\nwant %q", got, want)
	}
}
