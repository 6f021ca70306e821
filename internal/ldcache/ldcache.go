package ldcache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"iter"
	"math/bits"
	"os"
	"strings"
	"syscall"
)

// ErrCorrupt is wrapped by every error that reports a malformed, truncated or
// unrecognised cache file.
var ErrCorrupt = errors.New("corrupt ld.so.cache")

// ErrUnsupported is wrapped when a well-formed cache cannot be read by this
// package: today only caches written for a big-endian machine.
var ErrUnsupported = errors.New("unsupported ld.so.cache")

// ErrInvalid is wrapped by MarshalBinary when an entry cannot be written.
var ErrInvalid = errors.New("invalid ld.so.cache entry")

// Flag bits of Entry.Flags, as ldconfig writes them. The low byte is the
// library type, the second byte the ABI the library requires.
const (
	FlagTypeMask     int32 = 0x00ff
	FlagLibc4        int32 = 0x0000 // a.out, long obsolete
	FlagELF          int32 = 0x0001 // ELF without a recognised libc dependency
	FlagELFLibc5     int32 = 0x0002
	FlagELFLibc6     int32 = 0x0003 // glibc ELF library
	FlagRequiredMask int32 = 0xff00

	FlagSPARCLib64          int32 = 0x0100
	FlagIA64Lib64           int32 = 0x0200
	FlagX8664Lib64          int32 = 0x0300
	FlagS390Lib64           int32 = 0x0400
	FlagPowerPCLib64        int32 = 0x0500
	FlagMIPS64LibN32        int32 = 0x0600
	FlagMIPS64LibN64        int32 = 0x0700
	FlagX8664LibX32         int32 = 0x0800
	FlagARMLibHF            int32 = 0x0900
	FlagAArch64Lib64        int32 = 0x0a00
	FlagARMLibSF            int32 = 0x0b00
	FlagMIPSLib32NaN2008    int32 = 0x0c00
	FlagMIPS64LibN32NaN2008 int32 = 0x0d00
	FlagMIPS64LibN64NaN2008 int32 = 0x0e00
	FlagRISCVFloatABISoft   int32 = 0x0f00
	FlagRISCVFloatABIDouble int32 = 0x1000
	FlagLArchFloatABISoft   int32 = 0x1100
	FlagLArchFloatABIDouble int32 = 0x1200

	// FlagsX8664 is the exact flags word of a 64-bit x86-64 glibc library;
	// the x86-64 loader uses no other entry.
	FlagsX8664 = FlagELFLibc6 | FlagX8664Lib64
	// FlagsAArch64 is the exact flags word of a 64-bit Arm glibc library.
	FlagsAArch64 = FlagELFLibc6 | FlagAArch64Lib64
	// FlagsI386 is the flags word ldconfig writes on an x86-64 host for a
	// 32-bit i386 library that links glibc ("(libc6)" in `ldconfig -p`):
	// the library type alone, the required-ABI byte 0 being the platform's
	// default 32-bit ABI. ldconfig gives FlagELF to one without a libc
	// dependency; the i386 loader accepts both, the x86-64 loader neither.
	FlagsI386 = FlagELFLibc6
)

// HWCapExtension is the bit of Entry.HWCap that marks a glibc-hwcaps entry
// (a library under a glibc-hwcaps/<name>/ subdirectory, see HWCapsSubdir).
const HWCapExtension uint64 = 1 << 62

// hwcapISALevelMask covers the ISA level bits that glibc keeps in bits
// 32..41 of a glibc-hwcaps entry's hwcap word.
const hwcapISALevelMask uint64 = 0x3ff << 32

// Format says which on-disk layout a cache was read from.
type Format int

const (
	// FormatNew is the "glibc-ld.so.cache1.1" layout alone (ldconfig's
	// default since glibc 2.32, and what MarshalBinary writes).
	FormatNew Format = iota
	// FormatOld is the libc5-era "ld.so-1.7.0" layout alone.
	FormatOld
	// FormatCompat is the old layout with the new one hidden in its string
	// table (ldconfig -c compat, the default before glibc 2.32).
	FormatCompat
)

