package containerhook

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// The compat libcuda is the image's: a hostile file. debug/elf reads every
// section header and decompresses the section name table when it is
// SHF_COMPRESSED, so a 33 KB library whose name table is a zstd stream of a
// few gigabytes once cost the hook 4 GB and most of a minute. The note is
// found here by reading only the ELF header, the section header table, the
// name table and the note itself, each checked against the file's size and a
// limit below, and nothing compressed is ever expanded.
const (
	compatNoteSection = ".note.cuda.fwd_compatibility"
	// maxCompatSections bounds the section header table: a real libcuda has
	// about 30 sections, a library with debug information about 40.
	maxCompatSections = 1024
	// maxCompatShentsize bounds one section header (64 bytes in every
	// 64-bit object, 40 in 32-bit ones).
	maxCompatShentsize = 256
	// maxCompatStrtab bounds the section name table (a few hundred bytes).
	maxCompatStrtab = 64 << 10
	// maxCompatNote bounds the note (its JSON is some 100 bytes).
	maxCompatNote = 64 << 10
	// maxCompatRead is the most readCompatNote reads of a file in all: the
	// identification bytes (read first, to learn the class and byte order),
	// the header (64 bytes in a 64-bit file, 52 in a 32-bit one), and the
	// largest table, name table and note allowed above.
	maxCompatRead = elf.EI_NIDENT + 64 + maxCompatSections*maxCompatShentsize + maxCompatStrtab + maxCompatNote
)

// errCompatRead is returned when the reads would exceed maxCompatRead (not
// reached by a file that passes the checks; a second line of defence).
var errCompatRead = errors.New("read budget exhausted")

// compatNote is the JSON description of libcuda's .note.cuda.fwd_compatibility.
type compatNote struct {
	CUDAVersion string `json:"CUDA Version"`
	Driver      []int  `json:"Driver"`
}

// readCompatNote reads the fwd_compatibility note of the library at lib, or
// nil when it has none.
func readCompatNote(root *rootfs.Root, lib string) (*compatNote, error) {
	f, err := root.OpenFile(lib)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return parseCompatNote(&budgetReader{r: f, left: maxCompatRead}, fi.Size())
}

// budgetReader is an io.ReaderAt that serves at most left bytes in all.
type budgetReader struct {
	r    io.ReaderAt
	left int64
}

func (b *budgetReader) ReadAt(p []byte, off int64) (int, error) {
	if int64(len(p)) > b.left {
		return 0, errCompatRead
	}
	b.left -= int64(len(p))
	return b.r.ReadAt(p, off)
}

// section is what parseCompatNote uses of a section header.
type section struct {
	name         uint32
	typ          elf.SectionType
	flags        elf.SectionFlag
	offset, size uint64
}

