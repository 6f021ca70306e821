package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

const libDir = "/usr/lib/x86_64-linux-gnu"

// treeLibDir is where the default layout (the driver tree) puts the 64-bit
// libraries, and where the container's ld.so.cache finds them.
const treeLibDir = "/usr/local/nvidia/lib64"

// gpuScript lists /dev, runs the probe, prints the env, and tries to write
// an injected library.
const gpuScript = `ls -1 /dev; echo ---; probe; echo ---; env; echo ---; ` +
	`touch ` + treeLibDir + `/libcuda.so.1 2>/dev/null && echo lib=writable || echo lib=readonly`

func devNodes(out string) []string {
	var nodes []string
	for _, l := range strings.Split(out, "\n") {
		if l == "---" {
			break
		}
		if strings.HasPrefix(l, "nvidia") {
			nodes = append(nodes, l)
		}
	}
	return nodes
}

func hostDev(t *testing.T, f *fixture, name string) string {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(f.driver.Root, "dev", name), &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x:%x", unix.Major(st.Rdev), unix.Minor(st.Rdev))
}

func TestGPUContainer(t *testing.T) {
	c := newContainer(t, opts{
		env:  []string{"NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"},
		args: []string{"sh", "-c", gpuScript + `; echo; stat -c nv1=%t:%T /dev/nvidia1`},
	})
	out, stderr, err := c.run()
	if err != nil {
		t.Fatalf("gantry-runtime run: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
	}
	want := []string{"nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidiactl"}
	if got := devNodes(out); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("device nodes in the container: %q, want exactly %q", got, want)
	}
	if !strings.Contains(out, "nv1="+hostDev(t, c.f, "nvidia1")) {
		t.Errorf("/dev/nvidia1 has not the host node's numbers (%s):\n%s", hostDev(t, c.f, "nvidia1"), out)
	}
	wantProbe := fmt.Sprintf("cuda=%d path=%s/libcuda.so.1", c.f.driver.CUDAVersion, treeLibDir)
	if !strings.Contains(out, wantProbe) {
		t.Errorf("probe in the container: want %q in\n%s", wantProbe, out)
	}
	// The request stays in the container's env, as NVIDIA's runtime leaves
	// it (workloads read it); the spec is marked as injected instead.
	if !strings.Contains(out, "NVIDIA_DRIVER_CAPABILITIES=compute,utility") || !strings.Contains(out, "NVIDIA_VISIBLE_DEVICES=1") {
		t.Errorf("container env: want the capabilities and NVIDIA_VISIBLE_DEVICES=1 kept:\n%s", out)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(c.configJSON(), &spec); err != nil || spec.Annotations[edits.InjectedAnnotation] != "1" {
		t.Errorf("config.json annotations %v (%v): want %s=1", spec.Annotations, err, edits.InjectedAnnotation)
	}
	if !strings.Contains(out, "lib=readonly") {
		t.Errorf("the injected libcuda is writable from the container:\n%s", out)
	}
	logged, err := os.ReadFile(filepath.Join(filepath.Dir(c.config), "gantry.log"))
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(logged, &rec); err != nil {
		t.Fatalf("log line %q: %v", logged, err)
	}
	if rec["container"] != c.id || fmt.Sprint(rec["devices"]) != "[1]" || rec["changed"] != true {
		t.Errorf("log line %s: want container %s, devices [1], changed", logged, c.id)
	}
}

func TestAllAndNone(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []string
	}{
		{"all", []string{"nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidia4", "nvidia5", "nvidia6", "nvidia7", "nvidiactl"}},
		// none: the driver without any GPU (NVIDIA's meaning).
		{"none", []string{"nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"}},
		{"GPU-does-not-matter,2", nil}, // refused below
	} {
		t.Run(tc.value, func(t *testing.T) {
			c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=" + tc.value}, args: []string{"sh", "-c", gpuScript}})
			out, stderr, err := c.run()
			if tc.want == nil {
				if err == nil {
					t.Fatalf("unknown UUID accepted:\n%s", out)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s\n%s", err, out, stderr)
			}
			if got := devNodes(out); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("nodes %q, want %q", got, tc.want)
			}
			if !strings.Contains(out, "cuda=") {
				t.Errorf("libcuda not usable:\n%s", out)
			}
		})
	}
}

