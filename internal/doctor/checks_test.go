package doctor

import (
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
