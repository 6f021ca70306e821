package containerhook

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	noteLibOnce sync.Once
	noteLibData []byte
	noteLibErr  error
)

// noteLib returns a gcc-built shared object carrying libcuda's
// .note.cuda.fwd_compatibility, as TestNVCompatNote builds it.
func noteLib(tb testing.TB) []byte {
	tb.Helper()
	noteLibOnce.Do(func() {
		desc := `{"Format":1,"CUDA Version":"13.0","Driver":[535,550,570],"Device":[]}`
		src := fmt.Sprintf(`struct note { unsigned namesz, descsz, type; char name[20]; char desc[%d]; };
__attribute__((section(".note.cuda.fwd_compatibility"), used, aligned(4)))
static const struct note n = { 19, %d, 1, "NVIDIA Corporation", %q };
int cuDriverGetVersion(int *v) { *v = 1; return 0; }
`, (len(desc)+4)&^3, len(desc), desc)
		dir, err := os.MkdirTemp("", "compatnote-")
		if err != nil {
			noteLibErr = err
			return
		}
		defer os.RemoveAll(dir)
		c, lib := filepath.Join(dir, "note.c"), filepath.Join(dir, "lib.so")
		if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
			noteLibErr = err
			return
		}
		if out, err := exec.Command("gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", lib, c).CombinedOutput(); err != nil {
			noteLibErr = fmt.Errorf("gcc: %v\n%s", err, out)
			return
		}
		noteLibData, noteLibErr = os.ReadFile(lib)
	})
	if noteLibErr != nil {
		tb.Skipf("skipping: no gcc-built library: %v", noteLibErr)
	}
	return bytes.Clone(noteLibData)
}

// sectionHeader returns the file offset of the header of the section named
// name in the (trusted, test-built) ELF object b, and of the section name
// table's header.
func sectionHeader(tb testing.TB, b []byte, name string) (hdr, strtabHdr int64) {
	tb.Helper()
	ef, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		tb.Fatal(err)
	}
	if ef.Class != elf.ELFCLASS64 || ef.ByteOrder != binary.LittleEndian {
		tb.Skip("skipping: the patches below are for little-endian 64-bit objects")
	}
	shoff := int64(binary.LittleEndian.Uint64(b[0x28:]))
	shstrndx := int64(binary.LittleEndian.Uint16(b[0x3e:]))
	hdr = -1
	for i, s := range ef.Sections {
		if s.Name == name {
			hdr = shoff + int64(i)*64
		}
	}
	if hdr < 0 {
		tb.Fatalf("no section %s in the test library", name)
	}
	return hdr, shoff + shstrndx*64
}

// zstdBomb is a zstd frame that expands to n*128 KiB of zeros from 4n+6
// bytes: n RLE blocks of the largest size.
func zstdBomb(n int) []byte {
	b := []byte{0x28, 0xb5, 0x2f, 0xfd, // magic
		0x00,   // frame header: no content size, no checksum, windowed
		7 << 3} // window descriptor: 2^(10+7) = 128 KiB
	for i := 0; i < n; i++ {
		h := uint32(128<<10)<<3 | 1<<1 // RLE block of 128 KiB
		if i == n-1 {
			h |= 1 // last block
		}
		b = append(b, byte(h), byte(h>>8), byte(h>>16), 0)
	}
	return b
}

// hostileCompatLib is the attack of issue 27: a 33 KB libcuda whose section
// name table is SHF_COMPRESSED, a zstd stream of about a gigabyte, which
// debug/elf's NewFile expands before anything else.
func hostileCompatLib(tb testing.TB) []byte {
	tb.Helper()
	b := noteLib(tb)
	_, strtab := sectionHeader(tb, b, compatNoteSection)
	const blocks = 8000
	payload := make([]byte, 24) // Elf64_Chdr
	binary.LittleEndian.PutUint32(payload[0:], uint32(elf.COMPRESS_ZSTD))
	binary.LittleEndian.PutUint64(payload[8:], blocks*128<<10)
	binary.LittleEndian.PutUint64(payload[16:], 1)
	payload = append(payload, zstdBomb(blocks)...)
	off := len(b)
	b = append(b, payload...)
	flags := binary.LittleEndian.Uint64(b[strtab+8:])
	binary.LittleEndian.PutUint64(b[strtab+8:], flags|uint64(elf.SHF_COMPRESSED))
	binary.LittleEndian.PutUint64(b[strtab+24:], uint64(off))
	binary.LittleEndian.PutUint64(b[strtab+32:], uint64(len(payload)))
	return b
}

