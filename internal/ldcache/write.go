package ldcache

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// generator is recorded in the extension section of caches we write, so
// that `ldconfig -p` shows who wrote the file.
const generator = "gantry ldcache"

// compareEntries orders entries as ldconfig does before writing: names in
// descending Compare order (the loader's binary search depends on it), then
// for equal names higher flags first, glibc-hwcaps entries before the
// others (the loader stops at the first ordinary entry) and by subdirectory
// name, then more legacy hwcap bits, higher hwcap and higher OS version
// first.
func compareEntries(a, b Entry) int {
	if r := Compare(b.Name, a.Name); r != 0 {
		return r
	}
	if r := cmp.Compare(b.Flags, a.Flags); r != 0 {
		return r
	}
	ah, bh := a.IsHWCaps(), b.IsHWCaps()
	switch {
	case ah && !bh:
		return -1
	case !ah && bh:
		return 1
	case ah && bh:
		if r := strings.Compare(a.HWCapsSubdir, b.HWCapsSubdir); r != 0 {
			return r
		}
	}
	if r := cmp.Compare(legacyHWCapBits(b), legacyHWCapBits(a)); r != 0 {
		return r
	}
	if r := cmp.Compare(legacyHWCap(b), legacyHWCap(a)); r != 0 {
		return r
	}
	return cmp.Compare(b.OSVersion, a.OSVersion)
}

// legacyHWCap is the hwcap value ldconfig sorts by: glibc-hwcaps entries
// count as 0 there, their marker bits being added only when writing.
func legacyHWCap(e Entry) uint64 {
	if e.IsHWCaps() {
		return 0
	}
	return e.HWCap
}

// Sort puts c.Entries in the order the loader expects (see MarshalBinary).
// The sort is stable: entries that tie keep their relative order, as they
// do in ldconfig, which lists them in the order it found them.
func (c *Cache) Sort() {
	slices.SortStableFunc(c.Entries, compareEntries)
}

// MarshalBinary encodes c in the new format ("glibc-ld.so.cache1.1",
// little-endian, with an extension section naming the generator and, when
// any entry needs it, the glibc-hwcaps subdirectories). Entries are written
// in the order Sort gives, which glibc's loader needs for its binary search;
// c itself is not modified. Identical strings share storage, and so does a
// name that ends its own path, as in ldconfig's output.
//
// An entry whose strings contain a NUL byte or exceed NAME_MAX (name,
// subdirectory) or PATH_MAX (path), or with HWCapsSubdir set but
// no HWCapExtension bit, is rejected with ErrInvalid.
func (c *Cache) MarshalBinary() ([]byte, error) {
	entries := slices.Clone(c.Entries)
	slices.SortStableFunc(entries, compareEntries)
	return marshalOrdered(entries)
}

