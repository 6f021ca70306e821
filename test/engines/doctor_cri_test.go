//go:build linux

package engines

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/doctor"
)

// TestDoctorCRIPluginFailed: a real containerd whose CRI plugin did not
// load, because its configuration names default_runtime_name "runc" and
// registers only nvidia (what configure tools wrote on Debian's stock
// file: containerd 1.6 then drops its built-in runc). The socket answers
// containerd's own services but not CRI: a Kubernetes node without a
// container runtime. doctor, given the socket with --cri-socket, FAILs the
// containerd check quoting the plugin's error; the fix (register runc,
// restart containerd) is then done and doctor passes. The same socket of
// a containerd with CRI disabled is a FAIL too when --cri-socket names it.
func TestDoctorCRIPluginFailed(t *testing.T) {
	f := need(t)
	if why := containerdSkip(); why != "" {
		t.Skip(why)
	}
	hostDirsCleanup(t)
	dir := t.TempDir()
	cdir := filepath.Join(dir, "containerd")
	for _, d := range []string{cdir, filepath.Join(dir, "cni", "bin"), filepath.Join(dir, "cni", "conf"), filepath.Join(dir, "kubelet")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(cdir, "containerd.sock")
	config := filepath.Join(cdir, "config.toml")
	good := fmt.Sprintf(containerdCRIConfig, filepath.Join(cdir, "root"), filepath.Join(cdir, "state"), sock, sock+".ttrpc",
		filepath.Join(cdir, "opt"), pauseImage, "native", filepath.Join(dir, "runc"),
		f.nvRuntime, filepath.Join(dir, "runc"), filepath.Join(dir, "cni", "bin"), filepath.Join(dir, "cni", "conf"))
	runcTable := fmt.Sprintf(`    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %q
`, filepath.Join(dir, "runc"))
	if !strings.Contains(good, runcTable) {
		t.Fatalf("the CRI config has no runc table to remove:\n%s", good)
	}
	broken := strings.Replace(good, runcTable, "", 1)
	runConfig := filepath.Join(cdir, "run.toml")
	if err := os.WriteFile(runConfig, []byte(fmt.Sprintf(containerdCRIRunConfig, config)), 0o644); err != nil {
		t.Fatal(err)
	}
	env := f.daemonEnv()
	start := func(cfg string) *daemon {
		t.Helper()
		if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		d := startDaemon(t, "containerd", filepath.Join(cdir, "containerd.log"), cdir, env, "containerd", "--config", runConfig)
		d.waitReady(t, func() error {
			_, err := command(env, "ctr", "--address", sock, "version")
			return err
		})
		return d
	}
	plugins := func() string {
		out, _ := command(env, "ctr", "--address", sock, "plugins", "ls")
		return out
	}
	check := func() doctor.Check {
		t.Helper()
		return one(t, runDoctor(t, f, env, "--cri-socket", sock, "--containerd-config", config,
			"--kubelet-dir", filepath.Join(dir, "kubelet"), "--docker-socket", filepath.Join(dir, "none.sock"),
			"--create-server-socket", filepath.Join(dir, "none.sock")), doctor.CheckContainerd)
	}

	d := start(broken)
	if p := plugins(); !strings.Contains(p, "cri") || !strings.Contains(p, "error") {
		t.Fatalf("the CRI plugin loaded with no runc runtime (this containerd does not have the fault):\n%s", p)
	}
	c := check()
	if c.Status != doctor.Fail || !strings.Contains(c.Evidence, "CRI plugin") || !strings.Contains(c.Evidence, "failed to load") ||
		!strings.Contains(c.Evidence, "runc") || !strings.Contains(c.Fix, "systemctl restart containerd") {
		t.Fatalf("CRI plugin failed to load: %+v\nctr plugins ls:\n%s", c, plugins())
	}
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)

	// The fix: default_runtime_name's runtime registered, containerd
	// restarted.
	d.stop(t)
	start(good)
	if p := plugins(); strings.Contains(p, "error") {
		t.Fatalf("after the fix:\n%s", p)
	}
	if c := check(); c.Status != doctor.Pass || !strings.Contains(c.Evidence, sock) {
		t.Fatalf("after the fix: %+v", c)
	}
}

// A containerd with CRI disabled, named by --cri-socket: no CRI there.
func TestDoctorCRIDisabled(t *testing.T) {
	f := need(t)
	if why := containerdSkip(); why != "" {
		t.Skip(why)
	}
	hostDirsCleanup(t)
	dir := t.TempDir()
	_, sock := startContainerdDaemon(t, f, filepath.Join(dir, "containerd"), nil)
	c := one(t, runDoctor(t, f, f.daemonEnv(), "--cri-socket", sock, "--containerd-config", filepath.Join(dir, "containerd", "config.toml"),
		"--kubelet-dir", filepath.Join(dir, "kubelet"), "--docker-socket", filepath.Join(dir, "none.sock"),
		"--create-server-socket", filepath.Join(dir, "none.sock")), doctor.CheckContainerd)
	if c.Status != doctor.Fail || !strings.Contains(c.Evidence, "no CRI plugin") || !strings.Contains(c.Fix, "disabled_plugins") {
		t.Fatalf("CRI disabled, --cri-socket names it: %+v", c)
	}
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
}
