package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/lowlevel"
)

// The container-escape tests run once per low-level runtime: a hostile image
// must not get out through runc 1.1.5 (Debian 12), the newest runc release
// (scripts/build-runc.sh) or crun, whose hook environment, working directory
// and mount handling differ. GANTRY_TEST_RUNTIMES (comma-separated paths)
// picks them; by default every one of defaultRuntimes that exists.

// lowLevel is one candidate runtime, probed once per process.
type lowLevel struct {
	path string
	name string // "<binary>-<version>", the subtest's name
	skip string // why it cannot run a trivial container here
	note string // how it is run, where not directly
}

var (
	runtimesOnce sync.Once
	runtimesList []lowLevel
	// byTest maps a per-runtime subtest's full name to its runtime's path;
	// newContainer finds it through the subtest name, so a test body's many
	// newContainer calls (and nested t.Run) need no extra argument.
	byTest sync.Map
)

func defaultRuntimes() []string {
	root, _ := filepath.Abs(filepath.Join("..", ".."))
	paths := []string{"/usr/sbin/runc"}
	built, _ := filepath.Glob(filepath.Join(root, "bin", "runtimes", "runc-*"))
	paths = append(paths, built...)
	paths = append(paths, "/usr/bin/crun")
	var have []string
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil && !st.IsDir() && !strings.HasSuffix(p, ".tmp") {
			have = append(have, p)
		}
	}
	return have
}

// eachRuntime runs body as one subtest per low-level runtime, named
// "<binary>-<version>"; a runtime that cannot run a trivial container skips
// with its reason.
func eachRuntime(t *testing.T, body func(t *testing.T)) {
	t.Helper()
	f := need(t)
	runtimesOnce.Do(func() { runtimesList = probeRuntimes(f) })
	if len(runtimesList) == 0 {
		t.Skip("no low-level runtime: GANTRY_TEST_RUNTIMES is empty and none of /usr/sbin/runc, bin/runtimes/runc-*, /usr/bin/crun exists")
	}
	for _, rt := range runtimesList {
		rt := rt
		t.Run(rt.name, func(t *testing.T) {
			if rt.skip != "" {
				t.Skip(rt.skip)
			}
			if rt.note != "" {
				t.Log(rt.note)
			}
			byTest.Store(t.Name(), rt.path)
			defer byTest.Delete(t.Name())
			body(t)
		})
	}
}

// runtimeFor is the low-level runtime for a test: the one its eachRuntime
// subtest (or an ancestor's) registered, else the fixture's runc.
func runtimeFor(t *testing.T, f *fixture) string {
	for name := t.Name(); ; {
		if p, ok := byTest.Load(name); ok {
			return p.(string)
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			return f.runc
		}
		name = name[:i]
	}
}

func probeRuntimes(f *fixture) []lowLevel {
	var paths []string
	if env, ok := os.LookupEnv("GANTRY_TEST_RUNTIMES"); ok {
		for _, p := range strings.Split(env, ",") {
			if p = strings.TrimSpace(p); p != "" {
				paths = append(paths, p)
			}
		}
	} else {
		paths = defaultRuntimes()
	}
	var list []lowLevel
	seen := map[string]bool{}
	for _, p := range paths {
		rt := lowLevel{path: p, name: filepath.Base(p)}
		out, err := exec.Command(p, "--version").CombinedOutput()
		if err != nil {
			rt.skip = fmt.Sprintf("%s --version: %v: %s", p, err, strings.TrimSpace(string(out)))
		} else {
			// "runc version 1.1.5", "crun version 1.8.1"
			first := strings.Fields(strings.SplitN(string(out), "\n", 2)[0])
			bin := strings.SplitN(filepath.Base(p), "-", 2)[0]
			if len(first) >= 3 && first[1] == "version" {
				rt.name = bin + "-" + first[2]
			}
			if v := strings.IndexAny(rt.name, "+~"); v > 0 {
				rt.name = rt.name[:v] // Debian's "1.1.5+ds1"
			}
			err := probeRuntime(f, p)
			if err != nil && bin == "crun" && strings.Contains(err.Error(), "hybrid mode not supported") {
				// crun refuses a host with cgroup v1 and v2 both mounted (runc
				// does not). In a private mount namespace that sees only a
				// cgroup2 mount, with its cgroup manager off, it runs; the
				// rest of the host is the same filesystem the escape tests
				// check, and hooks still run as root on the host.
				if w, werr := crunWrapper(f, p); werr != nil {
					err = werr
				} else if err = probeRuntime(f, w); err == nil {
					rt.path, rt.note = w, "crun runs in a private mount namespace with only cgroup2 at /sys/fs/cgroup and --cgroup-manager=disabled: the host mounts cgroup v1 and v2 (hybrid), which crun refuses"
				}
			}
			if err != nil {
				rt.skip = fmt.Sprintf("%s cannot run a trivial container here: %s", p, strings.Join(strings.Fields(err.Error()), " "))
			}
		}
		for seen[rt.name] {
			rt.name += "+"
		}
		seen[rt.name] = true
		list = append(list, rt)
	}
	return list
}

