// Package hostguard keeps a package's tests off the host's Gantry state: a
// test that runs gantry, gantry-runtime or the hook with a configuration
// lacking runtime.cache-dir writes its driver inventory and tree caches into
// the default cache directory (/run/gantry), which on a machine with Gantry
// installed is the installed runtime's, and reads whatever is there.
//
// Run wraps m.Run in a TestMain and fails the package when a file in the
// default cache directory was created or rewritten during the tests and
// names a new path under one of the package's tests' temporary directories
// (t.TempDir paths are /tmp/TestName<random>/...) or its own fixture
// directories. The content test keeps other processes on the same host
// (another checkout's tests, an installed runtime) from failing this
// package.
package hostguard

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/config"
)

// maxRead bounds how much of one cache file is searched.
const maxRead = 64 << 20

var testFunc = regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\)`)

// Run runs the package's tests and returns the exit code for os.Exit:
// m.Run's, or 1 when the tests left files in the default cache directory.
// markers are extra strings (fixture directory name prefixes, as
// "/gantry-shim-test-") that mark a file as this package's.
func Run(m *testing.M, markers ...string) int {
	dir := config.Default().Runtime.CacheDir
	before := snapshot(dir)
	code := m.Run()
	if leaked := Leaks(dir, before, append(testMarkers(), markers...)); len(leaked) > 0 {
		for _, l := range leaked {
			fmt.Fprintf(os.Stderr, "hostguard: %s\n", l)
		}
		fmt.Fprintf(os.Stderr, "hostguard: FAIL: the tests wrote into the host's default Gantry cache directory %s: give each gantry, gantry-runtime or hook a configuration (GANTRY_CONFIG) with runtime.cache-dir in its temporary directory\n", dir)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// file is one file of the cache directory as snapshot saw it.
type file struct {
	mtime time.Time
	data  []byte
}

// snapshot reads the files of dir.
func snapshot(dir string) map[string]file {
	out := map[string]file{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(f, maxRead))
		f.Close()
		out[e.Name()] = file{info.ModTime(), b}
	}
	return out
}

// Leaks returns, for each file of dir that is not in before (or changed
// since) and names a path starting with one of markers that it did not
// name before (a file shared by all, as low-level-runtimes.json, keeps
// what others wrote), a line naming the file and the path.
func Leaks(dir string, before map[string]file, markers []string) []string {
	var out []string
	for name, now := range snapshot(dir) {
		old, ok := before[name]
		if ok && old.mtime.Equal(now.mtime) && bytes.Equal(old.data, now.data) {
			continue
		}
		if p := newPath(now.data, old.data, markers); p != "" {
			out = append(out, fmt.Sprintf("%s was written during the tests and names %s", filepath.Join(dir, name), p))
		}
	}
	return out
}

// newPath returns the first path in b starting with a marker that old
// does not hold, or "".
func newPath(b, old []byte, markers []string) string {
	for _, mk := range markers {
		for rest := b; ; {
			i := bytes.Index(rest, []byte(mk))
			if i < 0 {
				break
			}
			j := i + len(mk)
			for j < len(rest) && j-i < 256 && pathByte(rest[j]) {
				j++
			}
			if tok := rest[i:j]; !bytes.Contains(old, tok) {
				return string(tok)
			}
			rest = rest[j:]
		}
	}
	return ""
}

func pathByte(c byte) bool {
	return c == '/' || c == '.' || c == '-' || c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// testMarkers returns "/TestName" for each test function of the package
// (the _test.go files of the working directory, which go test sets to the
// package's): the prefix of the test's t.TempDir paths.
func testMarkers() []string {
	files, _ := filepath.Glob("*_test.go")
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, m := range testFunc.FindAllSubmatch(b, -1) {
			out = append(out, string(filepath.Separator)+string(m[1]))
		}
	}
	return out
}
