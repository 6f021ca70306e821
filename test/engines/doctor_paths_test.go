//go:build linux

package engines

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

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
	if c := one(t, doctorAt(t, f, a.sock), doctor.CheckHook); c.Status != doctor.Pass || !strings.Contains(c.Evidence, filepath.Join(f.binDir, "nvidia-container-runtime-hook")) {
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
			t.Logf("docker run --runtime %s fails: %s", rt, lastLine(out))
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

// TestDoctorContainerdBinaryOffPath: containerd's CRI runtime "nvidia"
// names its runc binary by a bare name, nvidia-container-runtime, that is
// on doctor's PATH but not on containerd's (a containerd started by
// systemd has the default service PATH). Pods under it fail; doctor,
// asking the running containerd over --cri-socket and judging with that
// containerd's PATH from /proc/PID/environ, fails it with the absolute
// path to register; with that in the config and containerd restarted,
// the pod runs.
func TestDoctorContainerdBinaryOffPath(t *testing.T) {
	f := need(t)
	dir := t.TempDir()
	e := startCRIWith(t, restrictedEnv(t, f, filepath.Join(dir, "tools")), "nvidia-container-runtime")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := e.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{RuntimeHandler: "nvidia", Config: &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "offpath", Namespace: "default", Uid: fmt.Sprintf("uid-offpath-%d", os.Getpid())},
		LogDirectory: t.TempDir(),
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent:    fmt.Sprintf("/gantry-cri-test-%d/offpath", os.Getpid()),
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}},
		},
	}})
	t.Cleanup(func() { removeCgroupDirs(fmt.Sprintf("/gantry-cri-test-%d/offpath", os.Getpid())) })
	if err == nil {
		_, _ = e.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.GetPodSandboxId()})
		_, _ = e.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.GetPodSandboxId()})
		t.Fatalf("a pod under runtime nvidia ran although containerd's PATH lacks nvidia-container-runtime")
	}
	t.Logf("RunPodSandbox under nvidia: %v", err)
	diagnose := func() doctor.Check {
		t.Helper()
		return one(t, runDoctor(t, f, f.daemonEnv(), "--cri-socket", e.sock, "--kubelet-dir", filepath.Join(dir, "no-kubelet"),
			"--containerd-config", filepath.Join(dir, "none.toml"), "--docker-config", filepath.Join(dir, "none.json")), doctor.CheckContainerd)
	}
	c := diagnose()
	for _, want := range []string{`runtime "nvidia" runs nvidia-container-runtime`, "not on the engine's PATH", "containerd's PATH from /proc/",
		"doctor's own PATH has it as " + f.nvRuntime} {
		if !strings.Contains(c.Evidence, want) {
			t.Errorf("evidence lacks %q", want)
		}
	}
	if c.Status != doctor.Fail || !strings.Contains(c.Fix, "its path "+f.nvRuntime) || !strings.Contains(c.Fix, "systemctl restart containerd") {
		t.Fatalf("containerd config: %+v", c)
	}
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
	config := filepath.Join(e.dir, "containerd", "config.toml")
	b, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	fixed := strings.Replace(string(b), `BinaryName = "nvidia-container-runtime"`, fmt.Sprintf("BinaryName = %q", f.nvRuntime), 1)
	if fixed == string(b) {
		t.Fatalf("no bare BinaryName in %s", config)
	}
	if err := os.WriteFile(config, []byte(fixed), 0o644); err != nil {
		t.Fatal(err)
	}
	e.restart(t)
	e.runPod(t, "default", "onpath", "nvidia", map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"})
	if c := diagnose(); c.Status != doctor.Pass {
		t.Fatalf("containerd config after the fix: %+v", c)
	}
}