// A container that asks for nothing is left exactly as it was.
func TestNoGPUUntouched(t *testing.T) {
	for _, env := range [][]string{nil, {"NVIDIA_VISIBLE_DEVICES="}, {"NVIDIA_VISIBLE_DEVICES=void"}} {
		c := newContainer(t, opts{env: env, args: []string{"true"}})
		before := c.configJSON()
		t.Cleanup(func() { c.runtime("delete", "--force", c.id) })
		if _, stderr, err := c.runtime("create", "--bundle", c.bundle, c.id); err != nil {
			t.Fatalf("create: %v\n%s", err, stderr)
		}
		if after := c.configJSON(); string(after) != string(before) {
			t.Errorf("env %q: config.json changed", env)
		}
		for _, p := range []string{"etc/ld.so.cache", libDir[1:] + "/libcuda.so.1"} {
			if _, err := os.Lstat(filepath.Join(c.rootfs, p)); err == nil {
				t.Errorf("env %q: %s created in the root filesystem", env, p)
			}
		}
	}
}

// A create retried on a bundle the shim already edited (engines retry; a
// runtime chain may hold Gantry twice) changes nothing more: no second set
// of mounts or nodes.
func TestCreateTwiceInjectsOnce(t *testing.T) {
	c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=1"}, args: []string{"true"}})
	var first []byte
	for i := 0; i < 2; i++ {
		if _, stderr, err := c.runtime("create", "--bundle", c.bundle, c.id); err != nil {
			t.Fatalf("create %d: %v\n%s", i+1, err, stderr)
		}
		if _, stderr, err := c.runtime("delete", "--force", c.id); err != nil {
			t.Fatalf("delete %d: %v\n%s", i+1, err, stderr)
		}
		if i == 0 {
			first = c.configJSON()
		}
	}
	if second := c.configJSON(); string(second) != string(first) {
		t.Errorf("the second create changed config.json again (%d -> %d bytes)", len(first), len(second))
	}
	// The log says why: one line per create, the second unchanged.
	b, err := os.ReadFile(filepath.Join(filepath.Dir(c.config), "gantry.log"))
	if err != nil {
		t.Fatal(err)
	}
	var recs []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(l), &r) == nil {
			recs = append(recs, r)
		}
	}
	if len(recs) != 2 || recs[0]["changed"] != true || recs[1]["changed"] != false ||
		!strings.Contains(fmt.Sprint(recs[1]["notes"]), "already injected") {
		t.Errorf("log records: want a changed create, then one left alone as already injected:\n%s", b)
	}
}

// Another vendor's CDI device named in an annotation: gantry-runtime
// injects it through the CNCF library from the spec directories, and marks
// the spec as injected like a GPU request.
func TestOtherVendorCDIDevice(t *testing.T) { eachRuntime(t, testOtherVendorCDIDevice) }

