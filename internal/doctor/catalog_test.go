package doctor

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCatalogCoversChecks keeps Checks (and so docs/troubleshooting.md) in
// step with the code: the Check* names read from this package's source, in
// declaration order, are Checks' names, and every check the code can fail
// has at least one documented failure with a fix.
func TestCatalogCoversChecks(t *testing.T) {
	_, files := packageFiles(t)
	var names []string
	failing := map[string]bool{}
	for _, file := range files {
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if !strings.HasPrefix(id.Name, "Check") || i >= len(n.Values) {
						continue
					}
					if lit, ok := n.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						names = append(names, s)
					}
				}
			case *ast.CallExpr:
				if fn, ok := n.Fun.(*ast.Ident); ok && fn.Name == "fail" && len(n.Args) > 0 {
					if id, ok := n.Args[0].(*ast.Ident); ok {
						failing[id.Name] = true
					}
				}
			}
			return true
		})
	}
	if len(names) == 0 {
		t.Fatal("no Check* constants found in the package source")
	}
	var got []string
	byName := map[string]CheckDef{}
	for _, c := range Checks {
		got = append(got, c.Name)
		byName[c.Name] = c
		if c.Verifies == "" {
			t.Errorf("Checks %q: Verifies is empty", c.Name)
		}
		for _, f := range c.Failures {
			if f.Reports == "" || f.Fix == "" {
				t.Errorf("Checks %q: failure %+v lacks what is reported or the fix", c.Name, f)
			}
		}
	}
	if strings.Join(got, "|") != strings.Join(names, "|") {
		t.Errorf("Checks names %q, want the Check* constants in order %q", got, names)
	}
	// fail(CheckX, ...) with a constant name: CheckX must document a failure.
	consts := map[string]string{
		"CheckKernel": CheckKernel, "CheckDeviceNodes": CheckDeviceNodes, "CheckNVML": CheckNVML,
		"CheckVersions": CheckVersions, "CheckDriverFiles": CheckDriverFiles,
		"CheckInventoryCache": CheckInventoryCache, "CheckCDISpecs": CheckCDISpecs, "CheckOldCDIHooks": CheckOldCDIHooks,
		"CheckDocker": CheckDocker, "CheckContainerd": CheckContainerd, "CheckCRIO": CheckCRIO,
		"CheckHook": CheckHook, "CheckContainer": CheckContainer, "CheckContainerDevice": CheckContainerDevice,
		"CheckPersistence": CheckPersistence, "CheckDevicePlugin": CheckDevicePlugin,
		"CheckAllocatable": CheckAllocatable, "CheckPod": CheckPod,
		"CheckPluginHealth": CheckPluginHealth, "CheckCheckpoint": CheckCheckpoint, "CheckNode": CheckNode,
	}
	for ident := range failing {
		name, ok := consts[ident]
		if !ok {
			continue // a variable (judgeRuntimes' name): its callers are the engine checks
		}
		if len(byName[name].Failures) == 0 {
			t.Errorf("%s can fail (fail(%s, ...) in the source) but Checks documents no failure for it", name, ident)
		}
	}
}

// packageFiles parses this package's non-test Go files, in name order, for
// the tests that read the source.
func packageFiles(t *testing.T) (*token.FileSet, []*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, f := range names {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, file)
	}
	return fset, files
}
