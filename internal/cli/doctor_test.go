package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/doctor"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// hermeticDoctor points every host path doctor reads and the tests do not
// name themselves into dir, where nothing is: the kubelet's directory, the
// create server's socket, Podman's storage, CRI-O's main file, runc's and
// containerd's state, containerd's root, and the CRI sockets doctor looks for a running
// containerd or CRI-O at. A host where a kubelet runs or Gantry or NVIDIA's
// toolkit is installed then gets the same verdicts as one with neither
// (scripts/hermetic-check.sh runs these tests on both). It returns the flags.
func hermeticDoctor(t *testing.T, dir string) []string {
	t.Helper()
	saved := criSockets
	criSockets = []string{filepath.Join(dir, "containerd.sock"), filepath.Join(dir, "crio.sock")}
	t.Cleanup(func() { criSockets = saved })
	return []string{
		"--kubelet-dir", filepath.Join(dir, "kubelet"),
		"--create-server-socket", filepath.Join(dir, "runtime.sock"),
		"--podman-storage", filepath.Join(dir, "containers/storage"),
		"--crio-config", filepath.Join(dir, "crio.conf"),
		"--runc-root", filepath.Join(dir, "runc"),
		"--containerd-state", filepath.Join(dir, "containerd-state"),
		"--containerd-root", filepath.Join(dir, "containerd-root"),
	}
}

func TestDoctor(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot build the fake driver root (make deps installs it)")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "driver")
	res, err := fakedriver.Build(root, fakedriver.Options{GPUs: 8, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.RealDeviceNodes {
		t.Skip("not root: the fake driver's device nodes are regular files")
	}
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "bin")
	write(filepath.Join(root, "proc/devices"), "Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n")
	write(filepath.Join(bin, "gantry-runtime"), "#!/bin/sh\n")
	write(filepath.Join(bin, "nvidia-container-runtime-hook"), "#!/bin/sh\n")
	t.Setenv("PATH", bin)
	cfgFile := filepath.Join(dir, "config.toml")
	write(cfgFile, "[cdi]\nspec-dirs = [\""+filepath.Join(dir, "cdi")+"\"]\n[runtime]\ncache-dir = \""+filepath.Join(dir, "cache")+"\"\n")
	daemon := filepath.Join(dir, "daemon.json")
	write(daemon, `{"runtimes": {"nvidia": {"path": "`+filepath.Join(bin, "gantry-runtime")+`"}}}`)
	// dockerd's environment, where doctor looks the hook up.
	proc := filepath.Join(dir, "proc")
	write(filepath.Join(proc, "100/comm"), "dockerd\n")
	write(filepath.Join(proc, "100/environ"), "PATH="+bin+"\x00")
	args := []string{"--config", cfgFile, "--gpus", "sim:h100x8", "--driver-root", root, "doctor",
		"--proc", proc, "--docker-config", daemon, "--docker-socket", filepath.Join(dir, "no-docker.sock"),
		"--containerd-config", filepath.Join(dir, "none.toml"),
		"--crio-dropins", filepath.Join(dir, "none.d")}
	args = append(args, hermeticDoctor(t, filepath.Join(dir, "host"))...)

	out, errOut, code := run(args...)
	if code != 0 {
		t.Fatalf("healthy host: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"PASS kernel driver: NVIDIA kernel module " + fakedriver.DefaultVersion, "SKIP nvml: ", "PASS driver files: ", "PASS docker config: "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// No GPU runtime but the hook works: --gpus users are healthy (INFO, exit 0).
	write(daemon, `{"log-driver": "json-file"}`)
	out, _, code = run(args...)
	if code != 0 || !strings.Contains(out, "INFO docker config: ") {
		t.Fatalf("daemon.json without the runtime, hook usable: exit %d, want 0\n%s", code, out)
	}
	// Neither the runtime nor the hook: Docker is not used for GPUs here
	// (INFO, exit 0, with the command that sets it up).
	if err := os.Remove(filepath.Join(bin, "nvidia-container-runtime-hook")); err != nil {
		t.Fatal(err)
	}
	out, _, code = run(args...)
	if code != 0 || !strings.Contains(out, "INFO docker config: Docker is not set up for GPU containers") {
		t.Fatalf("Docker set up for no GPU path: exit %d, want 0 with INFO\n%s", code, out)
	}
	// A GPU runtime whose program is gone: a failure on the path in use.
	write(daemon, `{"runtimes": {"nvidia": {"path": "/nonexistent/nvidia-container-runtime"}}}`)
	out, _, code = run(append(args, "--json")...)
	if code != 1 {
		t.Fatalf("daemon.json without the runtime: exit %d, want 1\n%s", code, out)
	}
	var checks []doctor.Check
	if err := json.Unmarshal([]byte(out), &checks); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	var docker *doctor.Check
	for i := range checks {
		if checks[i].Name == doctor.CheckDocker {
			docker = &checks[i]
		}
	}
	if docker == nil || docker.Status != doctor.Fail || docker.OK || !strings.Contains(docker.Fix, "gantry runtime configure --runtime docker") {
		t.Fatalf("docker check = %+v\n%s", docker, out)
	}

	out, _, code = run(args...) // text output, same failure
	if code != 1 || !strings.Contains(out, "FAIL docker config: ") || !strings.Contains(out, "     fix: install gantry-runtime there, or re-register it: gantry runtime configure --runtime docker") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}

	// 2: doctor itself could not run, never to be confused with 1.
	if _, _, code := run("doctor", "extra"); code != 2 {
		t.Errorf("doctor extra: exit %d, want 2", code)
	}
	if _, _, code := run("doctor", "--no-such-flag"); code != 2 {
		t.Errorf("doctor --no-such-flag: exit %d, want 2", code)
	}
	bad := filepath.Join(dir, "bad.toml")
	write(bad, "[cdi\n")
	if _, errOut, code := run("--config", bad, "doctor"); code != 2 || !strings.Contains(errOut, "bad.toml") {
		t.Errorf("doctor with an unreadable configuration: exit %d, want 2\n%s", code, errOut)
	}
	if _, _, code := run("--config", bad, "info"); code != 1 {
		t.Errorf("other commands keep exit 1 for their own errors: info exit %d", code)
	}
}

// TestDoctorHelpListsChecks: gantry doctor --help lists the checks from
// doctor.Checks, in order, with their summaries.
func TestDoctorHelpListsChecks(t *testing.T) {
	out, errOut, code := run("doctor", "--help")
	if code != 0 {
		t.Fatalf("doctor --help: exit %d\n%s%s", code, out, errOut)
	}
	rest := out + errOut
	for _, c := range doctor.Checks {
		i := strings.Index(rest, c.Name)
		if i < 0 || !strings.Contains(rest[i:], c.Summary) {
			t.Fatalf("doctor --help does not list %q (%s) in order:\n%s", c.Name, c.Summary, out+errOut)
		}
		rest = rest[i+len(c.Name):]
	}
}
