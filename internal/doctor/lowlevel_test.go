package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLowLevelCheck: doctor names the advisories of an affected runtime
// (INFO, not a failure) and passes a current one; each runtime found once.
func TestLowLevelCheck(t *testing.T) {
	dir := t.TempDir()
	fake := func(name, ver string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\necho '"+ver+"'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := fake("runc", "runc version 1.1.5+ds1")
	fake("crun", "crun version 1.28")
	t.Setenv("PATH", dir)
	e := newEnv(Options{})
	e.opts.Config.Runtime.LowLevel = old
	got := e.lowLevel()
	if len(got) != 1 || got[0].Status != Info || !got[0].OK || !strings.Contains(got[0].Evidence, "CVE-2026-41579") ||
		!strings.Contains(got[0].Evidence, "crun 1.28") || strings.Count(got[0].Evidence, old) != 1 {
		t.Errorf("runc 1.1.5 and crun 1.28: %+v", got)
	}
	fake("runc", "runc version 1.5.2")
	if got := e.lowLevel(); len(got) != 1 || got[0].Status != Pass {
		t.Errorf("runc 1.5.2 and crun 1.28: %+v", got)
	}
	fake("crun", "crun version 1.8.1")
	if got := e.lowLevel(); len(got) != 1 || got[0].Status != Info || !strings.Contains(got[0].Evidence, "CVE-2026-47766") {
		t.Errorf("crun 1.8.1: %+v", got)
	}
	t.Setenv("PATH", t.TempDir())
	e.opts.Config.Runtime.LowLevel = "runc"
	if got := e.lowLevel(); len(got) != 1 || got[0].Status != Skip {
		t.Errorf("no runtime: %+v", got)
	}
}
