package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestArchitectureNamesEveryPackage: docs/architecture.md, the map of
// the code, names every package under internal/ (as `internal/PATH`), and
// the README links it. A package added without its line fails here.
func TestArchitectureNamesEveryPackage(t *testing.T) {
	doc, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	var pkgs []string
	err = filepath.WalkDir("../internal", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(strings.TrimPrefix(p, "../")))
		if len(pkgs) == 0 || pkgs[len(pkgs)-1] != pkg {
			pkgs = append(pkgs, pkg)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 42 {
		t.Fatalf("found %d packages under internal/: the walk is broken (%v)", len(pkgs), pkgs)
	}
	for _, p := range pkgs {
		if !strings.Contains(string(doc), "`"+p+"`") {
			t.Errorf("docs/architecture.md does not name package %s: add its line to the layer it belongs to", p)
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "(docs/architecture.md)") {
		t.Error("README.md does not link docs/architecture.md")
	}
}