// probeRuntime runs "true" from the fixture's image directly under runtime.
func probeRuntime(f *fixture, runtime string) error {
	dir, err := os.MkdirTemp(f.dir, "probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return err
	}
	if err := run("cp", "-al", f.imageDir, filepath.Join(bundle, "rootfs")); err != nil {
		return err
	}
	var spec ocispecs.Spec
	if err := json.Unmarshal(f.specTmpl, &spec); err != nil {
		return err
	}
	spec.Process.Terminal = false
	spec.Process.Args = []string{"true"}
	spec.Process.Env = []string{"PATH=/bin"}
	spec.Root = &ocispecs.Root{Path: "rootfs"}
	b, err := json.Marshal(&spec)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
		return err
	}
	state := filepath.Join(dir, "state")
	id := fmt.Sprintf("gantry-probe-%d", os.Getpid())
	defer exec.Command(runtime, "--root", state, "delete", "--force", id).Run()
	return run(runtime, "--root", state, "run", "--bundle", bundle, id)
}

// crunWrapper writes a script that runs crun where it sees a cgroup2-only
// /sys/fs/cgroup (see probeRuntimes).
func crunWrapper(f *fixture, crun string) (string, error) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return "", fmt.Errorf("crun needs a cgroup2-only view here and unshare is missing (util-linux): %w", err)
	}
	w := filepath.Join(f.dir, "crun-cgroup2")
	script := fmt.Sprintf(`#!/bin/sh
exec %s -m /bin/sh -c 'mount --make-rprivate / && mount -t tmpfs none /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && exec "$0" --cgroup-manager=disabled "$@"' %s "$@"
`, unshare, crun)
	return w, os.WriteFile(w, []byte(script), 0o755)
}

// TestLowLevelWarnedOnce: a GPU create run in-process logs, once per
// low-level runtime binary, the advisories that affect its version
// (package lowlevel): runc before 1.3.6 (1.1.5 here) the /dev link race
// CVE-2026-41579 that made GPU nodes in a host directory, crun before 1.28
// (1.8.1) CVE-2026-47766; a current runc (1.5.2) nothing. The next create
// with the same cache does not repeat it.
func TestLowLevelWarnedOnce(t *testing.T) {
	eachRuntime(t, func(t *testing.T) {
		first := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"true"}})
		if out, stderr, err := first.run(); err != nil {
			t.Fatalf("run: %v\n%s\n%s", err, out, stderr)
		}
		second := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"true"}})
		second.config = first.config // the same cache and log
		if out, stderr, err := second.run(); err != nil {
			t.Fatalf("run: %v\n%s\n%s", err, out, stderr)
		}
		recs := logLines(t, first)
		if len(recs) != 2 {
			t.Fatalf("%d log records, want 2: %v", len(recs), recs)
		}
		ver, err := lowlevel.Probe(context.Background(), first.low)
		if err != nil {
			t.Skipf("the runtime's version: %v", err)
		}
		want := map[string]string{"runc": "CVE-2026-41579", "crun": "CVE-2026-47766"}[ver.Name]
		if advs, _ := lowlevel.Advisories(ver); len(advs) == 0 {
			want = ""
		}
		notes := fmt.Sprint(recs[0]["notes"])
		t.Logf("%v: notes %s", ver, notes)
		if want != "" && !strings.Contains(notes, want) {
			t.Errorf("%v: the first create's notes %s do not name %s", ver, notes, want)
		}
		if want == "" && strings.Contains(notes, "CVE-") {
			t.Errorf("%v: a runtime with no advisory was warned about: %s", ver, notes)
		}
		if n := fmt.Sprint(recs[1]["notes"]); strings.Contains(n, "CVE-") {
			t.Errorf("the second create repeats the warning: %s", n)
		}
	})
}
