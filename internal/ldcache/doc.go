// Package ldcache reads and writes the dynamic loader's cache,
// /etc/ld.so.cache, without running ldconfig.
//
// The cache maps a library's SONAME ("libcuda.so.1") to the file that
// provides it, per ABI. ldconfig writes it; glibc's loader maps it and
// binary-searches it for every library a program needs that has no path.
// Gantry reads it to find driver libraries on the host, and writes it to make
// libraries injected into a container visible to the container's loader.
//
// # Old format
//
// Used by libc5 and early glibc. All integers are in the machine's byte order
// (little-endian on every platform this package supports).
//
//	offset 0   "ld.so-1.7.0"  11 bytes of magic, then 1 byte of padding
//	offset 12  nlibs          uint32
//	offset 16  nlibs entries of 12 bytes: flags int32, key uint32, value uint32
//	then       the string table
//
// key (the SONAME) and value (the path) are offsets of NUL-terminated
// strings, counted from the end of the entry table.
//
// # New format
//
// Written by glibc 2.2 and later, on its own since glibc 2.32:
//
//	offset 0   "glibc-ld.so.cache" "1.1"  20 bytes of magic and version
//	offset 20  nlibs             uint32
//	offset 24  len_strings       uint32, size of the string table
//	offset 28  flags             uint8; low two bits: 0 unknown, 1 invalid,
//	                             2 little-endian, 3 big-endian
//	offset 32  extension_offset  uint32, file offset of the extension
//	                             directory, a multiple of 4 (0: none)
//	offset 48  nlibs entries of 24 bytes: flags int32, key uint32,
//	           value uint32, osversion uint32, hwcap uint64
//	then       the string table, then the extension data
//
// key and value count from the start of this header. ldconfig stores each
// string once and points a SONAME into the tail of its path where it can.
//
// The extension directory holds a magic number (0xeaa42174), a count, and
// that many 16-byte section descriptors (tag, flags, file offset, size).
// Tag 0 is the generator, the text naming the program that wrote the file;
// tag 1 lists the glibc-hwcaps subdirectory names ("x86-64-v3", ...) as an
// array of uint32 string offsets, sorted by name. An entry whose hwcap word
// has bit 62 set (its upper half, ignoring ten ISA-level bits, being exactly
// 0x40000000) is a library from such a subdirectory, and the low 32 bits of
// hwcap index that array. Entry keeps the name (HWCapsSubdir) instead of the
// index, so entries compare equal across files.
//
// # Compat format
//
// ldconfig -c compat (the default before glibc 2.32) writes an old-format
// file and hides a complete new-format cache in its string table: the new
// header starts at the first 8-byte boundary after the old entries, and the
// old keys point past it into the shared strings. New loaders use the new
// part, old ones never look there. Parse does the same and reports which
// layout it read in Cache.Format. (ldconfig writes the glibc-hwcaps name
// offsets relative to the new header, while glibc's readers add them to the
// file start; the two differ only in compat files, where glibc then sees
// empty names. Parse follows the writer.)
//
// # Flags and order
//
// The low byte of an entry's flags is the library type (3 is a glibc ELF
// library, 1 plain ELF), the next byte the ABI the library needs (0x03 in
// that byte is x86-64, 0x0a AArch64, 0 the platform's default 32-bit ABI
// such as i386). The x86-64 loader uses only entries whose flags are exactly
// 0x0303 (FlagsX8664).
//
// Entries are sorted by SONAME in descending order of glibc's own comparison
// (Compare: digit runs compare as numbers, so libfoo.so.10 sorts above
// libfoo.so.9); entries with equal names come highest flags first, with
// glibc-hwcaps entries before ordinary ones. The loader's binary search finds
// nothing in a cache sorted any other way, so MarshalBinary always sorts.
//
// # Safety
//
// Caches inside container images are hostile input. Parse bounds every
// count by the file's length and checks every offset before use; malformed
// input yields an error wrapping ErrCorrupt and never a panic. Open refuses
// non-regular files and anything over 16 MiB, but does not resolve paths
// inside a root filesystem: callers do that first.
package ldcache
