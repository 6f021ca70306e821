package doctor

import (
	"go/ast"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestChecksDocumented: every check in the one list has its
// documentation: a summary for --help, what it verifies, and for each
// failure what is reported and the fix; its needs are ones Run knows.
func TestChecksDocumented(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range Checks {
		if c.Name == "" || seen[c.Name] {
			t.Errorf("check %q: empty or listed twice", c.Name)
		}
		seen[c.Name] = true
		if c.Summary == "" || c.Verifies == "" || c.run == nil {
			t.Errorf("check %q: summary %q, verifies %q, run set %v: each must be given", c.Name, c.Summary, c.Verifies, c.run != nil)
		}
		for _, f := range c.Failures {
			if strings.TrimSpace(f.Reports) == "" || strings.TrimSpace(f.Fix) == "" {
				t.Errorf("check %q: failure %+v has no report or no fix", c.Name, f)
			}
		}
		for _, n := range c.Needs {
			if needDocs[n] == "" {
				t.Errorf("check %q needs %q, which has no documentation", c.Name, n)
			}
			// Run knows it (an unknown need panics).
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Errorf("check %q: %v", c.Name, r)
					}
				}()
				e := newEnv(Options{KubeletDir: t.TempDir() + "/none", DockerConfig: "/nonexistent", ContainerdConfig: "/nonexistent", CRIOConfig: "/nonexistent", CRIODropins: "/nonexistent", CRISocket: "/nonexistent"})
				e.unmet(CheckDef{Name: c.Name, Needs: []Need{n}})
			}()
		}
	}
	if !strings.Contains(Help(), "Checks, in order") {
		t.Errorf("Help: %q", Help())
	}
	// --help lists every check, in order.
	rest := Help()
	for _, c := range Checks {
		i := strings.Index(rest, "\n  "+c.Name+" ")
		if i < 0 {
			t.Fatalf("--help does not list %q (in order):\n%s", c.Name, Help())
		}
		rest = rest[i+1:]
	}
}

// TestTroubleshootingMatchesChecks: docs/troubleshooting.md is generated
// from Checks: it documents exactly the checks of the list, in order, and
// is byte for byte what Troubleshooting renders.
func TestTroubleshootingMatchesChecks(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, line := range strings.Split(string(b), "\n") {
		if name, ok := strings.CutPrefix(line, "## "); ok {
			documented = append(documented, name)
		}
	}
	var want []string
	for _, c := range Checks {
		want = append(want, c.Name)
	}
	listed := map[string]bool{}
	for _, n := range want {
		listed[n] = true
	}
	for _, n := range documented {
		if !listed[n] {
			t.Errorf("docs/troubleshooting.md documents check %q, which is not in Checks", n)
		}
	}
	if strings.Join(documented, "|") != strings.Join(want, "|") {
		t.Errorf("docs/troubleshooting.md documents %q, want Checks %q", documented, want)
	}
	if string(b) != Troubleshooting() {
		t.Errorf("docs/troubleshooting.md is not what Checks render: run go generate ./internal/doctor")
	}
}

// TestRunFollowsChecks: Run reports the checks in the list's order (a
// pod's containers are reported under pod containers, as the doc says).
func TestRunFollowsChecks(t *testing.T) {
	h := newHost(t)
	pos := map[string]int{}
	for i, c := range Checks {
		pos[c.Name] = i
	}
	last := -1
	for _, c := range Run(h.opts) {
		i, ok := pos[c.Name]
		if !ok {
			t.Fatalf("Run reports %q, which is not in Checks", c.Name)
		}
		if i < last {
			t.Errorf("Run reports %q after %q", c.Name, Checks[last].Name)
		}
		last = i
	}
}