// countingReader counts the bytes asked of it.
type countingReader struct {
	r io.ReaderAt
	n int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.n += int64(len(p))
	return c.r.ReadAt(p, off)
}

// parseCounted runs parseCompatNote on b as readCompatNote does (under the
// read budget) and returns how many bytes it read.
func parseCounted(b []byte) (*compatNote, int64, error) {
	c := &countingReader{r: bytes.NewReader(b)}
	n, err := parseCompatNote(&budgetReader{r: c, left: maxCompatRead}, int64(len(b)))
	return n, c.n, err
}

// The note is read from the gcc-built library; each hostile header is
// refused with a reason, reading little of the file and expanding nothing.
func TestCompatNoteBounded(t *testing.T) {
	good := noteLib(t)
	note, _, err := parseCounted(good)
	if err != nil || note == nil || note.CUDAVersion != "13.0" {
		t.Fatalf("the gcc-built note: %+v, %v", note, err)
	}
	hdr, strtab := sectionHeader(t, good, compatNoteSection)
	// Each patch is made on a copy.
	put64 := func(b []byte, off int64, v uint64) []byte {
		b = bytes.Clone(b)
		binary.LittleEndian.PutUint64(b[off:], v)
		return b
	}
	put16 := func(b []byte, off int64, v uint16) []byte {
		b = bytes.Clone(b)
		binary.LittleEndian.PutUint16(b[off:], v)
		return b
	}
	size := uint64(len(good))
	for _, tc := range []struct {
		name string
		b    []byte
		want string // in the error; "" for no note and no error
	}{
		{"compressed name table (the attack)", hostileCompatLib(t), "section name table is compressed"},
		{"compressed note", put64(good, hdr+8, binary.LittleEndian.Uint64(good[hdr+8:])|uint64(elf.SHF_COMPRESSED)), "is compressed"},
		{"note beyond the file", put64(good, hdr+24, size-8), "beyond the file"},
		{"note offset wraps", put64(put64(good, hdr+24, 1<<63), hdr+32, 1<<63+16), "over"},
		{"huge note", put64(good, hdr+32, 1<<40), "over 65536"},
		{"huge name table", put64(good, strtab+32, 1<<40), "over 65536"},
		{"name table beyond the file", put64(good, strtab+24, size), "beyond the file"},
		{"section table beyond the file", put64(good, 0x28, size-64), "beyond the file"},
		{"too many sections", put16(good, 0x3c, 60000), "bad section header table"},
		{"short section headers", put16(good, 0x3a, 16), "bad section header table"},
		{"name table index out of range", put16(good, 0x3e, 60000), ""},
		{"no section headers", put64(good, 0x28, 0), ""},
		{"not ELF", []byte("#!/bin/sh\n"), "not an ELF file"},
		{"truncated", good[:40], "not an ELF file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			note, n, err := parseCounted(tc.b)
			if n > maxCompatRead {
				t.Errorf("read %d bytes, over %d", n, maxCompatRead)
			}
			if tc.want == "" {
				if err != nil || note != nil {
					t.Errorf("got %+v, %v; want no note and no error", note, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %+v, %v; want an error with %q", note, err, tc.want)
			}
		})
	}
	// The attack reads the headers and nothing of the stream.
	if _, n, _ := parseCounted(hostileCompatLib(t)); n > 8<<10 {
		t.Errorf("the hostile library cost %d bytes of reads, want a few KiB", n)
	}
}

// A file at every per-part limit (1024 section headers of 256 bytes, a
// 64 KiB name table, a 64 KiB note) is read whole within maxCompatRead: the
// budget counts the 16 identification bytes read before the header.
func TestCompatNoteAtEveryLimit(t *testing.T) {
	const shnum, shent = maxCompatSections, maxCompatShentsize
	le := binary.LittleEndian
	strtabOff := int64(64)
	strtab := make([]byte, maxCompatStrtab)
	copy(strtab[1:], compatNoteSection+"\x00")
	copy(strtab[1+len(compatNoteSection)+1:], ".shstrtab\x00")
	noteOff := strtabOff + int64(len(strtab))
	desc := `{"CUDA Version":"13.0","Driver":[535]}`
	note := make([]byte, maxCompatNote)
	le.PutUint32(note[0:], 19)
	le.PutUint32(note[4:], uint32(len(desc)))
	le.PutUint32(note[8:], 1)
	copy(note[12:], "NVIDIA Corporation\x00")
	copy(note[32:], desc)
	shoff := noteOff + int64(len(note))
	buf := make([]byte, shoff+shnum*shent)
	copy(buf, elf.ELFMAG)
	buf[elf.EI_CLASS], buf[elf.EI_DATA], buf[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	le.PutUint64(buf[0x28:], uint64(shoff))
	le.PutUint16(buf[0x3a:], shent)
	le.PutUint16(buf[0x3c:], shnum)
	le.PutUint16(buf[0x3e:], 2)
	copy(buf[strtabOff:], strtab)
	copy(buf[noteOff:], note)
	sh := func(i int, name uint32, typ elf.SectionType, off, size uint64) {
		b := buf[shoff+int64(i*shent):]
		le.PutUint32(b[0:], name)
		le.PutUint32(b[4:], uint32(typ))
		le.PutUint64(b[24:], off)
		le.PutUint64(b[32:], size)
	}
	sh(1, 1, elf.SHT_NOTE, uint64(noteOff), uint64(len(note)))
	sh(2, uint32(1+len(compatNoteSection)+1), elf.SHT_STRTAB, uint64(strtabOff), uint64(len(strtab)))
	n, read, err := parseCounted(buf)
	if err != nil || n == nil || n.CUDAVersion != "13.0" {
		t.Fatalf("a file within every limit: %+v, %v; want the note", n, err)
	}
	if read != maxCompatRead {
		t.Errorf("read %d bytes; the budget is %d (the limits add up to it exactly)", read, maxCompatRead)
	}
}

// The attack end to end: the hook binary under NVIDIA's name runs
// enable-cuda-compat on an image whose compat libcuda is hostileCompatLib,
// with its data limited to 256 MiB (RLIMIT_DATA: a Go program reserves more
// address space than that at start, so RLIMIT_AS cannot be used; debug/elf
// needed 4 GB and 47 s). It must finish, decide by the version numbers, and
// warn.
func TestNVEnableCUDACompatHostileELF(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("skipping: no prlimit (util-linux)")
	}
	lib := hostileCompatLib(t)
	dir := basicRoot(t)
	mkdirs(t, dir, CompatDir)
	if err := os.WriteFile(filepath.Join(dir, CompatDir, "libcuda.so.580.95.05"), lib, 0o755); err != nil {
		t.Fatal(err)
	}
	hook := buildHook(t)
	nv := filepath.Join(t.TempDir(), "nvidia-cdi-hook")
	if err := os.Symlink(hook, nv); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, prlimit, "--data=268435456", "--", nv, "enable-cuda-compat", "--host-driver-version", "570.124.06")
	cmd.Stdin = bytes.NewReader(bundle(t, dir))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("enable-cuda-compat on the hostile library: %v\n%.2000s", err, stderr.String())
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && ru.Maxrss > 128<<10 {
		t.Errorf("the hook's peak RSS was %d KiB, want well under 128 MiB", ru.Maxrss)
	}
	if !strings.Contains(stderr.String(), "compressed; not expanded") {
		t.Errorf("no warning naming the compressed section:\n%s", stderr.String())
	}
	confs, _ := filepath.Glob(filepath.Join(dir, "etc/ld.so.conf.d", CompatConfPrefix+"*.conf"))
	if len(confs) != 1 {
		t.Errorf("compat conf files %v; want one (580 is newer than the host's 570)", confs)
	}
}

// parseCompatNote on any input: no panic, no read beyond the budget, and
// nothing read outside the file.
func FuzzCompatNote(f *testing.F) {
	good := noteLib(f)
	f.Add(good)
	f.Add(hostileCompatLib(f))
	f.Add(good[:64])
	f.Add([]byte("\x7fELF\x01\x01\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c := &countingReader{r: bytes.NewReader(b)}
		note, err := parseCompatNote(&budgetReader{r: c, left: maxCompatRead}, int64(len(b)))
		// The identification and header, then the table, the name
		// table and the note, each within the file.
		if c.n > maxCompatRead || c.n > int64(elf.EI_NIDENT)+64+3*int64(len(b)) {
			t.Fatalf("read %d bytes of a %d-byte file", c.n, len(b))
		}
		if note != nil && err != nil {
			t.Fatalf("both a note and an error: %v", err)
		}
	})
}
