//go:build linux

package engines

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/doctor"
)

// restrictedEnv is f.daemonEnv with PATH only dirs: what a daemon started
// by systemd has, without the directory Gantry's names are in. The host's
// own bin directories are not on it (Gantry or NVIDIA's toolkit may be
// installed there): the programs the daemons run are linked into tools.
func restrictedEnv(t *testing.T, f *fixture, tools string, dirs ...string) []string {
	t.Helper()
	if err := os.MkdirAll(tools, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"containerd", "containerd-shim", "containerd-shim-runc-v1", "containerd-shim-runc-v2",
		"runc", "docker-init", "docker-proxy", "unpigz", "xz", "modprobe", "mount", "umount", "ctr"} {
		if p, err := exec.LookPath(name); err == nil {
			if err := os.Symlink(p, filepath.Join(tools, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	var env []string
	for _, kv := range f.daemonEnv() {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	return append(env, "PATH="+strings.Join(append(dirs, tools), ":"))
}

// doctorAt runs gantry doctor with doctor's own PATH the fixture's (Gantry's
// names on it) and DOCKER_HOST the given dockerd's socket.
func doctorAt(t *testing.T, f *fixture, sock string, args ...string) []doctor.Check {
	t.Helper()
	env := slices.Concat(f.daemonEnv(), []string{"DOCKER_HOST=unix://" + sock})
	return runDoctor(t, f, env, append([]string{"--kubelet-dir", filepath.Join(f.dir, "no-kubelet")}, args...)...)
}

// lnFix is the ln -sf command of a printed fix.
var lnFix = regexp.MustCompile(`ln -sf (\S+) ([^\s,]+)`)

// TestDoctorTwoDockerdsAndDanglingHook runs two private dockerds: A, whose
// PATH has Gantry's hook, and B, whose PATH has only a dangling
// nvidia-container-runtime-hook link (the program it pointed at moved).
// Doctor judges the dockerd on the socket it is pointed at (DOCKER_HOST),
// not the first one in /proc: PASS for A, FAIL for B naming the dangling
// link, with an ln -sf fix; after the fix and the restart it names,
// docker run --gpus works on B.
func TestDoctorTwoDockerdsAndDanglingHook(t *testing.T) {
	a := startDocker(t)
	f := a.f
	hookDir := filepath.Join(t.TempDir(), "hookbin")
	if err := os.MkdirAll(hookDir, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(hookDir, "nvidia-container-runtime-hook")
	moved := filepath.Join(filepath.Dir(hookDir), "old-prefix", "bin", "gantry-runtime")
	if err := os.Symlink(moved, link); err != nil {
		t.Fatal(err)
	}
	b := startDockerEnv(t, restrictedEnv(t, f, filepath.Join(filepath.Dir(hookDir), "tools"), hookDir))

	// The fault is real: B has no --gpus driver.
	if out, err := b.run("--gpus", "all"); err == nil || !strings.Contains(out, "could not select device driver") {
		t.Fatalf("docker run --gpus on B with a dangling hook: %v\n%s", err, out)
	}
	if c := one(t, doctorAt(t, f, a.sock), doctor.CheckHook); c.Status != doctor.Pass || !strings.Contains(c.Evidence, "pid") && !strings.Contains(c.Evidence, f.binDir) {
		t.Fatalf("pointed at A: %+v", c)
	}
	c := one(t, doctorAt(t, f, b.sock), doctor.CheckHook)
	if c.Status != doctor.Fail || !strings.Contains(c.Evidence, link+" is a dangling symbolic link") || !strings.Contains(c.Evidence, moved) {
		t.Fatalf("pointed at B: %+v", c)
	}
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
	m := lnFix.FindStringSubmatch(c.Fix)
	if m == nil || m[2] != link || !strings.Contains(c.Fix, "systemctl restart docker") {
		t.Fatalf("the fix is not ln -sf TARGET %s and a restart: %q", link, c.Fix)
	}
	// The fix, as printed; then the restart it names.
	if out, err := exec.Command("ln", "-sf", m[1], m[2]).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	b.restart(t)
	if out, err := b.run("--gpus", "all"); err != nil {
		t.Fatalf("docker run --gpus on B after the fix: %v\n%s\n%s", err, out, f.runtimeLogTail())
	}
	if c := one(t, doctorAt(t, f, b.sock), doctor.CheckHook); c.Status != doctor.Pass || !strings.Contains(c.Evidence, link) {
		t.Fatalf("pointed at B after the fix: %+v", c)
	}
}

// TestDoctorRuntimeOnEnginePath: daemon.json registers runtimes whose
// programs dockerd cannot run although doctor can: one by a bare name
// found on doctor's PATH but not on dockerd's (nor its containerd's), one
// a file without an execute bit. Both fail as docker run --runtime shows;
// doctor, judging with dockerd's PATH from /proc/PID/environ and the
// file's mode, fails them with fixes that, applied, make both runtimes
// run containers.
func TestDoctorRuntimeOnEnginePath(t *testing.T) {
	f := need(t)
	dir := t.TempDir()
	e := startDockerEnv(t, restrictedEnv(t, f, filepath.Join(dir, "tools")))
	noexec := filepath.Join(dir, "noexec", "gantry-runtime")
	if err := os.MkdirAll(filepath.Dir(noexec), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(f.gantry, noexec, 0o644); err != nil {
		t.Fatal(err)
	}
	daemonJSON := filepath.Join(e.dir, "docker", "daemon.json")
	edit := func(runtimes map[string]any) {
		t.Helper()
		var doc map[string]any
		b, err := os.ReadFile(daemonJSON)
		if err == nil {
			err = json.Unmarshal(b, &doc)
		}
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range runtimes {
			doc["runtimes"].(map[string]any)[k] = map[string]any{"path": v}
		}
		b, _ = json.Marshal(doc)
		if err := os.WriteFile(daemonJSON, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Only the two broken runtimes are GPU runtimes for doctor to judge.
	edit(map[string]any{"bare": "nvidia-container-runtime", "noexec": noexec})
	var doc map[string]any
	b, _ := os.ReadFile(daemonJSON)
	_ = json.Unmarshal(b, &doc)
	for name := range doc["runtimes"].(map[string]any) {
		if name != "bare" && name != "noexec" {
			delete(doc["runtimes"].(map[string]any), name)
		}
	}
	b, _ = json.Marshal(doc)
	if err := os.WriteFile(daemonJSON, b, 0o644); err != nil {
		t.Fatal(err)
	}
	e.restart(t)
	for _, rt := range []string{"bare", "noexec"} {
		if out, err := e.run("--runtime", rt, "-e", "NVIDIA_VISIBLE_DEVICES=all"); err == nil {
			t.Fatalf("docker run --runtime %s succeeded before the fix:\n%s", rt, out)
		} else {
			t.Logf("docker run --runtime %s: %v (%s)", rt, err, lastLine(out))
		}
	}
	c := one(t, doctorAt(t, f, e.sock, "--docker-config", daemonJSON), doctor.CheckDocker)
	bareAbs := f.nvRuntime
	for _, want := range []string{`runtime "bare" runs nvidia-container-runtime`, "not on the engine's PATH", "dockerd's PATH from /proc/",
		"doctor's own PATH has it as " + bareAbs, `runtime "noexec" runs ` + noexec, "not executable"} {
		if !strings.Contains(c.Evidence, want) {
			t.Errorf("evidence lacks %q", want)
		}
	}
	if c.Status != doctor.Fail || !strings.Contains(c.Fix, "chmod 755 "+noexec) || !strings.Contains(c.Fix, "its path "+bareAbs) ||
		!strings.Contains(c.Fix, "systemctl restart docker") {
		t.Fatalf("docker config: %+v", c)
	}
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
	// The fixes: chmod, the absolute path, the restart.
	if err := os.Chmod(noexec, 0o755); err != nil {
		t.Fatal(err)
	}
	edit(map[string]any{"bare": bareAbs})
	e.restart(t)
	for _, rt := range []string{"bare", "noexec"} {
		if out, err := e.run("--runtime", rt, "-e", "NVIDIA_VISIBLE_DEVICES=all"); err != nil {
			t.Fatalf("docker run --runtime %s after the fix: %v\n%s\n%s", rt, err, out, f.runtimeLogTail())
		}
	}
	if c := one(t, doctorAt(t, f, e.sock, "--docker-config", daemonJSON), doctor.CheckDocker); c.Status != doctor.Pass {
		t.Fatalf("docker config after the fix: %+v", c)
	}
}

// lastLine is the last line of s that says "error", else its last line.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(strings.ToLower(lines[i]), "error") {
			return lines[i]
		}
	}
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