func testOtherVendorCDIDevice(t *testing.T) {
	specDir := t.TempDir()
	spec := `cdiVersion: "0.6.0"
kind: example.com/fpga
devices:
- name: f0
  containerEdits:
    env: ["FPGA_SLOT=f0"]
`
	if err := os.WriteFile(filepath.Join(specDir, "fpga.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newContainer(t, opts{
		args:        []string{"sh", "-c", "echo FPGA_SLOT=$FPGA_SLOT"},
		config:      fmt.Sprintf("[cdi]\nspec-dirs = [%q]", specDir),
		annotations: map[string]string{"cdi.k8s.io/fpga": "example.com/fpga=f0"},
	})
	out, stderr, err := c.run()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr)
	}
	if !strings.Contains(out, "FPGA_SLOT=f0") {
		t.Errorf("the CDI device's edits are not in the container:\n%s", out)
	}
	var got struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(c.configJSON(), &got); err != nil || got.Annotations[edits.InjectedAnnotation] != "example.com/fpga=f0" {
		t.Errorf("annotations %v (%v): want %s=example.com/fpga=f0", got.Annotations, err, edits.InjectedAnnotation)
	}

	// A name no spec has: one error naming it, no container.
	c = newContainer(t, opts{
		args:        []string{"true"},
		config:      fmt.Sprintf("[cdi]\nspec-dirs = [%q]", specDir),
		annotations: map[string]string{"cdi.k8s.io/fpga": "example.com/fpga=f9"},
	})
	if _, stderr, err := c.runtime("create", "--bundle", c.bundle, c.id); err == nil {
		c.runtime("delete", "--force", c.id)
		t.Error("create succeeded with an unknown CDI device")
	} else if !strings.Contains(stderr, "example.com/fpga=f9") {
		t.Errorf("error does not name the device: %s", stderr)
	}
}

// Podman runs the runtime's delete (and kill) with an empty environment:
// no PATH, no GANTRY_CONFIG. The default low-level runtime ("runc") is then
// found in the usual directories, by the C fast path and by Main alike, so
// the container is really deleted.
func TestEmptyEnvironment(t *testing.T) {
	if _, err := os.Stat(config.DefaultPath); err == nil {
		t.Skipf("%s exists: its low-level runtime would be used instead of the default", config.DefaultPath)
	}
	found := false
	for _, dir := range filepath.SplitList(DefaultPath) {
		if _, err := os.Stat(filepath.Join(dir, "runc")); err == nil {
			found = true
		}
	}
	if !found {
		t.Skipf("no runc in %s", DefaultPath)
	}
	for _, env := range [][]string{{}, {"GANTRY_NO_FASTPATH=1"}} {
		c := newContainer(t, opts{args: []string{"true"}})
		if _, stderr, err := c.runtime("create", "--bundle", c.bundle, c.id); err != nil {
			t.Fatalf("create: %v\n%s", err, stderr)
		}
		bare := func(args ...string) (string, error) {
			cmd := exec.Command(c.f.runtime, append([]string{"--root", c.state}, args...)...)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		if out, err := bare("state", c.id); err != nil || !strings.Contains(out, `"status": "created"`) {
			t.Errorf("env %q: state: %v\n%s", env, err, out)
		}
		if out, err := bare("delete", "--force", c.id); err != nil {
			t.Errorf("env %q: delete: %v\n%s", env, err, out)
		}
		if list, _, _ := c.runtime("list", "-q"); strings.TrimSpace(list) != "" {
			t.Errorf("env %q: the container is still there after delete: %q", env, list)
			c.runtime("delete", "--force", c.id)
		}
	}
}

// Failures stop the container before runc creates anything.
func TestRefusedRequests(t *testing.T) { eachRuntime(t, testRefusedRequests) }

func testRefusedRequests(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"NVIDIA_VISIBLE_DEVICES=99"}, "99"},
		{[]string{"NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"}, "cuda>=99.0"},
		{[]string{"NVIDIA_VISIBLE_DEVICES=0;1"}, "NVIDIA_VISIBLE_DEVICES"},
		{[]string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,bogus"}, "bogus"},
	} {
		c := newContainer(t, opts{env: tc.env, args: []string{"true"}})
		before := c.configJSON()
		_, stderr, err := c.runtime("create", "--bundle", c.bundle, c.id)
		if err == nil {
			c.runtime("delete", "--force", c.id)
			t.Errorf("env %q: container created", tc.env)
			continue
		}
		if !strings.Contains(stderr, tc.want) || strings.Count(strings.TrimSpace(stderr), "\n") > 0 {
			t.Errorf("env %q: want one line naming %q, got:\n%s", tc.env, tc.want, stderr)
		}
		if string(c.configJSON()) != string(before) {
			t.Errorf("env %q: config.json changed by a refused create", tc.env)
		}
		list, _, _ := c.runtime("list", "-q")
		if strings.TrimSpace(list) != "" {
			t.Errorf("env %q: runc has containers after a refused create: %q", tc.env, list)
		}
	}
}