// marshalOrdered writes entries in the order given. Tests use it to write
// a deliberately mis-sorted cache.
func marshalOrdered(entries []Entry) ([]byte, error) {
	hwcapsSet := map[string]bool{}
	for i, e := range entries {
		for _, s := range []string{e.Name, e.Path, e.HWCapsSubdir} {
			if strings.IndexByte(s, 0) >= 0 {
				return nil, fmt.Errorf("ld.so.cache: entry %d (%q): string %q contains a NUL byte: %w", i, e.Name, s, ErrInvalid)
			}
			if len(s) > maxStringLen {
				return nil, fmt.Errorf("ld.so.cache: entry %d (%q): string of %d bytes is longer than PATH_MAX (%d): %w", i, e.Name, len(s), maxStringLen, ErrInvalid)
			}
		}
		if len(e.Name) > maxNameLen || len(e.HWCapsSubdir) > maxNameLen {
			return nil, fmt.Errorf("ld.so.cache: entry %d (%q): name or glibc-hwcaps subdirectory longer than NAME_MAX (%d): %w", i, e.Name, maxNameLen, ErrInvalid)
		}
		if e.HWCapsSubdir != "" && !e.IsHWCaps() {
			return nil, fmt.Errorf("ld.so.cache: entry %d (%q): HWCapsSubdir %q set but HWCap %#x lacks HWCapExtension; set both or neither: %w",
				i, e.Name, e.HWCapsSubdir, e.HWCap, ErrInvalid)
		}
		if e.IsHWCaps() {
			hwcapsSet[e.HWCapsSubdir] = true
		}
	}
	// The loader expects the subdirectory names sorted (strcmp order).
	hwcaps := make([]string, 0, len(hwcapsSet))
	for s := range hwcapsSet {
		hwcaps = append(hwcaps, s)
	}
	slices.Sort(hwcaps)
	hwcapsIndex := make(map[string]uint32, len(hwcaps))
	for i, s := range hwcaps {
		hwcapsIndex[s] = uint32(i)
	}

	strOff := uint64(newHeaderSize) + uint64(len(entries))*newEntrySize
	table, offs := stringTable(entries, hwcaps)
	extOff := (strOff + uint64(len(table)) + 3) &^ 3
	nsec := uint64(1)
	if len(hwcaps) > 0 {
		nsec = 2
	}
	hwOff := extOff + extHeaderSize + nsec*extSectionSize
	genOff := hwOff + 4*uint64(len(hwcaps))
	size := genOff + uint64(len(generator))
	if size > math.MaxUint32 {
		return nil, fmt.Errorf("ld.so.cache: %d entries need %d bytes, more than the format's 4 GiB limit: %w", len(entries), size, ErrInvalid)
	}

	b := make([]byte, size)
	copy(b, newMagic)
	le.PutUint32(b[20:], uint32(len(entries)))
	le.PutUint32(b[24:], uint32(len(table)))
	b[28] = endianLittle
	le.PutUint32(b[32:], uint32(extOff))
	for i, e := range entries {
		p := b[newHeaderSize+i*newEntrySize:]
		hwcap := e.HWCap
		if e.IsHWCaps() {
			hwcap = hwcap&^0xffffffff | uint64(hwcapsIndex[e.HWCapsSubdir])
		}
		le.PutUint32(p, uint32(e.Flags))
		le.PutUint32(p[4:], uint32(strOff)+offs[e.Name])
		le.PutUint32(p[8:], uint32(strOff)+offs[e.Path])
		le.PutUint32(p[12:], e.OSVersion)
		le.PutUint64(p[16:], hwcap)
	}
	copy(b[strOff:], table)

	x := b[extOff:]
	le.PutUint32(x, extMagic)
	le.PutUint32(x[4:], uint32(nsec))
	sec := x[extHeaderSize:]
	le.PutUint32(sec, extTagGenerator)
	le.PutUint32(sec[8:], uint32(genOff))
	le.PutUint32(sec[12:], uint32(len(generator)))
	if len(hwcaps) > 0 {
		sec = sec[extSectionSize:]
		le.PutUint32(sec, extTagGlibcHWCaps)
		le.PutUint32(sec[8:], uint32(hwOff))
		le.PutUint32(sec[12:], uint32(4*len(hwcaps)))
		for i, s := range hwcaps {
			le.PutUint32(b[hwOff+4*uint64(i):], uint32(strOff)+offs[s])
		}
	}
	copy(b[genOff:], generator)
	return b, nil
}

// stringTable lays out the NUL-terminated strings of entries and the
// hwcaps names, storing each distinct string once and a name that ends its
// entry's path (the usual case: /usr/lib/libfoo.so.1 and libfoo.so.1)
// inside the path. It returns the table and each string's offset in it. It
// runs in time linear in the input, so that a hostile cache read and written
// back cannot stall the caller.
func stringTable(entries []Entry, hwcaps []string) ([]byte, map[string]uint32) {
	offs := make(map[string]uint32, 2*len(entries)+len(hwcaps))
	var table []byte
	place := func(s string) uint32 {
		if o, ok := offs[s]; ok {
			return o
		}
		o := uint32(len(table))
		offs[s] = o
		table = append(table, s...)
		table = append(table, 0)
		return o
	}
	for _, e := range entries {
		p := place(e.Path)
		if _, ok := offs[e.Name]; !ok && strings.HasSuffix(e.Path, e.Name) {
			offs[e.Name] = p + uint32(len(e.Path)-len(e.Name))
		}
		place(e.Name)
	}
	for _, s := range hwcaps {
		place(s)
	}
	return table, offs
}