// TestFixesWrittenOnce: the fix a failure prints is the one its check
// documents. In this package's source, the fix argument of fail() holds
// no text of its own (no string literal, other than a placeholder's value
// given to fix()), and every fix*-constant that fix() renders, and every
// one fixes.go declares, appears in the Checks list.
func TestFixesWrittenOnce(t *testing.T) {
	fset, files := packageFiles(t)
	inChecks := map[string]bool{}
	declared := map[string]bool{}
	rendered := map[string]string{}           // constant -> where
	partOf := map[string]bool{}               // constants used in another fix's text
	documents := map[string]map[string]bool{} // Check* constant -> the fixes its Failures show
	var printed [][3]string                   // fail(CheckX, fix(fixY)): check, fix, where
	for _, file := range files {
		// document notes one CheckDef: which check documents which fix.
		document := func(def *ast.CompositeLit) {
			ast.Inspect(def, func(m ast.Node) bool {
				if id, ok := m.(*ast.Ident); ok && strings.HasPrefix(id.Name, "fix") {
					inChecks[id.Name] = true
				}
				return true
			})
			var name string
			fixes := map[string]bool{}
			for _, kv := range def.Elts {
				kv := kv.(*ast.KeyValueExpr)
				switch kv.Key.(*ast.Ident).Name {
				case "Name":
					if id, ok := kv.Value.(*ast.Ident); ok {
						name = id.Name
					} // else made at run time (engineCheck): not a Check* constant
				case "Failures":
					ast.Inspect(kv.Value, func(m ast.Node) bool {
						if id, ok := m.(*ast.Ident); ok && strings.HasPrefix(id.Name, "fix") {
							fixes[id.Name] = true
						}
						return true
					})
				}
			}
			if name != "" {
				documents[name] = fixes
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				// A check appended to Checks in an init (its own file).
				if id, ok := n.Type.(*ast.Ident); ok && id.Name == "CheckDef" {
					document(n)
				}
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if id.Name == "Checks" && i < len(n.Values) {
						for _, el := range n.Values[i].(*ast.CompositeLit).Elts {
							document(el.(*ast.CompositeLit))
						}
					}
					if filepath.Base(fset.Position(file.Pos()).Filename) == "fixes.go" && strings.HasPrefix(id.Name, "fix") {
						declared[id.Name] = true
						if i < len(n.Values) { // a part of another fix
							ast.Inspect(n.Values[i], func(m ast.Node) bool {
								if id, ok := m.(*ast.Ident); ok && strings.HasPrefix(id.Name, "fix") {
									partOf[id.Name] = true
								}
								return true
							})
						}
					}
				}
			case *ast.CallExpr:
				var fn *ast.Ident
				switch f := n.Fun.(type) {
				case *ast.Ident:
					fn = f
				case *ast.SelectorExpr: // s.hints.fix(fixX): the node's name filled in
					fn = f.Sel
				default:
					return true
				}
				switch {
				case (fn.Name == "fail" || fn.Name == "warn") && len(n.Args) >= 2:
					check, _ := n.Args[0].(*ast.Ident)
					ast.Inspect(n.Args[1], func(m ast.Node) bool {
						if call, ok := m.(*ast.CallExpr); ok {
							if id, ok := call.Fun.(*ast.Ident); ok && id.Name == "fix" {
								if c, ok := call.Args[0].(*ast.Ident); ok && check != nil {
									printed = append(printed, [3]string{check.Name, c.Name, fset.Position(call.Pos()).String()})
								}
								return false // its placeholders' values may be text
							}
						}
						if lit, ok := m.(*ast.BasicLit); ok && lit.Kind == token.STRING {
							t.Errorf("%s: fail() writes its own fix text %s: use a documented fix constant (fixes.go) through fix()", fset.Position(lit.Pos()), lit.Value)
						}
						return true
					})
				case fn.Name == "fix" && len(n.Args) >= 1:
					if id, ok := n.Args[0].(*ast.Ident); ok {
						if strings.HasPrefix(id.Name, "fix") {
							rendered[id.Name] = fset.Position(n.Pos()).String()
						} // else a parameter passed on (nodeHints.fix): its callers are scanned
					} else {
						t.Errorf("%s: fix() of something other than a fix constant", fset.Position(n.Pos()))
					}
				}
			}
			return true
		})
	}
	if len(rendered) < 20 || len(declared) < 20 {
		t.Fatalf("found %d rendered and %d declared fixes: the scan is broken", len(rendered), len(declared))
	}
	for _, p := range printed {
		if p[0] == "name" {
			continue // judgeRuntimes: the engine checks pass their own name and fixes
		}
		if docs, ok := documents[p[0]]; !ok || !docs[p[1]] {
			t.Errorf("%s: fail(%s, fix(%s)): %s does not document that fix in its Failures", p[2], p[0], p[1], p[0])
		}
	}
	if len(printed) < 20 {
		t.Fatalf("found %d fail(CheckX, fix(fixY)) calls: the scan is broken", len(printed))
	}
	for c, where := range rendered {
		if !inChecks[c] {
			t.Errorf("%s: %s is printed but no check documents it in Checks", where, c)
		}
	}
	for c := range declared {
		if !inChecks[c] && !partOf[c] {
			t.Errorf("fixes.go declares %s, which no check documents", c)
		}
	}
}
