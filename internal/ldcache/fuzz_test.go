package ldcache

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// FuzzParse checks that Parse never panics, that every error is classified,
// and that whatever Parse accepts MarshalBinary writes and Parse reads back
// as the same entries in the loader's order.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.cache")
	seeds = append(seeds, "/etc/ld.so.cache")
	for _, p := range seeds {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	if b, err := (&Cache{Entries: sampleEntries()}).MarshalBinary(); err == nil {
		f.Add(b)
	}
	f.Add(oldFormat(sampleEntries()[:3]))
	f.Add([]byte(newMagic))

	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		out, err := c.MarshalBinary()
		if err != nil {
			t.Fatalf("MarshalBinary of a parsed cache: %v", err)
		}
		c2, err := Parse(out)
		if err != nil {
			t.Fatalf("Parse of our own output: %v", err)
		}
		want := slices.Clone(c.Entries)
		slices.SortStableFunc(want, compareEntries)
		if !slices.Equal(c2.Entries, want) {
			t.Fatalf("round trip:\n got %v\nwant %v", c2.Entries, want)
		}
	})
}
