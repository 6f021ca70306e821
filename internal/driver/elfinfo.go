package driver

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// elfInfo is what Discover needs to know about a shared object: its word
// size and machine (to tell compat32 libraries from native ones) and its
// SONAME (the name the container's loader asks for).
type elfInfo struct {
	Class   elf.Class
	Machine elf.Machine
	SONAME  string
}

// errNotELF is returned for files that are not ELF objects.
var errNotELF = errors.New("not an ELF file")

// Limits that keep a hostile or corrupt file from making us read much.
const (
	maxProgHeaders    = 256
	maxProgHeaderSize = 1024 // 56 in every 64-bit object, 32 in 32-bit ones
	maxDynamicSize    = 64 << 10
	maxSONAMELen      = 256
)

// readELFFile reads the ELF facts of the file at path.
func readELFFile(path string) (elfInfo, error) {
	f, err := openRaw(path)
	if err != nil {
		return elfInfo{}, err
	}
	defer f.Close()
	return readELF(f)
}

// rawFile is a file opened for a few positioned reads with plain system
// calls: open, pread, close. An os.File also registers with the poller and
// sets a finalizer, three more calls for each of the dozens of files a
// discovery reads.
type rawFile struct {
	fd   int
	path string
}

func openRaw(path string) (*rawFile, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: path, Err: err}
		}
		return &rawFile{fd: fd, path: path}, nil
	}
}

// ReadAt is io.ReaderAt's: n < len(p) comes with an error (io.EOF at the
// end of the file).
func (f *rawFile) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		m, err := unix.Pread(f.fd, p[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, &os.PathError{Op: "read", Path: f.path, Err: err}
		}
		if m == 0 {
			return n, io.EOF
		}
		n += m
	}
	return n, nil
}

func (f *rawFile) Close() error { return unix.Close(f.fd) }

