//go:build linux

package engines

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/doctor"
)

// TestDoctorContainer runs `gantry doctor --container` against real Docker
// containers: one that got the GPU from gantry-runtime, the same one after
// its device cgroup rule for /dev/nvidiactl is taken away (what systemd's
// daemon-reload does to hook-injected devices), and one with the node
// bind-mounted but never allowed.
func TestDoctorContainer(t *testing.T) {
	e := startDocker(t)
	f := e.f
	start := func(opts ...string) string {
		t.Helper()
		args := []string{"run", "-d", "--network", "none"}
		if apparmorUnusable() {
			args = append(args, "--security-opt", "apparmor=unconfined")
		}
		args = append(append(args, opts...), dockerImage, "busybox", "sleep", "600")
		out, err := e.docker(args...)
		if err != nil {
			t.Fatalf("%v\n%s\n%s", err, out, f.runtimeLogTail())
		}
		id := strings.TrimSpace(out)
		if i := strings.LastIndexByte(id, '\n'); i >= 0 {
			id = id[i+1:]
		}
		t.Cleanup(func() { e.docker("rm", "-f", id) })
		return id
	}
	diagnose := func(id string) map[string]doctor.Check {
		t.Helper()
		cmd := exec.Command(f.gantry, "doctor", "--json", "--container", id)
		cmd.Env = e.cli
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); err != nil && (!ok || ee.ExitCode() != 1) {
			t.Fatalf("gantry doctor: %v\n%s", err, stderr.String())
		}
		var checks []doctor.Check
		if err := json.Unmarshal(stdout.Bytes(), &checks); err != nil {
			t.Fatalf("gantry doctor --json: %v\n%s%s", err, stdout.String(), stderr.String())
		}
		m := map[string]doctor.Check{}
		for _, c := range checks {
			m[c.Name] = c
		}
		return m
	}
	const cgroupBroken = "Failed to initialize NVML: Unknown Error"

	id := start("--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=all")
	got := diagnose(id)
	if c := got[doctor.CheckContainer]; c.Status != doctor.Pass || !strings.Contains(c.Evidence, "runtime nvidia") ||
		!strings.Contains(c.Evidence, "NVIDIA_VISIBLE_DEVICES=all") {
		t.Errorf("container request: %+v", c)
	}
	// The probe opens the fake driver root's 195:255 node from inside the
	// container's cgroup: ENXIO on a host without a GPU (allowed, no driver
	// behind it), success with one; either passes.
	if c := got[doctor.CheckContainerDevice]; c.Status != doctor.Pass || strings.Contains(c.Evidence, cgroupBroken) {
		t.Fatalf("healthy container: %+v", c)
	} else {
		t.Logf("healthy container: %s %s", c.Status, c.Evidence)
	}

	t.Run("RuleRemoved", func(t *testing.T) {
		deny := devicesDenyFile(t, e, id)
		if err := os.WriteFile(deny, []byte("c 195:255 rwm"), 0); err != nil {
			t.Fatalf("removing the container's rule: %v", err)
		}
		c := diagnose(id)[doctor.CheckContainerDevice]
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, cgroupBroken) ||
			!strings.Contains(c.Evidence, "daemon-reload") || !strings.Contains(c.Fix, "docker restart "+id) {
			t.Fatalf("after the rule was removed: %+v", c)
		}
		if strings.Contains(c.Evidence, "c 195:255 rwm") {
			t.Errorf("devices.list still shows the removed rule: %s", c.Evidence)
		}
		// CDI (--device nvidia.com/gpu) is advised only to a dockerd that
		// has it; Debian's 20.10 has not.
		if strings.Contains(c.Fix, "nvidia.com/gpu") != dockerHasCDI(t, e) {
			t.Errorf("CDI advice does not follow the dockerd (CDI %v): %s", dockerHasCDI(t, e), c.Fix)
		}
		t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
		// The fix works: a restart rebuilds the cgroup from the container's config.
		if out, err := e.docker("restart", "-t", "0", id); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if c := diagnose(id)[doctor.CheckContainerDevice]; strings.Contains(c.Evidence, cgroupBroken) {
			t.Fatalf("still broken after docker restart: %+v", c)
		}
	})

	// NVIDIA_VISIBLE_DEVICES void, none or empty under --runtime nvidia
	// asks for no GPU device: INFO, never the daemon-reload cgroup FAIL
	// with its docker restart fix (the container has no rule to lose).
	t.Run("NothingRequested", func(t *testing.T) {
		for _, v := range []string{"void", "none", "", " VOID"} {
			id := start("--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES="+v)
			got := diagnose(id)
			for _, name := range []string{doctor.CheckContainer, doctor.CheckContainerDevice} {
				if c := got[name]; c.Status != doctor.Info || !strings.Contains(c.Evidence, "no GPU requested") {
					t.Errorf("NVIDIA_VISIBLE_DEVICES=%q: %s: %+v", v, name, c)
				}
			}
			for _, c := range got {
				if c.Status == doctor.Fail && (strings.Contains(c.Evidence, cgroupBroken) || strings.Contains(c.Fix, "docker restart")) {
					t.Errorf("NVIDIA_VISIBLE_DEVICES=%q: %+v", v, c)
				}
			}
		}
	})

	// Asked under plain runc: the fix names Docker's GPU paths, and CDI
	// only where the dockerd has it (Debian's 20.10 has not).
	t.Run("AskedUnderRunc", func(t *testing.T) {
		id := start("-e", "NVIDIA_VISIBLE_DEVICES=all")
		c := diagnose(id)[doctor.CheckContainer]
		if c.Status != doctor.Fail || !strings.Contains(c.Fix, "--runtime nvidia") || strings.Contains(c.Fix, "nvidia.com/gpu") != dockerHasCDI(t, e) {
			t.Fatalf("runc container asking for GPUs (dockerd has CDI: %v): %+v", dockerHasCDI(t, e), c)
		}
		t.Logf("dockerd has CDI: %v; fix: %s", dockerHasCDI(t, e), c.Fix)
	})

	t.Run("NodeWithoutRule", func(t *testing.T) {
		id := start("-v", filepath.Join(f.driver.Root, "dev/nvidiactl")+":/dev/nvidiactl")
		got := diagnose(id)
		// It asked for no GPU: not a device-cgroup failure to restart.
		if c := got[doctor.CheckContainer]; c.Status != doctor.Info || !strings.Contains(c.Evidence, "no GPU requested") {
			t.Errorf("container request: %+v", c)
		}
		if c := got[doctor.CheckContainerDevice]; c.Status != doctor.Info || !strings.Contains(c.Evidence, "no GPU requested") {
			t.Errorf("container device access: %+v", c)
		}
	})
}

