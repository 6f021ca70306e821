package ldcache

import (
	"runtime"
	"strings"
)

// charIsSigned says whether C's plain char is signed on this platform's
// ABI. glibc's name comparison subtracts chars, so names with bytes >= 0x80
// sort differently on x86 (signed) and Arm (unsigned); the cache we write must
// match the loader it is written for, which is this machine's.
var charIsSigned = map[string]bool{
	"386": true, "amd64": true, "loong64": true, "sparc64": true,
	"mips": true, "mipsle": true, "mips64": true, "mips64le": true,
}[runtime.GOARCH]

// Compare orders two library names the way glibc's loader does
// (_dl_cache_libcmp): runs of decimal digits compare as numbers, so
// "libfoo.so.9" < "libfoo.so.10"; a digit sorts after any non-digit; other
// bytes compare as C chars of this platform. It returns a negative number,
// zero or a positive number. A NUL byte ends a name, as in C.
//
// The loader binary-searches cache entries sorted in descending Compare
// order; MarshalBinary writes them that way.
func Compare(a, b string) int {
	return libcmp(a, b, charIsSigned)
}

// libcmp is Compare with the char signedness explicit, so that tests can pin
// both conventions. Digit runs accumulate in 32-bit ints that wrap, as the C
// code does in practice on every glibc target, so that absurdly long numbers
// still sort the way the loader will search them.
func libcmp(a, b string, signedChar bool) int {
	if i := strings.IndexByte(a, 0); i >= 0 {
		a = a[:i]
	}
	if i := strings.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	// Skip the common prefix, backing up to the start of a digit run it
	// ends in: up to there the C loop would walk both names in lockstep.
	// This keeps the byte loop below short for names that differ late.
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	for i > 0 && isDigit(a[i-1]) {
		i--
	}
	j := i

	for i < len(a) {
		switch {
		case isDigit(a[i]):
			if j >= len(b) || !isDigit(b[j]) {
				return 1
			}
			var va, vb int32
			for ; i < len(a) && isDigit(a[i]); i++ {
				va = va*10 + int32(a[i]-'0')
			}
			for ; j < len(b) && isDigit(b[j]); j++ {
				vb = vb*10 + int32(b[j]-'0')
			}
			if va != vb {
				return int(va - vb)
			}
		case j < len(b) && isDigit(b[j]):
			return -1
		case j >= len(b) || a[i] != b[j]:
			return int(char(a, i, signedChar) - char(b, j, signedChar))
		default:
			i++
			j++
		}
	}
	return int(-char(b, j, signedChar))
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// char returns s[i] as a C char (0 past the end, like the terminating NUL).
func char(s string, i int, signed bool) int32 {
	if i >= len(s) {
		return 0
	}
	if signed {
		return int32(int8(s[i]))
	}
	return int32(s[i])
}
