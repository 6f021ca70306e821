package ldcache

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

func BenchmarkParse(b *testing.B) {
	b.Run("host", func(b *testing.B) {
		data, err := os.ReadFile("/etc/ld.so.cache")
		if err != nil {
			b.Skipf("no readable host cache: %v", err)
		}
		benchParse(b, data)
	})
	b.Run("generated-1000", func(b *testing.B) {
		benchParse(b, generated(b, 1000))
	})
}

func BenchmarkMarshal(b *testing.B) {
	data := generated(b, 1000)
	c, err := Parse(data)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.MarshalBinary(); err != nil {
			b.Fatal(err)
		}
	}
}

func benchParse(b *testing.B, data []byte) {
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

// generated returns a cache of n entries shaped like a distribution's: a
// 64-bit and a 32-bit copy of each library, versioned SONAMEs.
func generated(b *testing.B, n int) []byte {
	c := &Cache{}
	for i := range n / 2 {
		name := fmt.Sprintf("libgen%d.so.%d", i/3, i%3)
		c.Entries = append(c.Entries,
			Entry{Name: name, Path: "/usr/lib/x86_64-linux-gnu/" + name, Flags: FlagsX8664},
			Entry{Name: name, Path: "/usr/lib/i386-linux-gnu/" + name, Flags: FlagELFLibc6})
	}
	data, err := c.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkMarshalHostile reads back a crafted cache whose 10000 entries
// point at long overlapping strings, the worst a hostile image can do to the
// parse-and-rewrite path per 250 KB of file.
func BenchmarkMarshalHostile(b *testing.B) {
	const n = 10000
	data := make([]byte, newHeaderSize+n*newEntrySize)
	copy(data, newMagic)
	le.PutUint32(data[20:], n)
	strs := len(data)
	data = append(data, strings.Repeat("a", maxStringLen-1)...)
	data = append(data, '1', 0)
	for i := range n {
		e := data[newHeaderSize+i*newEntrySize:]
		le.PutUint32(e, uint32(FlagsX8664))
		le.PutUint32(e[4:], uint32(strs+maxStringLen-maxNameLen+(i*7)%maxNameLen))
		le.PutUint32(e[8:], uint32(strs+(i*13)%maxStringLen))
	}
	b.ReportAllocs()
	for b.Loop() {
		c, err := Parse(data)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.MarshalBinary(); err != nil {
			b.Fatal(err)
		}
	}
}
