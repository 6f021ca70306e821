package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// withCtlNode gives the container a /dev/nvidiactl node (195:255), as
// gantry-runtime's spec edits do.
func withCtlNode(s *specs.Spec) {
	major, minor := int64(195), int64(255)
	mode := os.FileMode(0o666)
	s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: "/dev/nvidiactl", Type: "c", Major: major, Minor: minor, FileMode: &mode})
}

// TestDoctorRuncContainer examines containers runc runs without an engine
// (found by their state under --runc-root): one whose spec has the GPU's
// control node and its device rule, and one whose rule is missing, the
// state a daemon-reload leaves a hook-injected container in.
func TestDoctorRuncContainer(t *testing.T) {
	allowed := startRunc(t, "runc-allowed", true, withCtlNode)
	denied := startRunc(t, "runc-denied", false, withCtlNode)
	opts := func(id, root string) Options {
		o := Options{
			Proc: "/proc", Config: configWithDevRoot(t.TempDir()), Container: id, RuncRoot: root,
			Docker: filepath.Join(t.TempDir(), "no-docker"), ContainerdState: t.TempDir(),
		}
		o.defaults()
		return o
	}
	byName := func(checks []Check) map[string]Check {
		m := map[string]Check{}
		for _, c := range checks {
			m[c.Name] = c
		}
		return m
	}

	got := byName(checkContainer(opts(allowed.id, allowed.state)))
	if c := got[CheckContainer]; c.Status != Pass || !strings.Contains(c.Evidence, "runc container "+allowed.id) || !strings.Contains(c.Evidence, "/dev/nvidiactl") {
		t.Errorf("request: %+v", c)
	}
	if c := got[CheckContainerDevice]; c.Status != Pass {
		t.Errorf("device access of a container whose spec allows 195:255: %+v", c)
	}

	got = byName(checkContainer(opts(denied.id, denied.state)))
	c := got[CheckContainerDevice]
	if c.Status != Fail || !strings.Contains(c.Evidence, "Failed to initialize NVML: Unknown Error") ||
		!strings.Contains(c.Fix, "runc --root "+denied.state+" delete --force "+denied.id) {
		t.Errorf("device access of a container without the rule: %+v", c)
	}

	// A container that never asked for a GPU (no request, no node, no
	// rule) is not a device-cgroup failure to restart: INFO, not probed.
	plain := startRunc(t, "runc-plain", false)
	got = byName(checkContainer(opts(plain.id, plain.state)))
	if c := got[CheckContainer]; c.Status != Info || !c.OK || !strings.Contains(c.Evidence, "no GPU requested") {
		t.Errorf("request of a container without a GPU request: %+v", c)
	}
	if c := got[CheckContainerDevice]; c.Status != Info || !c.OK || !strings.Contains(c.Evidence, "no GPU requested") {
		t.Errorf("device access of a container without a GPU request: %+v", c)
	}

	got = byName(checkContainer(opts("no-such-container", allowed.state)))
	if c := got[CheckContainer]; c.Status != Fail || !strings.Contains(c.Evidence, `no runc container "no-such-container" in `+allowed.state) {
		t.Errorf("unknown container: %+v", c)
	}
}

// A state whose init process is gone while its PID now belongs to another
// process (here: this test) is not running: doctor must not probe that
// process's cgroup.
func TestRuncStateReusedPID(t *testing.T) {
	root, bundle := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	state := func(start uint64) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, "c1"), 0o755); err != nil {
			t.Fatal(err)
		}
		b := fmt.Sprintf(`{"id":"c1","init_process_pid":%d,"init_process_start":%d,"config":{"labels":["bundle=%s"]}}`, os.Getpid(), start, bundle)
		if err := os.WriteFile(filepath.Join(root, "c1", "state.json"), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	o := Options{Proc: "/proc", Config: configWithDevRoot(t.TempDir())}
	o.defaults()

	state(startTime("/proc", os.Getpid()) + 1) // another process's start time
	c, err := findRuncState(root, "c1")
	if err != nil {
		t.Fatal(err)
	}
	checks := checkRuncState(o, c)
	if last := checks[len(checks)-1]; last.Name != CheckContainerDevice || last.Status != Skip || !strings.Contains(last.Evidence, "not running") {
		t.Errorf("reused PID: %+v", last)
	}
	if startTime("/proc", os.Getpid()) == 0 {
		t.Fatal("cannot read this process's start time")
	}
}
