package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
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
			if err := probeRuntime(f, p); err != nil {
				rt.skip = fmt.Sprintf("%s cannot run a trivial container here: %v", p, err)
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