// parseCompatNote finds the note in the ELF file of size bytes read through
// r (see the limits above). A file that is not ELF, or whose headers do not
// fit in the file or the limits, is an error naming what is wrong; a file
// without the note, or with one of another vendor, is nil.
func parseCompatNote(r io.ReaderAt, size int64) (*compatNote, error) {
	var ident [elf.EI_NIDENT]byte
	if _, err := r.ReadAt(ident[:], 0); err != nil || !bytes.HasPrefix(ident[:], []byte(elf.ELFMAG)) {
		return nil, errors.New("not an ELF file")
	}
	var bo binary.ByteOrder
	switch elf.Data(ident[elf.EI_DATA]) {
	case elf.ELFDATA2LSB:
		bo = binary.LittleEndian
	case elf.ELFDATA2MSB:
		bo = binary.BigEndian
	default:
		return nil, errors.New("not an ELF file: bad data encoding")
	}
	class := elf.Class(ident[elf.EI_CLASS])
	var shoff uint64
	var shentsize, shnum, shstrndx, want int
	switch class {
	case elf.ELFCLASS64:
		var h elf.Header64
		if err := binary.Read(io.NewSectionReader(r, 0, int64(binary.Size(h))), bo, &h); err != nil {
			return nil, errors.New("not an ELF file: short header")
		}
		shoff, shentsize, shnum, shstrndx = h.Shoff, int(h.Shentsize), int(h.Shnum), int(h.Shstrndx)
		want = binary.Size(elf.Section64{})
	case elf.ELFCLASS32:
		var h elf.Header32
		if err := binary.Read(io.NewSectionReader(r, 0, int64(binary.Size(h))), bo, &h); err != nil {
			return nil, errors.New("not an ELF file: short header")
		}
		shoff, shentsize, shnum, shstrndx = uint64(h.Shoff), int(h.Shentsize), int(h.Shnum), int(h.Shstrndx)
		want = binary.Size(elf.Section32{})
	default:
		return nil, errors.New("not an ELF file: bad class")
	}
	if shoff == 0 || shnum == 0 {
		// No section headers (or extended numbering, which no library
		// of NVIDIA's needs): no note to find by name.
		return nil, nil
	}
	if shentsize < want || shentsize > maxCompatShentsize || shnum > maxCompatSections {
		return nil, fmt.Errorf("bad section header table (%d entries of %d bytes)", shnum, shentsize)
	}
	tableSize := uint64(shnum * shentsize)
	if !within(shoff, tableSize, size) {
		return nil, fmt.Errorf("section header table (%d bytes at %d) beyond the file's %d bytes", tableSize, shoff, size)
	}
	if shstrndx == int(elf.SHN_UNDEF) || shstrndx >= shnum {
		return nil, nil
	}
	table := make([]byte, tableSize)
	if _, err := r.ReadAt(table, int64(shoff)); err != nil {
		return nil, fmt.Errorf("reading the section header table: %w", err)
	}
	sec := func(i int) section {
		b := table[i*shentsize:]
		if class == elf.ELFCLASS64 {
			return section{name: bo.Uint32(b[0:]), typ: elf.SectionType(bo.Uint32(b[4:])),
				flags: elf.SectionFlag(bo.Uint64(b[8:])), offset: bo.Uint64(b[24:]), size: bo.Uint64(b[32:])}
		}
		return section{name: bo.Uint32(b[0:]), typ: elf.SectionType(bo.Uint32(b[4:])),
			flags: elf.SectionFlag(bo.Uint32(b[8:])), offset: uint64(bo.Uint32(b[16:])), size: uint64(bo.Uint32(b[20:]))}
	}
	names := sec(shstrndx)
	if names.typ != elf.SHT_STRTAB {
		return nil, fmt.Errorf("section name table is of type %v, not SHT_STRTAB", names.typ)
	}
	strtab, err := readSection(r, names, "section name table", maxCompatStrtab, size)
	if err != nil {
		return nil, err
	}
	for i := 1; i < shnum; i++ {
		s := sec(i)
		if !sectionNamed(strtab, s.name, compatNoteSection) {
			continue
		}
		if s.typ != elf.SHT_NOTE {
			return nil, nil
		}
		data, err := readSection(r, s, compatNoteSection, maxCompatNote, size)
		if err != nil {
			return nil, err
		}
		return decodeCompatNote(data, bo)
	}
	return nil, nil
}

// readSection reads the section s, what, refusing a compressed one and one
// larger than max or than the file.
func readSection(r io.ReaderAt, s section, what string, max, fileSize int64) ([]byte, error) {
	if s.flags&elf.SHF_COMPRESSED != 0 {
		return nil, fmt.Errorf("its %s is compressed; not expanded", what)
	}
	if s.size > uint64(max) {
		return nil, fmt.Errorf("its %s is %d bytes, over %d", what, s.size, max)
	}
	if !within(s.offset, s.size, fileSize) {
		return nil, fmt.Errorf("its %s (%d bytes at %d) is beyond the file's %d bytes", what, s.size, s.offset, fileSize)
	}
	data := make([]byte, s.size)
	if _, err := r.ReadAt(data, int64(s.offset)); err != nil {
		return nil, fmt.Errorf("reading its %s: %w", what, err)
	}
	return data, nil
}

// within says whether n bytes at off lie inside a file of size bytes.
func within(off, n uint64, size int64) bool {
	return size >= 0 && off <= uint64(size) && n <= uint64(size)-off
}

// sectionNamed says whether the NUL-terminated string at off in strtab is name.
func sectionNamed(strtab []byte, off uint32, name string) bool {
	if uint64(off)+uint64(len(name)) >= uint64(len(strtab)) {
		return false
	}
	s := strtab[off:]
	return string(s[:len(name)]) == name && s[len(name)] == 0
}

// decodeCompatNote reads the note's name and JSON description.
func decodeCompatNote(data []byte, bo binary.ByteOrder) (*compatNote, error) {
	// An ELF note: name size, description size, type, then the name and
	// the description, each padded to 4 bytes.
	if len(data) < 12 {
		return nil, nil
	}
	namesz := bo.Uint32(data[0:4])
	descsz := bo.Uint32(data[4:8])
	if namesz == 0 || descsz == 0 {
		return nil, nil
	}
	nameEnd := 12 + uint64(namesz)
	descStart := 12 + (uint64(namesz)+3)&^3
	if nameEnd > uint64(len(data)) || descStart+uint64(descsz) > uint64(len(data)) {
		return nil, errors.New("truncated " + compatNoteSection)
	}
	if string(bytes.TrimRight(data[12:nameEnd], "\x00")) != "NVIDIA Corporation" {
		return nil, nil
	}
	var n compatNote
	desc := bytes.TrimRight(data[descStart:descStart+uint64(descsz)], "\x00")
	if err := json.Unmarshal(desc, &n); err != nil {
		return nil, fmt.Errorf("its %s is not JSON: %w", compatNoteSection, err)
	}
	return &n, nil
}
