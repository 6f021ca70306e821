// Package hostguard keeps a package's tests off the host's Gantry state: a
// test that runs gantry, gantry-runtime or the hook with a configuration
// lacking runtime.cache-dir writes its driver inventory and tree caches into
// the default cache directory (/run/gantry), which on a machine with Gantry
// installed is the installed runtime's, and reads whatever is there.
//
// Run wraps m.Run in a TestMain and fails the package when a file in the
// default cache directory was created or rewritten during the tests and
// names one of the package's tests (their t.TempDir paths are
// /tmp/TestName...) or one of the package's own fixture directories. The
// content test keeps other processes on the same host (another checkout's
// tests, an installed runtime) from failing this package.
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

// snapshot maps the names in dir to their modification times.
func snapshot(dir string) map[string]time.Time {
	out := map[string]time.Time{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			out[e.Name()] = info.ModTime()
		}
	}
	return out
}

// Leaks returns, for each file of dir that is not in before (or changed
// since) and contains one of markers, a line naming it and the marker.
func Leaks(dir string, before map[string]time.Time, markers []string) []string {
	var out []string
	for name, mtime := range snapshot(dir) {
		if t, ok := before[name]; ok && t.Equal(mtime) {
			continue
		}
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(f, maxRead))
		f.Close()
		for _, mk := range markers {
			if bytes.Contains(b, []byte(mk)) {
				out = append(out, fmt.Sprintf("%s was written during the tests and names %s", filepath.Join(dir, name), mk))
				break
			}
		}
	}
	return out
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