func (f Format) String() string {
	switch f {
	case FormatNew:
		return "new"
	case FormatOld:
		return "old"
	case FormatCompat:
		return "compat"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// Entry is one library in the cache.
type Entry struct {
	// Name is the key the loader looks up: the SONAME, e.g. "libcuda.so.1".
	Name string
	// Path is the absolute path of the library as recorded in the cache.
	Path string
	// Flags is the raw flags word (library type and required ABI, see the
	// Flag constants).
	Flags int32
	// OSVersion is the minimum kernel version from the library's ABI note
	// (0 when absent; always 0 in the old format).
	OSVersion uint32
	// HWCap is the raw hardware-capability word (0 for ordinary entries and
	// always in the old format). For glibc-hwcaps entries it holds
	// HWCapExtension plus the ISA level bits; the section index that the
	// file stores in the low 32 bits is resolved into HWCapsSubdir and
	// cleared here, so that entries compare equal across files.
	HWCap uint64
	// HWCapsSubdir names the glibc-hwcaps subdirectory (e.g. "x86-64-v3")
	// of a glibc-hwcaps entry; empty otherwise.
	HWCapsSubdir string
}

// IsHWCaps reports whether e is a glibc-hwcaps entry, which the loader only
// uses on CPUs that support the named subdirectory.
func (e Entry) IsHWCaps() bool {
	return isExtension(e.HWCap)
}

func isExtension(hwcap uint64) bool {
	return (hwcap>>32)&^(hwcapISALevelMask>>32) == HWCapExtension>>32
}

func (e Entry) isELF() bool {
	t := e.Flags & FlagTypeMask
	return t == FlagELF || t == FlagELFLibc5 || t == FlagELFLibc6
}

// Is64Bit reports whether e is a 64-bit (ELFCLASS64) ELF library, judged
// from the ABI byte of its flags.
func (e Entry) Is64Bit() bool {
	if !e.isELF() {
		return false
	}
	switch e.Flags & FlagRequiredMask {
	case FlagSPARCLib64, FlagIA64Lib64, FlagX8664Lib64, FlagS390Lib64,
		FlagPowerPCLib64, FlagMIPS64LibN64, FlagAArch64Lib64,
		FlagMIPS64LibN64NaN2008, FlagLArchFloatABISoft, FlagLArchFloatABIDouble:
		return true
	}
	return false
}

// Is32Bit reports whether e is a 32-bit (ELFCLASS32) ELF library: the
// platform's default 32-bit ABI (i386 on an x86-64 host, flags 0x0001 or
// 0x0003) or one of the 32-bit ABI variants (x32, Arm hard/soft float, MIPS
// n32/o32). RISC-V entries carry only a float ABI, so they are neither.
func (e Entry) Is32Bit() bool {
	if !e.isELF() {
		return false
	}
	switch e.Flags & FlagRequiredMask {
	case 0, FlagX8664LibX32, FlagARMLibHF, FlagARMLibSF, FlagMIPS64LibN32,
		FlagMIPSLib32NaN2008, FlagMIPS64LibN32NaN2008:
		return true
	}
	return false
}

// Arch describes e.Flags the way `ldconfig -p` does inside its parentheses,
// e.g. "libc6,x86-64", "libc6" (i386) or "libc6,AArch64".
func (e Entry) Arch() string {
	var s string
	switch e.Flags & FlagTypeMask {
	case FlagLibc4:
		s = "libc4"
	case FlagELF:
		s = "ELF"
	case FlagELFLibc5:
		s = "libc5"
	case FlagELFLibc6:
		s = "libc6"
	default:
		s = "unknown"
	}
	switch req := e.Flags & FlagRequiredMask; req {
	case 0:
	case FlagSPARCLib64, FlagS390Lib64, FlagPowerPCLib64, FlagMIPS64LibN64:
		s += ",64bit"
	case FlagIA64Lib64:
		s += ",IA-64"
	case FlagX8664Lib64:
		s += ",x86-64"
	case FlagMIPS64LibN32:
		s += ",N32"
	case FlagX8664LibX32:
		s += ",x32"
	case FlagARMLibHF:
		s += ",hard-float"
	case FlagAArch64Lib64:
		s += ",AArch64"
	case FlagARMLibSF, FlagRISCVFloatABISoft, FlagLArchFloatABISoft:
		s += ",soft-float"
	case FlagMIPSLib32NaN2008:
		s += ",nan2008"
	case FlagMIPS64LibN32NaN2008:
		s += ",N32,nan2008"
	case FlagMIPS64LibN64NaN2008:
		s += ",64bit,nan2008"
	case FlagRISCVFloatABIDouble, FlagLArchFloatABIDouble:
		s += ",double-float"
	default:
		s += fmt.Sprintf(",%d", req)
	}
	return s
}

// String formats e like one line of `ldconfig -p` (without the leading tab),
// e.g. "libfoo.so.1 (libc6,x86-64) => /usr/lib/libfoo.so.1".
func (e Entry) String() string {
	var b strings.Builder
	b.WriteString(e.Name)
	b.WriteString(" (")
	b.WriteString(e.Arch())
	if e.IsHWCaps() {
		fmt.Fprintf(&b, ", hwcap: %q", e.HWCapsSubdir)
	} else if e.HWCap != 0 {
		fmt.Fprintf(&b, ", hwcap: 0x%016x", e.HWCap)
	}
	if e.OSVersion != 0 {
		oses := []string{"Linux", "Hurd", "Solaris", "FreeBSD", "kNetBSD", "Syllable", "Unknown OS"}
		os := min(int(e.OSVersion>>24), len(oses)-1)
		fmt.Fprintf(&b, ", OS ABI: %s %d.%d.%d", oses[os],
			(e.OSVersion>>16)&0xff, (e.OSVersion>>8)&0xff, e.OSVersion&0xff)
	}
	b.WriteString(") => ")
	b.WriteString(e.Path)
	return b.String()
}

// Cache is a parsed ld.so.cache.
type Cache struct {
	// Entries are the libraries in file order, which for a file written by
	// ldconfig (or MarshalBinary) is the loader's search order.
	Entries []Entry
	// Format is the layout the cache was read from. MarshalBinary always
	// writes FormatNew.
	Format Format
	// Generator is the text of the generator extension section (e.g.
	// "ldconfig (GNU libc) stable release version 2.36"), if any. It is
	// informational; MarshalBinary records its own generator.
	Generator string
}

// On-disk layout constants (sizes in bytes, all little-endian).
const (
	oldMagic       = "ld.so-1.7.0"
	oldHeaderSize  = 16 // magic[11], pad[1], nlibs u32
	oldEntrySize   = 12 // flags i32, key u32, value u32
	newMagic       = "glibc-ld.so.cache1.1"
	newHeaderSize  = 48 // magic+version[20], nlibs, len_strings, flags u8, pad[3], extension_offset, unused[3]
	newEntrySize   = 24 // flags, key, value, osversion u32, hwcap u64
	newAlign       = 8  // alignment of the new header inside a compat file
	extMagic       = 0xeaa42174
	extHeaderSize  = 8  // magic, count
	extSectionSize = 16 // tag, flags, offset, size

	extTagGenerator   = 0
	extTagGlibcHWCaps = 1

	endianMask   = 3
	endianUnset  = 0
	endianLittle = 2
	endianBig    = 3
)

var le = binary.LittleEndian

func corrupt(format string, args ...any) error {
	return fmt.Errorf("ld.so.cache: "+format+": %w", append(args, ErrCorrupt)...)
}

// Parse parses the bytes of an ld.so.cache in either format. A compat file is
// read from its embedded new-format part, as the loader does. Parse keeps no
// reference to b, but the strings of all entries share one copy of the
// file's string table.
func Parse(b []byte) (*Cache, error) {
	switch {
	case len(b) >= len(oldMagic) && string(b[:len(oldMagic)]) == oldMagic:
		return parseOld(b)
	case len(b) >= len(newMagic) && string(b[:len(newMagic)]) == newMagic:
		c, err := parseNew(b, 0)
		if err != nil {
			return nil, err
		}
		c.Format = FormatNew
		return c, nil
	}
	n := min(len(b), len(newMagic))
	return nil, corrupt("bad magic %q (want %q or %q)", b[:n], oldMagic, newMagic)
}

func parseOld(b []byte) (*Cache, error) {
	if len(b) < oldHeaderSize {
		return nil, corrupt("truncated old-format header (%d bytes, need %d)", len(b), oldHeaderSize)
	}
	nlibs := uint64(le.Uint32(b[12:]))
	if nlibs > MaxEntries {
		return nil, corrupt("old-format entry count %d is over the limit of %d", nlibs, MaxEntries)
	}
	if nlibs > uint64(len(b)-oldHeaderSize)/oldEntrySize {
		return nil, corrupt("old-format entry count %d does not fit in %d bytes", nlibs, len(b))
	}
	end := oldHeaderSize + int(nlibs)*oldEntrySize

	// The new format, when present, starts at the next aligned offset.
	if off := (end + newAlign - 1) &^ (newAlign - 1); off+newHeaderSize <= len(b) &&
		string(b[off:off+len(newMagic)]) == newMagic {
		c, err := parseNew(b, off)
		if err != nil {
			return nil, err
		}
		c.Format = FormatCompat
		return c, nil
	}

	// Old-format string offsets count from the end of the entry table.
	strs := b[end:]
	str := string(strs)
	c := &Cache{Format: FormatOld, Entries: make([]Entry, 0, nlibs)}
	for i := range int(nlibs) {
		e := b[oldHeaderSize+i*oldEntrySize:]
		name, err := cstring(strs, str, le.Uint32(e[4:]), i, "name")
		if err != nil {
			return nil, err
		}
		path, err := cstring(strs, str, le.Uint32(e[8:]), i, "path")
		if err != nil {
			return nil, err
		}
		if len(name) > maxNameLen {
			return nil, corrupt("entry %d: name at %#x is longer than %d bytes", i, le.Uint32(e[4:]), maxNameLen)
		}
		c.Entries = append(c.Entries, Entry{Name: name, Path: path, Flags: int32(le.Uint32(e))})
	}
	return c, nil
}

// parseNew reads the new-format cache whose header starts at b[base:].
// String offsets count from that header; extension offsets from the start of
// the file.
func parseNew(b []byte, base int) (*Cache, error) {
	h := b[base:]
	if len(h) < newHeaderSize {
		return nil, corrupt("truncated new-format header (%d bytes, need %d)", len(h), newHeaderSize)
	}
	if string(h[:len(newMagic)]) != newMagic {
		return nil, corrupt("bad new-format magic %q", h[:len(newMagic)])
	}
	nlibs := uint64(le.Uint32(h[20:]))
	if nlibs > MaxEntries {
		return nil, corrupt("entry count %d is over the limit of %d", nlibs, MaxEntries)
	}
	lenStrings := uint64(le.Uint32(h[24:]))
	switch h[28] & endianMask {
	case endianUnset, endianLittle:
	case endianBig:
		return nil, fmt.Errorf("ld.so.cache: written for a big-endian machine: %w", ErrUnsupported)
	default:
		return nil, corrupt("endianness flag marks the file invalid")
	}
	extOff := uint64(le.Uint32(h[32:]))

	if nlibs > uint64(len(h)-newHeaderSize)/newEntrySize {
		return nil, corrupt("entry count %d does not fit in %d bytes", nlibs, len(h))
	}
	if end := newHeaderSize + nlibs*newEntrySize + lenStrings; end > uint64(len(h)) {
		return nil, corrupt("string table of %d bytes ends at %#x, past the end of the file (%#x)",
			lenStrings, uint64(base)+end, len(b))
	}

	c := &Cache{Entries: make([]Entry, 0, nlibs)}
	str := string(h)
	hwcaps, err := parseExtensions(b, h, str, extOff, c)
	if err != nil {
		return nil, err
	}

	for i := range int(nlibs) {
		e := h[newHeaderSize+i*newEntrySize:]
		name, err := cstring(h, str, le.Uint32(e[4:]), i, "name")
		if err != nil {
			return nil, err
		}
		path, err := cstring(h, str, le.Uint32(e[8:]), i, "path")
		if err != nil {
			return nil, err
		}
		if len(name) > maxNameLen {
			return nil, corrupt("entry %d: name at %#x is longer than %d bytes", i, le.Uint32(e[4:]), maxNameLen)
		}
		ent := Entry{
			Name:      name,
			Path:      path,
			Flags:     int32(le.Uint32(e)),
			OSVersion: le.Uint32(e[12:]),
			HWCap:     le.Uint64(e[16:]),
		}
		if isExtension(ent.HWCap) {
			idx := uint32(ent.HWCap)
			if uint64(idx) >= uint64(len(hwcaps)) {
				return nil, corrupt("entry %d: glibc-hwcaps index %d out of range (%d subdirectories)", i, idx, len(hwcaps))
			}
			ent.HWCapsSubdir = hwcaps[idx]
			ent.HWCap &^= 0xffffffff
		}
		c.Entries = append(c.Entries, ent)
	}
	return c, nil
}

// parseExtensions reads the extension directory at file offset off, fills in
// c.Generator and returns the glibc-hwcaps subdirectory names by index.
func parseExtensions(b, h []byte, str string, off uint64, c *Cache) ([]string, error) {
	if off == 0 {
		return nil, nil // written by glibc before 2.33
	}
	if off%4 != 0 {
		return nil, corrupt("extension offset %#x is not a multiple of 4", off)
	}
	if off+extHeaderSize > uint64(len(b)) {
		return nil, corrupt("extension offset %#x out of range (file is %#x bytes)", off, len(b))
	}
	if m := le.Uint32(b[off:]); m != extMagic {
		return nil, corrupt("bad extension magic %#x at %#x", m, off)
	}
	count := uint64(le.Uint32(b[off+4:]))
	if count > (uint64(len(b))-off-extHeaderSize)/extSectionSize {
		return nil, corrupt("extension section count %d does not fit in the file", count)
	}
	var hwcaps []string
	for i := range count {
		s := b[off+extHeaderSize+i*extSectionSize:]
		tag, soff, size := le.Uint32(s), uint64(le.Uint32(s[8:])), uint64(le.Uint32(s[12:]))
		if soff+size > uint64(len(b)) {
			return nil, corrupt("extension section %d (tag %d) at %#x+%d out of range (file is %#x bytes)", i, tag, soff, size, len(b))
		}
		data := b[soff : soff+size]
		switch tag {
		case extTagGenerator:
			c.Generator = string(data)
		case extTagGlibcHWCaps:
			// The loader ignores a malformed hwcaps section; so do we, and
			// any entry that refers to it is then reported as corrupt.
			hwcaps = nil
			if size == 0 || soff%4 != 0 || size%4 != 0 {
				continue
			}
			hwcaps = make([]string, 0, size/4)
			for j := uint64(0); j < size; j += 4 {
				// ldconfig writes these as offsets from the new-format
				// header, like every other string reference. (glibc's own
				// readers add them to the file start; both agree except in
				// compat files, where glibc's reading is a known mismatch.)
				name, err := cstring(h, str, le.Uint32(data[j:]), int(j/4), "glibc-hwcaps name")
				if err != nil {
					return nil, err
				}
				if len(name) > maxNameLen {
					return nil, corrupt("glibc-hwcaps name %d is longer than %d bytes", j/4, maxNameLen)
				}
				hwcaps = append(hwcaps, name)
			}
		}
	}
	return hwcaps, nil
}

// Bounds on string lengths. The kernel refuses longer paths (PATH_MAX) and
// file names (NAME_MAX); a SONAME the loader looks up in the cache is a file
// name, as is a glibc-hwcaps subdirectory. No real cache exceeds them, and
// capping them keeps hostile files from making scans and sorts quadratic.
const (
	maxStringLen = 4096
	maxNameLen   = 255
)

// cstring returns the NUL-terminated string at tab[off:], as a substring of
// str (the same bytes as tab) so that entries share one copy.
func cstring(tab []byte, str string, off uint32, idx int, what string) (string, error) {
	if uint64(off) >= uint64(len(tab)) {
		return "", corrupt("entry %d: %s string offset %#x out of range (%#x bytes)", idx, what, off, len(tab))
	}
	s := tab[off:]
	n := bytes.IndexByte(s[:min(len(s), maxStringLen+1)], 0)
	if n < 0 {
		if len(s) > maxStringLen {
			return "", corrupt("entry %d: %s string at %#x is longer than %d bytes", idx, what, off, maxStringLen)
		}
		return "", corrupt("entry %d: %s string at %#x is not NUL-terminated", idx, what, off)
	}
	return str[off : int(off)+n], nil
}

// MaxFileSize bounds what Open reads (and what readers of a container's
// cache should read): cache offsets are 32-bit, and real caches are tens to
// hundreds of kilobytes, so anything near this is hostile.
const MaxFileSize = 16 << 20

// MaxEntries bounds the entries Parse accepts. A distribution with every
// library package installed lists some ten thousand; a cache claiming
// millions (which cost over a gigabyte to decode) is refused as corrupt.
const MaxEntries = 1 << 16

// Open reads and parses the file at path. It refuses anything but a regular
// file (a FIFO planted in an image must not hang the caller). Open does not
// confine path to a root filesystem; callers reading a container's cache
// resolve the path inside the root first.
func Open(path string) (*Cache, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("opening loader cache: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading loader cache %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("loader cache %s is a %s, not a regular file: %w", path, st.Mode().Type(), ErrCorrupt)
	}
	// One read of the size the file has (io.ReadAll would grow its buffer
	// from 512 bytes, a dozen copies for a real cache); a file that grows
	// meanwhile is still read to its end, up to the limit.
	buf := make([]byte, 0, min(st.Size(), MaxFileSize)+1)
	b, err := readAllInto(buf, io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading loader cache %s: %w", path, err)
	}
	if len(b) > MaxFileSize {
		return nil, fmt.Errorf("loader cache %s is larger than %d bytes: %w", path, MaxFileSize, ErrCorrupt)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s (regenerate it with ldconfig): %w", path, err)
	}
	return c, nil
}

// readAllInto is io.ReadAll appending to b.
func readAllInto(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// UnmarshalBinary replaces c with the cache parsed from b.
func (c *Cache) UnmarshalBinary(b []byte) error {
	p, err := Parse(b)
	if err != nil {
		return err
	}
	*c = *p
	return nil
}

// Lookup returns the paths of the 64-bit x86-64 entries (flags exactly
// FlagsX8664, the only ones the x86-64 loader uses) whose Name is name, in
// cache order. glibc-hwcaps variants, when present, come first, as they do
// in the loader's search.
func (c *Cache) Lookup(name string) []string {
	return c.LookupFlags(name, FlagsX8664)
}

// LookupFlags is Lookup for another ABI: it returns the paths of the entries
// whose Name is name and whose Flags equal flags (e.g. FlagsAArch64).
func (c *Cache) LookupFlags(name string, flags int32) []string {
	var paths []string
	for _, e := range c.Entries {
		if e.Name == name && e.Flags == flags {
			paths = append(paths, e.Path)
		}
	}
	return paths
}

// Libraries iterates over all entries in cache order. Filter with
// Entry.Is64Bit, Is32Bit, IsHWCaps or Flags.
func (c *Cache) Libraries() iter.Seq[Entry] {
	return func(yield func(Entry) bool) {
		for _, e := range c.Entries {
			if !yield(e) {
				return
			}
		}
	}
}

// legacyHWCapBits is the number of bits set in a legacy (non-glibc-hwcaps)
// hwcap word; ldconfig prefers entries with more capabilities.
func legacyHWCapBits(e Entry) int {
	if e.IsHWCaps() {
		return 0
	}
	return bits.OnesCount64(e.HWCap)
}
