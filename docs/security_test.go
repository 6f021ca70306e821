package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// SECURITY.md names, for each attack class, the tests that try it. Each
// name must be a test (or fuzz target) that exists, so the page cannot
// promise a test that was renamed or removed. In a cell, `dir.TestX` names
// a directory and bare `TestY` or `FuzzY` after it are in the same one.
func TestSecurityTestNames(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "SECURITY.md"))
	if err != nil {
		t.Fatal(err)
	}
	code := regexp.MustCompile("`([^`]+)`")
	qualified := regexp.MustCompile(`^((?:internal|cmd|test|docs)/[a-z0-9/_-]+)\.((?:Test|Fuzz)\w*(?:/[^ ]+)?)$`)
	bare := regexp.MustCompile(`^(?:Test|Fuzz)\w+$`)
	checked := 0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		for _, cell := range strings.Split(line, "|") {
			dir := ""
			for _, m := range code.FindAllStringSubmatch(cell, -1) {
				ref := m[1]
				name := ""
				if q := qualified.FindStringSubmatch(ref); q != nil {
					dir, name = q[1], q[2]
				} else if bare.MatchString(ref) {
					if dir == "" {
						t.Errorf("SECURITY.md: %s has no directory before it in its cell", ref)
						continue
					}
					name = ref
				} else {
					continue
				}
				checked++
				if strings.HasPrefix(name, "Fuzz") {
					if !declares(t, dir, "func "+name+"(f *testing.F)") {
						t.Errorf("SECURITY.md names %s.%s: no such fuzz target", dir, name)
					}
					continue
				}
				if err := testExists(dir + "." + name); err != nil {
					t.Errorf("SECURITY.md: %v", err)
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d test names found in SECURITY.md's tables; the parser or the page is off", checked)
	}
}

func declares(t *testing.T, dir, decl string) bool {
	files, _ := filepath.Glob(filepath.Join(repoRoot, dir, "*_test.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), decl) {
			return true
		}
	}
	return false
}