// dockerHasCDI reports whether the private dockerd reads CDI specs: its
// /info lists CDI spec dirs (Docker 25+ with the cdi feature).
func dockerHasCDI(t *testing.T, e *dockerEngine) bool {
	t.Helper()
	out, err := e.docker("info", "--format", "{{json .}}")
	if err != nil {
		t.Fatalf("docker info: %v\n%s", err, out)
	}
	var info struct{ CDISpecDirs []string }
	i := strings.IndexByte(out, '{') // after any warning line
	if i < 0 {
		t.Fatalf("docker info: no JSON:\n%s", out)
	}
	if err := json.NewDecoder(strings.NewReader(out[i:])).Decode(&info); err != nil {
		t.Fatalf("docker info: %v\n%s", err, out)
	}
	return len(info.CDISpecDirs) > 0
}

// devicesDenyFile is the cgroup v1 devices.deny of the container; it skips
// on cgroup v2, where the rules are a BPF program runc attached.
func devicesDenyFile(t *testing.T, e *dockerEngine, id string) string {
	t.Helper()
	out, err := e.docker("inspect", "-f", "{{.State.Pid}}", id)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	f, err := os.Open("/proc/" + strings.TrimSpace(out) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 && strings.Contains(","+parts[1]+",", ",devices,") {
			return filepath.Join("/sys/fs/cgroup/devices", parts[2], "devices.deny")
		}
	}
	t.Skip("cgroup v2: a single device rule cannot be removed from outside (it is a BPF program); NodeWithoutRule covers the same state")
	return ""
}

// TestDoctorDockerNotRestarted: daemon.json registers a runtime that the
// running dockerd does not have, because it was not restarted after the
// file changed. Docker then says "Unknown runtime specified"; doctor must
// ask the daemon (GET /info on its socket), not only read the file.
func TestDoctorDockerNotRestarted(t *testing.T) {
	e := startDocker(t)
	f := e.f
	daemonJSON := filepath.Join(e.dir, "docker", "daemon.json")
	dockerCheck := func() doctor.Check {
		t.Helper()
		cmd := exec.Command(f.gantry, "doctor", "--json", "--docker-config", daemonJSON)
		cmd.Env = e.cli // DOCKER_HOST names the private dockerd's socket
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); err != nil && (!ok || ee.ExitCode() != 1) {
			t.Fatalf("gantry doctor: %v\n%s", err, stderr.String())
		}
		var checks []doctor.Check
		if err := json.Unmarshal(stdout.Bytes(), &checks); err != nil {
			t.Fatalf("gantry doctor --json: %v\n%s%s", err, stdout.String(), stderr.String())
		}
		for _, c := range checks {
			if c.Name == doctor.CheckDocker {
				return c
			}
		}
		t.Fatalf("no %q check:\n%s", doctor.CheckDocker, stdout.String())
		return doctor.Check{}
	}
	if c := dockerCheck(); c.Status != doctor.Pass || !strings.Contains(c.Evidence, "the running dockerd") {
		t.Fatalf("file and daemon agree: %+v", c)
	}

	var doc map[string]any
	b, err := os.ReadFile(daemonJSON)
	if err == nil {
		err = json.Unmarshal(b, &doc)
	}
	if err != nil {
		t.Fatal(err)
	}
	doc["runtimes"].(map[string]any)["gantry-new"] = map[string]any{"path": f.runtime}
	b, _ = json.Marshal(doc)
	if err := os.WriteFile(daemonJSON, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// The daemon really does not know it.
	if out, err := e.docker("run", "--rm", "--runtime", "gantry-new", dockerImage, "true"); err == nil || !strings.Contains(out, "nknown runtime") {
		t.Fatalf("docker run --runtime gantry-new before a restart: %v\n%s", err, out)
	}
	c := dockerCheck()
	if c.Status != doctor.Fail || !strings.Contains(c.Evidence, `"gantry-new"`) || !strings.Contains(c.Evidence, "not restarted") ||
		!strings.Contains(c.Fix, "systemctl restart docker") {
		t.Fatalf("file changed, daemon not restarted: %+v", c)
	}
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
}
