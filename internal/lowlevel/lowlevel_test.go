package lowlevel

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestAdvisories: the versions each advisory names as affected, at the
// edges of each release line.
func TestAdvisories(t *testing.T) {
	for _, tc := range []struct {
		ver  Version
		want []string // CVE lists
	}{
		{Version{"runc", "1.1.5+ds1"}, []string{"CVE-2025-31133", "CVE-2026-41579"}},
		{Version{"runc", "1.2.7"}, []string{"CVE-2025-31133", "CVE-2026-41579"}},
		{Version{"runc", "1.2.8"}, []string{"CVE-2026-41579"}},
		{Version{"runc", "1.2.9"}, []string{"CVE-2026-41579"}},
		{Version{"runc", "1.3.0-rc.1"}, []string{"CVE-2025-31133", "CVE-2026-41579"}},
		{Version{"runc", "1.3.2"}, []string{"CVE-2025-31133", "CVE-2026-41579"}},
		{Version{"runc", "1.3.3"}, []string{"CVE-2026-41579"}},
		{Version{"runc", "1.3.6"}, nil},
		{Version{"runc", "1.4.0-rc.2"}, []string{"CVE-2025-31133", "CVE-2026-41579"}},
		{Version{"runc", "1.4.0-rc.3"}, []string{"CVE-2026-41579"}},
		{Version{"runc", "1.4.2"}, []string{"CVE-2026-41579"}},
		{Version{"runc", "1.4.3"}, nil},
		{Version{"runc", "1.5.0-rc.2"}, []string{"CVE-2026-41579"}},
		{Version{"runc", "1.5.0-rc.3"}, nil},
		{Version{"runc", "1.5.2"}, nil},
		{Version{"crun", "1.8.1"}, []string{"CVE-2026-47766"}},
		{Version{"crun", "1.27.1"}, []string{"CVE-2026-47766"}},
		{Version{"crun", "1.28"}, nil},
		{Version{"crun", "1.29.1"}, nil},
		{Version{"youki", "0.1.0"}, nil},
	} {
		advs, err := Advisories(tc.ver)
		if err != nil {
			t.Errorf("%v: %v", tc.ver, err)
			continue
		}
		var got []string
		for _, a := range advs {
			got = append(got, strings.Split(a.IDs, ",")[0])
		}
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%v: advisories %q, want %q", tc.ver, got, tc.want)
		}
		if w := Warning("/usr/sbin/x", tc.ver, advs); (w != "") != (len(tc.want) > 0) || (w != "" && !strings.Contains(w, tc.want[0])) {
			t.Errorf("%v: warning %q", tc.ver, w)
		}
	}
	if _, err := Advisories(Version{"runc", "one"}); err == nil {
		t.Error("runc version \"one\": no error")
	}
}

// TestProbeRealRuntimes: the three runtimes the escape tests run, as
// installed (Debian's runc 1.1.5 and crun 1.8.1, runc 1.5.2 from
// scripts/build-runc.sh), read from their own --version.
func TestProbeRealRuntimes(t *testing.T) {
	root, _ := filepath.Abs(filepath.Join("..", ".."))
	built, _ := filepath.Glob(filepath.Join(root, "bin", "runtimes", "runc-*"))
	found := 0
	for _, p := range append([]string{"/usr/sbin/runc", "/usr/bin/crun"}, built...) {
		if _, err := os.Stat(p); err != nil {
			t.Logf("%s: %v (skipped)", p, err)
			continue
		}
		found++
		ver, err := Probe(context.Background(), p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		advs, err := Advisories(ver)
		if err != nil {
			t.Errorf("%s (%v): %v", p, ver, err)
			continue
		}
		t.Logf("%s: %v: %s", p, ver, Warning(p, ver, advs))
		x, _ := parseSemver(ver.Version)
		fixed := (ver.Name == "runc" && !x.less(v("1.5.0"))) || (ver.Name == "crun" && !x.less(v("1.28")))
		if fixed != (len(advs) == 0) {
			t.Errorf("%s (%v): %d advisories", p, ver, len(advs))
		}
	}
	if found == 0 {
		t.Skip("no runc or crun installed")
	}
	if _, err := Probe(context.Background(), "/bin/true"); err == nil {
		t.Error("a program that prints no version: no error")
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]Version{
		"runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\n": {"runc", "1.1.5+ds1"},
		"crun version 1.8.1\ncommit: f8a096be\n":                {"crun", "1.8.1"},
	} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "Usage: runc", "runc 1.2"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q): no error", in)
		}
	}
}

// TestCheckOnce: the warning comes the first time a binary is seen, not
// on the creates after it; a changed binary (an upgrade: another identity)
// is probed again; no cache directory, no probe.
func TestCheckOnce(t *testing.T) {
	dir := t.TempDir()
	rt := filepath.Join(t.TempDir(), "runc")
	write := func(ver string) {
		t.Helper()
		tmp := rt + ".new"
		if err := os.WriteFile(tmp, []byte("#!/bin/sh\necho 'runc version "+ver+"'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, rt); err != nil {
			t.Fatal(err)
		}
	}
	write("1.1.5")
	w, err := CheckOnce(dir, rt)
	if err != nil || !strings.Contains(w, "CVE-2026-41579") {
		t.Fatalf("first check of runc 1.1.5: %q, %v", w, err)
	}
	for range 3 {
		if w, err := CheckOnce(dir, rt); w != "" || err != nil {
			t.Errorf("check after the first: %q, %v; want nothing (once)", w, err)
		}
	}
	write("1.1.4")
	if w, _ := CheckOnce(dir, rt); !strings.Contains(w, "1.1.4") {
		t.Errorf("after the binary changed: %q, want a warning naming 1.1.4", w)
	}
	write("1.5.2")
	if w, err := CheckOnce(dir, rt); w != "" || err != nil {
		t.Errorf("after an upgrade to 1.5.2: %q, %v", w, err)
	}
	if w, err := CheckOnce("", "/nonexistent"); w != "" || err != nil {
		t.Errorf("no cache directory: %q, %v", w, err)
	}
}

// The cache is read on every in-process GPU create: a FIFO or a link in
// its place is no cache (the create neither waits nor follows it), and
// the runtime is probed as on a first sight.
func TestCheckOnceHostileCache(t *testing.T) {
	rt := filepath.Join(t.TempDir(), "runc")
	if err := os.WriteFile(rt, []byte("#!/bin/sh\necho 'runc version 1.1.5'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, plant := range map[string]func(string) error{
		"fifo": func(p string) error { return unix.Mkfifo(p, 0o600) },
		"link": func(p string) error { return os.Symlink("/dev/zero", p) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := plant(filepath.Join(dir, CacheFile)); err != nil {
				t.Fatal(err)
			}
			done := make(chan string, 1)
			go func() { w, _ := CheckOnce(dir, rt); done <- w }()
			select {
			case w := <-done:
				if !strings.Contains(w, "CVE-") {
					t.Errorf("CheckOnce with a %s for a cache: %q, want the warning of a first sight", name, w)
				}
			case <-time.After(2 * time.Minute):
				t.Fatalf("CheckOnce waited on a %s in the cache's place", name)
			}
		})
	}
}
