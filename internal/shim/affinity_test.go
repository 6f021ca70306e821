//go:build cgo

package shim

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A create that Go handles runs on one CPU (the C constructor narrows the
// affinity so the Go runtime starts with one P), but the low-level
// runtime, and so the container, gets the CPUs gantry-runtime was started
// with.
func TestLowLevelGetsCallersAffinity(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil || set.Count() < 2 {
		t.Skip("needs two CPUs")
	}
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		t.Skip("no taskset (util-linux)")
	}
	var cpus []int
	for c := 0; c < 1024 && len(cpus) < 2; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	_, rt := buildGantry(t)
	dir := t.TempDir()
	status := filepath.Join(dir, "status")
	low := filepath.Join(dir, "low-level")
	if err := os.WriteFile(low, []byte("#!/bin/sh\ngrep Cpus_allowed_list /proc/self/status >"+status+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A key the fast path does not know to be neutral: the create goes to Go.
	conf := filepath.Join(dir, "gantry.toml")
	if err := os.WriteFile(conf, []byte("[runtime]\nlow-level = \""+low+"\"\nlog-file = \"\"\ncache-dir = \""+filepath.Join(dir, "cache")+"\"\n\n[cdi]\nannotation-prefixes = [\"cdi.k8s.io/\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), specFor(t, []string{"PATH=/bin"}, nil, nil, false), 0o644); err != nil {
		t.Fatal(err)
	}
	list := strconv.Itoa(cpus[0]) + "," + strconv.Itoa(cpus[1])
	cmd := exec.Command(taskset, "-c", list, rt, "--root", filepath.Join(dir, "state"), "create", "--bundle", bundle, "c1")
	cmd.Env = []string{"GANTRY_CONFIG=" + conf, "PATH=/usr/bin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gantry-runtime create: %v\n%s", err, out)
	}
	got, err := os.ReadFile(status)
	if err != nil {
		t.Fatalf("the low-level runtime did not run: %v", err)
	}
	want := list
	if cpus[1] == cpus[0]+1 {
		want = strconv.Itoa(cpus[0]) + "-" + strconv.Itoa(cpus[1])
	}
	if f := strings.Fields(string(got)); len(f) != 2 || f[1] != want {
		t.Errorf("the low-level runtime ran with %q, want the CPUs gantry-runtime was given (%s)", strings.TrimSpace(string(got)), want)
	}
}