// The host-wide request rules NVIDIA's config.toml had: disable-require lets
// a container whose NVIDIA_REQUIRE_CUDA the host fails start anyway, and
// swarm-resource reads the GPUs from Docker Swarm's generic resource variable.
func TestHostRequestRules(t *testing.T) { eachRuntime(t, testHostRequestRules) }

func testHostRequestRules(t *testing.T) {
	for _, tc := range []struct {
		config string
		env    []string
		want   []string
	}{
		{"disable-require = true", []string{"NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"}, []string{"nvidia1"}},
		{`swarm-resource = ["DOCKER_RESOURCE_GPU"]`, []string{"NVIDIA_VISIBLE_DEVICES=all", "DOCKER_RESOURCE_GPU=2"}, []string{"nvidia2"}},
	} {
		c := newContainer(t, opts{env: tc.env, args: []string{"sh", "-c", "ls -1 /dev; echo ---"}, config: tc.config})
		out, stderr, err := c.run()
		if err != nil {
			t.Fatalf("%s: %v\n%s", tc.config, err, stderr)
		}
		var got []string
		for _, n := range devNodes(out) {
			if strings.TrimLeft(strings.TrimPrefix(n, "nvidia"), "0123456789") == "" {
				got = append(got, n)
			}
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s, env %q: GPU nodes %q, want %q", tc.config, tc.env, got, tc.want)
		}
	}
}

// With accept-env-unprivileged = false, only privileged containers get GPUs
// through the env (NVIDIA's accept-nvidia-visible-devices-envvar-when-unprivileged).
func TestUnprivilegedEnvDisabled(t *testing.T) { eachRuntime(t, testUnprivilegedEnvDisabled) }

func testUnprivilegedEnvDisabled(t *testing.T) {
	for _, priv := range []bool{false, true} {
		c := newContainer(t, opts{
			env:      []string{"NVIDIA_VISIBLE_DEVICES=all"},
			args:     []string{"sh", "-c", "ls -1 /dev; echo ---"},
			config:   "accept-env-unprivileged = false",
			privileg: priv,
		})
		out, stderr, err := c.run()
		if err != nil {
			t.Fatalf("privileged=%v: %v\n%s", priv, err, stderr)
		}
		got := devNodes(out)
		if !priv && len(got) != 0 {
			t.Errorf("unprivileged container got GPUs by env: %q", got)
		}
		if priv && len(got) == 0 {
			t.Errorf("privileged container got no GPUs")
		}
	}
}

func TestConcurrentCreates(t *testing.T) {
	const n = 50
	cs := make([]*container, n)
	for i := range cs {
		cs[i] = newContainer(t, opts{
			env:  []string{fmt.Sprintf("NVIDIA_VISIBLE_DEVICES=%d", i%8)},
			args: []string{"sh", "-c", "ls -1 /dev | grep -c '^nvidia[0-9]'; probe"},
		})
	}
	// All share one cache directory, the way one host's containers do.
	shared := filepath.Join(t.TempDir(), "cache")
	for _, c := range cs {
		b, _ := os.ReadFile(c.config)
		s := regexp.MustCompile(`cache-dir = ".*"`).ReplaceAllString(string(b), fmt.Sprintf("cache-dir = %q", shared))
		if err := os.WriteFile(c.config, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]string, n)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, stderr, err := c.runtime("run", "--bundle", c.bundle, c.id)
			c.runtime("delete", "--force", c.id)
			if err != nil || !strings.HasPrefix(out, "1\ncuda=") {
				errs[i] = fmt.Sprintf("container %d: %v\n%s\n%s", i, err, out, stderr)
			}
		}()
	}
	wg.Wait()
	for _, e := range errs {
		if e != "" {
			t.Error(e)
		}
	}
}

