package ldcache

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

const multiarch = "/usr/lib/x86_64-linux-gnu"

// testdataWant is what ldconfig (glibc 2.36) wrote into testdata/*.cache for
// the fixture of real_test.go; regenerate with `go test -run TestRealCaches
// -update`.
var testdataWant = []Entry{
	{Name: "libthirty.so.1", Path: "/usr/lib32/libthirty.so.1", Flags: FlagELF},
	{Name: "libfoo.so.1", Path: multiarch + "/glibc-hwcaps/x86-64-v3/libfoo.so.1", Flags: FlagsX8664, HWCap: HWCapExtension, HWCapsSubdir: "x86-64-v3"},
	{Name: "libfoo.so.1", Path: multiarch + "/libfoo.so.1", Flags: FlagsX8664},
	{Name: "libbar.so.10", Path: "/opt/gantry/lib/libbar.so.10", Flags: FlagsX8664},
	{Name: "libbar.so.9", Path: "/opt/gantry/lib/libbar.so.9", Flags: FlagsX8664},
}

// TestTestdata parses the committed ldconfig output, so the parser is
// covered on machines without gcc or ldconfig.
func TestTestdata(t *testing.T) {
	for _, tt := range []struct {
		file   string
		format Format
	}{
		{"new.cache", FormatNew},
		{"compat.cache", FormatCompat},
		{"old.cache", FormatOld},
	} {
		t.Run(tt.file, func(t *testing.T) {
			c, err := Open(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			want := slices.Clone(testdataWant)
			if tt.format == FormatOld {
				want[1].HWCap, want[1].HWCapsSubdir = 0, ""
			}
			if c.Format != tt.format || !slices.Equal(c.Entries, want) {
				t.Errorf("got format %v entries\n%v\nwant format %v entries\n%v", c.Format, c.Entries, tt.format, want)
			}
		})
	}
}

// oldFormat encodes entries in the old format, for tests.
func oldFormat(entries []Entry) []byte {
	var strs []byte
	b := []byte(oldMagic + "\x00")
	b = le.AppendUint32(b, uint32(len(entries)))
	for _, e := range entries {
		b = le.AppendUint32(b, uint32(e.Flags))
		b = le.AppendUint32(b, uint32(len(strs)))
		strs = append(append(strs, e.Name...), 0)
		b = le.AppendUint32(b, uint32(len(strs)))
		strs = append(append(strs, e.Path...), 0)
	}
	return append(b, strs...)
}

func sampleEntries() []Entry {
	x := FlagsX8664
	return []Entry{
		{Name: "libcuda.so.1", Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", Flags: x},
		{Name: "libcuda.so.1", Path: "/usr/lib/i386-linux-gnu/libcuda.so.1", Flags: FlagELFLibc6},
		{Name: "libcuda.so.1", Path: "/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libcuda.so.1", Flags: x,
			HWCap: HWCapExtension | 3<<32, HWCapsSubdir: "x86-64-v3"},
		{Name: "libnvidia-ml.so.1", Path: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", Flags: x, OSVersion: 0x030200},
		{Name: "libcuda.so.1", Path: "/usr/lib/aarch64-linux-gnu/libcuda.so.1", Flags: FlagsAArch64},
		{Name: "libold.so.2", Path: "/usr/lib/tls/libold.so.2", Flags: x, HWCap: 1 << 63},
	}
}

func TestOldFormat(t *testing.T) {
	entries := sampleEntries()
	for i := range entries {
		entries[i].OSVersion, entries[i].HWCap, entries[i].HWCapsSubdir = 0, 0, ""
	}
	c, err := Parse(oldFormat(entries))
	if err != nil {
		t.Fatal(err)
	}
	if c.Format != FormatOld || !slices.Equal(c.Entries, entries) {
		t.Errorf("got %v %v, want old %v", c.Format, c.Entries, entries)
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	c := &Cache{Entries: sampleEntries()}
	b, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got Cache
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(c.Entries)
	slices.SortStableFunc(want, compareEntries)
	if !slices.Equal(got.Entries, want) {
		t.Errorf("round trip:\n got %v\nwant %v", got.Entries, want)
	}
	if !slices.Equal(c.Entries, sampleEntries()) {
		t.Error("MarshalBinary reordered the caller's entries")
	}
	if got.Format != FormatNew || got.Generator != generator {
		t.Errorf("Format %v Generator %q", got.Format, got.Generator)
	}
	// Writing is deterministic.
	b2, _ := got.MarshalBinary()
	if !bytes.Equal(b, b2) {
		t.Error("marshalling the parsed cache gave different bytes")
	}
}

func TestMarshalInvalid(t *testing.T) {
	for _, e := range []Entry{
		{Name: "lib\x00x.so", Path: "/x"},
		{Name: "libx.so", Path: "/x\x00"},
		{Name: "libx.so", Path: "/x", HWCapsSubdir: "x86-64-v3"},
		{Name: "libx.so", Path: "/" + strings.Repeat("x", maxStringLen)},
		{Name: strings.Repeat("x", maxNameLen+1), Path: "/x"},
	} {
		_, err := (&Cache{Entries: []Entry{e}}).MarshalBinary()
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("MarshalBinary(%q) error = %v, want ErrInvalid", e, err)
		}
	}
}

func TestStringTable(t *testing.T) {
	entries := []Entry{
		{Name: "libx.so.1", Path: "/a/libx.so.1"},
		{Name: "libx.so.1", Path: "/b/libx.so.1.0"},
		{Name: "liby.so", Path: "/a/libx.so.1"},
		{Name: "", Path: "/b/libx.so.1.0"},
	}
	hwcaps := []string{"x86-64-v3", "liby.so"}
	table, offs := stringTable(entries, hwcaps)
	want := len("/a/libx.so.1\x00/b/libx.so.1.0\x00liby.so\x00x86-64-v3\x00")
	if len(table) != want {
		t.Errorf("table is %d bytes (%q), want %d: strings not shared", len(table), table, want)
	}
	check := func(s string) {
		o := offs[s]
		end := bytes.IndexByte(table[o:], 0)
		if end < 0 || string(table[o:int(o)+end]) != s {
			t.Errorf("offset %d of %q reads back %q", o, s, table[o:])
		}
	}
	for _, e := range entries {
		check(e.Name)
		check(e.Path)
	}
	for _, s := range hwcaps {
		check(s)
	}
}

func TestEntryHelpers(t *testing.T) {
	tests := []struct {
		flags      int32
		is64, is32 bool
		arch       string
	}{
		{FlagsX8664, true, false, "libc6,x86-64"},
		{FlagsAArch64, true, false, "libc6,AArch64"},
		{FlagELFLibc6, false, true, "libc6"},
		{FlagELF, false, true, "ELF"},
		{FlagELFLibc6 | FlagX8664LibX32, false, true, "libc6,x32"},
		{FlagELFLibc6 | FlagARMLibHF, false, true, "libc6,hard-float"},
		{FlagELFLibc6 | FlagPowerPCLib64, true, false, "libc6,64bit"},
		{FlagELFLibc6 | FlagRISCVFloatABIDouble, false, false, "libc6,double-float"},
		{FlagLibc4, false, false, "libc4"},
		{0x0007 | 0x7f00, false, false, "unknown,32512"},
	}
	for _, tt := range tests {
		e := Entry{Name: "l", Path: "/l", Flags: tt.flags}
		if e.Is64Bit() != tt.is64 || e.Is32Bit() != tt.is32 || e.Arch() != tt.arch {
			t.Errorf("flags %#x: Is64Bit %v Is32Bit %v Arch %q, want %v %v %q",
				tt.flags, e.Is64Bit(), e.Is32Bit(), e.Arch(), tt.is64, tt.is32, tt.arch)
		}
	}
	for _, tt := range []struct {
		e    Entry
		want string
	}{
		{Entry{Name: "a.so", Path: "/a.so", Flags: FlagsX8664}, "a.so (libc6,x86-64) => /a.so"},
		{Entry{Name: "a.so", Path: "/a.so", Flags: FlagsX8664, HWCap: HWCapExtension, HWCapsSubdir: "x86-64-v2"},
			`a.so (libc6,x86-64, hwcap: "x86-64-v2") => /a.so`},
		{Entry{Name: "a.so", Path: "/a.so", Flags: 3, HWCap: 1 << 63}, "a.so (libc6, hwcap: 0x8000000000000000) => /a.so"},
		{Entry{Name: "a.so", Path: "/a.so", Flags: 3, OSVersion: 0x00020612}, "a.so (libc6, OS ABI: Linux 2.6.18) => /a.so"},
	} {
		if got := tt.e.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

func TestLookup(t *testing.T) {
	c := &Cache{Entries: sampleEntries()}
	c.Sort()
	if got, want := c.Lookup("libcuda.so.1"), []string{
		"/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libcuda.so.1",
		"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
	}; !slices.Equal(got, want) {
		t.Errorf("Lookup = %q, want %q", got, want)
	}
	if got, want := c.LookupFlags("libcuda.so.1", FlagsAArch64), []string{"/usr/lib/aarch64-linux-gnu/libcuda.so.1"}; !slices.Equal(got, want) {
		t.Errorf("LookupFlags(aarch64) = %q, want %q", got, want)
	}
	if got := c.Lookup("libcuda.so"); got != nil {
		t.Errorf("Lookup(libcuda.so) = %q, want nil", got)
	}
	var n32 int
	for e := range c.Libraries() {
		if e.Is32Bit() {
			n32++
		}
	}
	if n32 != 1 {
		t.Errorf("Libraries: %d 32-bit entries, want 1", n32)
	}
	for range c.Libraries() {
		break // early exit must not panic
	}
}

// patch returns a copy of b with v written at off.
func patch(b []byte, off int, v uint32) []byte {
	b = slices.Clone(b)
	le.PutUint32(b[off:], v)
	return b
}

func TestParseCorrupt(t *testing.T) {
	good, err := (&Cache{Entries: sampleEntries()}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(good); err != nil {
		t.Fatal(err)
	}
	extOff := int(le.Uint32(good[32:]))
	entry0 := newHeaderSize
	hwEntry := -1 // file offset of the glibc-hwcaps entry
	for i := range int(le.Uint32(good[20:])) {
		if off := newHeaderSize + i*newEntrySize; isExtension(le.Uint64(good[off+16:])) {
			hwEntry = off
		}
	}
	old := oldFormat(sampleEntries()[:2])

	tests := []struct {
		name string
		in   []byte
		want string // substring of the error
		err  error
	}{
		{"empty", nil, "bad magic", ErrCorrupt},
		{"garbage", []byte("\x7fELF\x02\x01\x01\x00 not a cache at all"), "bad magic", ErrCorrupt},
		{"short magic", []byte("glibc-ld.so.cache1."), "bad magic", ErrCorrupt},
		{"old magic only", []byte(oldMagic), "truncated old-format header", ErrCorrupt},
		{"new header truncated", good[:30], "truncated new-format header", ErrCorrupt},
		{"new count overflow", patch(good, 20, 0xffffffff), "entry count 4294967295 is over the limit of 65536", ErrCorrupt},
		{"new count over the limit", patch(good, 20, MaxEntries+1), "entry count 65537 is over the limit", ErrCorrupt},
		{"new count just too big", patch(good, 20, uint32((len(good)-newHeaderSize)/newEntrySize+1)), "does not fit", ErrCorrupt},
		{"string table too long", patch(good, 24, uint32(len(good))), "past the end of the file", ErrCorrupt},
		{"big endian", patch(good, 28, endianBig), "big-endian", ErrUnsupported},
		{"invalid endian", patch(good, 28, 1), "marks the file invalid", ErrCorrupt},
		{"name offset out of range", patch(good, entry0+4, 0x7fffffff), "name string offset 0x7fffffff out of range", ErrCorrupt},
		{"path offset at end", patch(good, entry0+8, uint32(len(good))), "path string offset", ErrCorrupt},
		{"path not terminated", patch(good, entry0+8, uint32(len(good)-2)), "not NUL-terminated", ErrCorrupt},
		{"hwcaps index", patch(good, hwEntry+16, 9), "glibc-hwcaps index 9 out of range", ErrCorrupt},
		{"extension misaligned", patch(good, 32, uint32(extOff+1)), "not a multiple of 4", ErrCorrupt},
		{"extension out of range", patch(good, 32, uint32(len(good)+4)&^3), "extension offset", ErrCorrupt},
		{"extension magic", patch(good, extOff, 0x12345678), "bad extension magic 0x12345678", ErrCorrupt},
		{"extension count", patch(good, extOff+4, 0x10000000), "extension section count", ErrCorrupt},
		{"extension section offset", patch(good, extOff+extHeaderSize+8, 0xfffffff0), "out of range", ErrCorrupt},
		{"extension section size", patch(good, extOff+extHeaderSize+12, 0xffffffff), "out of range", ErrCorrupt},
		{"hwcaps name offset", patch(good, int(le.Uint32(good[extOff+extHeaderSize+extSectionSize+8:])), 0xffff), "glibc-hwcaps name string offset", ErrCorrupt},
		{"string too long", oldFormat([]Entry{{Name: "libx.so", Path: "/" + strings.Repeat("x", maxStringLen)}}), "longer than 4096 bytes", ErrCorrupt},
		{"name too long", oldFormat([]Entry{{Name: strings.Repeat("x", maxNameLen+1), Path: "/x"}}), "name at 0x0 is longer than 255 bytes", ErrCorrupt},
		{"old count overflow", patch(old, 12, 0xffffffff), "old-format entry count", ErrCorrupt},
		{"old key out of range", patch(old, oldHeaderSize+4, 0x1000), "string offset 0x1000 out of range", ErrCorrupt},
		{"compat with corrupt new part", append(slices.Clone(old[:oldHeaderSize+2*oldEntrySize]), patch(good, 20, 0xffff)...), "entry count 65535", ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse(tt.in)
			if err == nil {
				t.Fatalf("Parse succeeded with %d entries, want error containing %q", len(c.Entries), tt.want)
			}
			if !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "ld.so.cache: ") {
				t.Errorf("error %q, want %v containing %q", err, tt.err, tt.want)
			}
		})
	}
}

// A real cache (valid in every other way) with more entries than any
// system has is refused: decoding millions of entries cost over a gigabyte.
// One at the limit still parses.
func TestParseEntryLimit(t *testing.T) {
	entries := func(n int) []Entry {
		out := make([]Entry, n)
		for i := range out {
			out[i] = Entry{Name: fmt.Sprintf("lib%d.so.1", i), Path: fmt.Sprintf("/l/lib%d.so.1", i), Flags: FlagELFLibc6 | FlagX8664Lib64}
		}
		return out
	}
	at, err := (&Cache{Entries: entries(MaxEntries)}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if c, err := Parse(at); err != nil || len(c.Entries) != MaxEntries {
		t.Fatalf("a cache of %d entries: %v", MaxEntries, err)
	}
	over, err := (&Cache{Entries: entries(MaxEntries + 1)}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(over); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "over the limit") {
		t.Errorf("a cache of %d entries: %v, want ErrCorrupt over the limit", MaxEntries+1, err)
	}
}

// TestParseTruncated cuts a cache at every length: the extension data sits
// at the end of the file, so every cut must be reported, never panic.
func TestParseTruncated(t *testing.T) {
	inputs := [][]byte{oldFormat(sampleEntries())}
	if b, err := (&Cache{Entries: sampleEntries()}).MarshalBinary(); err == nil {
		inputs = append(inputs, b)
	}
	if b, err := os.ReadFile("testdata/compat.cache"); err == nil {
		inputs = append(inputs, b)
	}
	for _, b := range inputs {
		for n := range len(b) {
			if c, err := Parse(b[:n]); err == nil {
				t.Errorf("Parse of %d of %d bytes succeeded with %d entries", n, len(b), len(c.Entries))
			} else if !errors.Is(err, ErrCorrupt) {
				t.Errorf("Parse of %d bytes: %v, want ErrCorrupt", n, err)
			}
		}
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	if _, err := Open(missing); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("Open(missing) = %v, want ErrNotExist naming the path", err)
	}
	if _, err := Open(dir); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), dir) {
		t.Errorf("Open(dir) = %v, want ErrCorrupt naming the path", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err == nil {
		// Must return at once rather than wait for a writer.
		if _, err := Open(fifo); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Open(fifo) = %v, want ErrCorrupt", err)
		}
	}
	bad := filepath.Join(dir, "ld.so.cache")
	if err := os.WriteFile(bad, []byte("glibc-ld.so.cache1.1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(bad); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "ldconfig") {
		t.Errorf("Open(corrupt) = %v, want ErrCorrupt naming the path and the fix", err)
	}
}