// readELF reads the ELF header, the program headers and the dynamic
// segment, and looks DT_SONAME up in the dynamic string table. It reads a few
// hundred bytes where debug/elf would read every section header and the whole
// string table: libcuda alone is ~100 MB, and Discover opens ~70 libraries.
func readELF(ra io.ReaderAt) (elfInfo, error) {
	r := newHeadReader(ra)
	defer r.release()
	var ident [elf.EI_NIDENT]byte
	if _, err := r.ReadAt(ident[:], 0); err != nil {
		return elfInfo{}, errNotELF
	}
	if !bytes.Equal(ident[:4], []byte(elf.ELFMAG)) {
		return elfInfo{}, errNotELF
	}
	var bo binary.ByteOrder
	switch elf.Data(ident[elf.EI_DATA]) {
	case elf.ELFDATA2LSB:
		bo = binary.LittleEndian
	case elf.ELFDATA2MSB:
		bo = binary.BigEndian
	default:
		return elfInfo{}, fmt.Errorf("%w: bad data encoding", errNotELF)
	}
	info := elfInfo{Class: elf.Class(ident[elf.EI_CLASS])}

	var phoff uint64
	var phentsize, phnum int
	switch info.Class {
	case elf.ELFCLASS64:
		var h elf.Header64
		if err := binary.Read(io.NewSectionReader(r, 0, int64(binary.Size(h))), bo, &h); err != nil {
			return elfInfo{}, fmt.Errorf("%w: short header", errNotELF)
		}
		info.Machine = elf.Machine(h.Machine)
		phoff, phentsize, phnum = h.Phoff, int(h.Phentsize), int(h.Phnum)
		if phentsize < binary.Size(elf.Prog64{}) {
			return info, fmt.Errorf("bad program header size %d", phentsize)
		}
	case elf.ELFCLASS32:
		var h elf.Header32
		if err := binary.Read(io.NewSectionReader(r, 0, int64(binary.Size(h))), bo, &h); err != nil {
			return elfInfo{}, fmt.Errorf("%w: short header", errNotELF)
		}
		info.Machine = elf.Machine(h.Machine)
		phoff, phentsize, phnum = uint64(h.Phoff), int(h.Phentsize), int(h.Phnum)
		if phentsize < binary.Size(elf.Prog32{}) {
			return info, fmt.Errorf("bad program header size %d", phentsize)
		}
	default:
		return elfInfo{}, fmt.Errorf("%w: bad class", errNotELF)
	}
	if phentsize > maxProgHeaderSize {
		return info, fmt.Errorf("bad program header size %d", phentsize)
	}
	if phnum > maxProgHeaders || phoff > 1<<40 {
		return info, fmt.Errorf("bad program header table (%d entries at %d)", phnum, phoff)
	}

	// Collect PT_LOAD (to map addresses to file offsets) and PT_DYNAMIC.
	type seg struct{ off, vaddr, filesz uint64 }
	var loads []seg
	var dyn *seg
	// The table in one read (it is within the head for any real object).
	table := make([]byte, phnum*phentsize)
	if _, err := r.ReadAt(table, int64(phoff)); err != nil {
		return info, fmt.Errorf("reading the %d program headers at %d: %w", phnum, phoff, err)
	}
	for i := 0; i < phnum; i++ {
		buf := table[i*phentsize : (i+1)*phentsize]
		var s seg
		var typ elf.ProgType
		if info.Class == elf.ELFCLASS64 {
			typ = elf.ProgType(bo.Uint32(buf[0:]))
			s = seg{off: bo.Uint64(buf[8:]), vaddr: bo.Uint64(buf[16:]), filesz: bo.Uint64(buf[32:])}
		} else {
			typ = elf.ProgType(bo.Uint32(buf[0:]))
			s = seg{off: uint64(bo.Uint32(buf[4:])), vaddr: uint64(bo.Uint32(buf[8:])), filesz: uint64(bo.Uint32(buf[16:]))}
		}
		switch typ {
		case elf.PT_LOAD:
			loads = append(loads, s)
		case elf.PT_DYNAMIC:
			dyn = &s
		}
	}
	if dyn == nil {
		return info, nil // a static object: no SONAME
	}
	if dyn.filesz > maxDynamicSize || dyn.off > 1<<40 {
		return info, fmt.Errorf("dynamic segment too large (%d bytes)", dyn.filesz)
	}
	d := make([]byte, dyn.filesz)
	if _, err := r.ReadAt(d, int64(dyn.off)); err != nil {
		return info, fmt.Errorf("reading dynamic segment: %w", err)
	}
	entSize := 16
	if info.Class == elf.ELFCLASS32 {
		entSize = 8
	}
	var strtab, soname uint64
	haveStrtab, haveSoname := false, false
	for o := 0; o+entSize <= len(d); o += entSize {
		var tag, val uint64
		if entSize == 16 {
			tag, val = bo.Uint64(d[o:]), bo.Uint64(d[o+8:])
		} else {
			tag, val = uint64(bo.Uint32(d[o:])), uint64(bo.Uint32(d[o+4:]))
		}
		switch elf.DynTag(tag) {
		case elf.DT_NULL:
			o = len(d)
		case elf.DT_STRTAB:
			strtab, haveStrtab = val, true
		case elf.DT_SONAME:
			soname, haveSoname = val, true
		}
	}
	if !haveSoname {
		return info, nil
	}
	if !haveStrtab {
		return info, errors.New("DT_SONAME without DT_STRTAB")
	}
	// DT_STRTAB holds an address; find the loaded segment that covers it.
	addr := strtab + soname
	for _, l := range loads {
		if addr < l.vaddr || addr-l.vaddr >= l.filesz {
			continue
		}
		off := l.off + (addr - l.vaddr)
		if off > 1<<40 {
			break
		}
		name := make([]byte, maxSONAMELen)
		n, err := r.ReadAt(name, int64(off))
		if n == 0 && err != nil {
			return info, fmt.Errorf("reading SONAME: %w", err)
		}
		name = name[:n]
		end := bytes.IndexByte(name, 0)
		if end < 0 {
			return info, errors.New("SONAME not terminated")
		}
		info.SONAME = string(name[:end])
		return info, nil
	}
	return info, fmt.Errorf("SONAME address %#x outside the loaded segments", addr)
}

// headSize is how much of a file readELF reads at once from its start: the
// ELF header and the program headers are there in every object a linker
// wrote, and often the dynamic segment and the SONAME too.
const headSize = 4096

// headReader serves reads within the first headSize bytes of a file from
// one read, and the others from the file: readELF then costs one to three
// reads per object instead of one per header.
type headReader struct {
	r    io.ReaderAt
	head []byte
	eof  bool // the file ends within head
}

// heads recycles headReader buffers: a discovery reads dozens of files, and
// fresh memory costs a fresh process page faults.
var heads = sync.Pool{New: func() any { return new([headSize]byte) }}

func newHeadReader(r io.ReaderAt) *headReader {
	h := &headReader{r: r, head: heads.Get().(*[headSize]byte)[:]}
	n, err := r.ReadAt(h.head, 0)
	h.head = h.head[:n]
	h.eof = n < headSize && err != nil
	return h
}

// release returns the buffer; h must not be used afterwards.
func (h *headReader) release() {
	heads.Put((*[headSize]byte)(h.head[:headSize]))
	h.head = nil
}

func (h *headReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > int64(len(h.head)) || (!h.eof && off+int64(len(p)) > int64(len(h.head))) {
		return h.r.ReadAt(p, off)
	}
	n := copy(p, h.head[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// ReadELF returns the word size, machine and DT_SONAME of the ELF shared
// object read through r, reading only the headers and the dynamic segment.
// Hooks use it on libraries inside a container's root filesystem.
func ReadELF(r io.ReaderAt) (class elf.Class, machine elf.Machine, soname string, err error) {
	info, err := readELF(r)
	if err != nil {
		return 0, 0, "", err
	}
	return info.Class, info.Machine, info.SONAME, nil
}