// The inventory cache is used on the second create and dropped when the
// driver version changes.
func TestInventoryCache(t *testing.T) {
	f := need(t)
	drv, err := fakedriver.Build(filepath.Join(t.TempDir(), "driver"), fakedriver.Options{GPUs: 2, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	sources := func(c *container) []string {
		b, _ := os.ReadFile(filepath.Join(filepath.Dir(c.config), "gantry.log"))
		var out []string
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil {
				out = append(out, fmt.Sprint(rec["inventory"]))
			}
		}
		return out
	}
	c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"probe"}})
	cfg, _ := os.ReadFile(c.config)
	cfg = []byte(strings.Replace(string(cfg), fmt.Sprintf("driver-root = %q", f.driver.Root), fmt.Sprintf("driver-root = %q", drv.Root), 1))
	if err := os.WriteFile(c.config, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	orig := c.configJSON()
	reset := func() {
		// The shim rewrote config.json (and marked it injected): each run
		// starts from the bundle as the engine wrote it.
		if err := os.WriteFile(filepath.Join(c.bundle, "config.json"), orig, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runOnce := func(want string) {
		t.Helper()
		reset()
		out, stderr, err := c.runtime("run", "--bundle", c.bundle, c.id)
		c.runtime("delete", "--force", c.id)
		if err != nil || !strings.Contains(out, "cuda=") {
			t.Fatalf("%v\n%s\n%s", err, out, stderr)
		}
		if s := sources(c); s[len(s)-1] != want {
			t.Fatalf("inventory sources %q: want the last to be %s", s, want)
		}
	}
	runOnce("discovery")
	runOnce("cache")
	// A driver upgrade: the version file changes.
	vf := filepath.Join(drv.Root, "proc/driver/nvidia/version")
	b, err := os.ReadFile(vf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(vf, []byte(strings.ReplaceAll(string(b), drv.Version, "999.1.2")), 0o444); err != nil {
		t.Fatal(err)
	}
	// The fake libraries still carry the old version in their names, so
	// discovery under the new version finds no libcuda: the shim must
	// rediscover (and refuse), not serve the stale cache.
	reset()
	_, stderr, err := c.runtime("run", "--bundle", c.bundle, c.id)
	c.runtime("delete", "--force", c.id)
	if err == nil {
		t.Fatalf("stale cache used after a driver version change")
	}
	if !strings.Contains(stderr, "libcuda") && !strings.Contains(stderr, "missing") {
		t.Errorf("want an error about the incomplete driver, got %s", stderr)
	}
}

// A create whose root filesystem cannot take the driver's files (the
// image's /etc is a file: no loader cache can be written) fails with the
// error, and leaves config.json as it was, with nothing beside it: the new
// config.json, written while the root filesystem was being changed, is
// never put in place.
func TestRootfsFailureLeavesSpec(t *testing.T) {
	for _, server := range []bool{false, true} {
		t.Run(fmt.Sprintf("server=%v", server), func(t *testing.T) {
			f := need(t)
			c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=1"}, args: []string{"true"}, mutate: func(root string) {
				if err := os.RemoveAll(filepath.Join(root, "etc")); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, "etc"), []byte("not a directory\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}})
			if server {
				c.server, _, _ = startServer(t, f.runtime)
			}
			before := c.configJSON()
			_, stderr, err := c.runtime("create", "--bundle", c.bundle, c.id)
			if err == nil {
				c.runtime("delete", "--force", c.id)
				t.Fatal("a container whose /etc is a file was created")
			}
			if !strings.Contains(stderr, "etc") {
				t.Errorf("want the error naming etc, got:\n%s", stderr)
			}
			if string(c.configJSON()) != string(before) {
				t.Errorf("config.json changed by a failed create")
			}
			entries, _ := os.ReadDir(c.bundle)
			for _, e := range entries {
				if e.Name() != "config.json" && e.Name() != "rootfs" && !strings.HasPrefix(e.Name(), ".gantry") {
					t.Errorf("left in the bundle: %s", e.Name())
				}
			}
		})
	}
}
