package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/doctor"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// The device node fixes doctor prints under a driver root other than /
// make the nodes in that root, and work: nodes are deleted from a fake
// driver root, doctor (--driver-root) names the nvidia-ctk and mknod
// commands for that root, the test runs them as printed (nvidia-ctk
// through this CLI, mknod the real program), and doctor then passes. The
// host's /dev and /proc/devices (which has no NVIDIA majors here) are
// never used: create-device-nodes reads the root's proc/devices.
func TestDoctorDeviceNodeFixesWork(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot build the fake driver root")
	}
	mknod, err := exec.LookPath("mknod")
	if err != nil {
		t.Skip("no mknod program")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "driver")
	res, err := fakedriver.Build(root, fakedriver.Options{GPUs: 8, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.RealDeviceNodes {
		t.Skip("the fake driver's device nodes are regular files")
	}
	writeFileT(t, filepath.Join(root, "proc/devices"), "Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n")
	for _, n := range []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia3"} {
		if err := os.Remove(filepath.Join(root, "dev", n)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", filepath.Join(dir, "bin")) // no host tool is found by doctor
	cfgFile := filepath.Join(dir, "config.toml")
	writeFileT(t, cfgFile, "[cdi]\nspec-dirs = [\""+filepath.Join(dir, "cdi")+"\"]\n")
	hostArgs := hermeticDoctor(t, filepath.Join(dir, "host"))
	doctorRun := func() map[string]doctor.Check {
		t.Helper()
		out, errOut, code := run(append([]string{"--config", cfgFile, "--gpus", "sim:h100x8", "--driver-root", root, "doctor", "--json",
			"--proc", filepath.Join(dir, "proc"), "--docker-config", filepath.Join(dir, "none.json"),
			"--docker-socket", filepath.Join(dir, "none.sock"), "--containerd-config", filepath.Join(dir, "none.toml"),
			"--crio-dropins", filepath.Join(dir, "none.d")}, hostArgs...)...)
		if code != 0 && code != 1 {
			t.Fatalf("doctor: exit %d: %s", code, errOut)
		}
		var checks []doctor.Check
		if err := json.Unmarshal([]byte(out), &checks); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		m := map[string]doctor.Check{}
		for _, c := range checks {
			m[c.Name] = c
		}
		return m
	}
	got := doctorRun()
	nodes, gpu := got[doctor.CheckDeviceNodes], got[doctor.CheckGPUNodes]
	if nodes.Status != doctor.Fail || gpu.Status != doctor.Fail {
		t.Fatalf("nodes deleted: %+v\n%+v", nodes, gpu)
	}
	t.Logf("fix: %s\nfix: %s", nodes.Fix, gpu.Fix)
	ctkCmd := regexp.MustCompile(`nvidia-ctk (system create-device-nodes --control-devices --driver-root \S+ --dev-root \S+)`).FindStringSubmatch(nodes.Fix)
	if ctkCmd == nil || !strings.Contains(ctkCmd[1], "--driver-root "+root+" --dev-root "+root) {
		t.Fatalf("the device nodes fix names no create-device-nodes for the root %s: %s", root, nodes.Fix)
	}
	mknods := regexp.MustCompile(`mknod -m 666 (\S+) c 195 (\d+)`).FindAllStringSubmatch(gpu.Fix, -1)
	if len(mknods) != 1 || mknods[0][1] != filepath.Join(root, "dev/nvidia3") || mknods[0][2] != "3" {
		t.Fatalf("the gpu device nodes fix: %s", gpu.Fix)
	}
	if strings.Contains(nodes.Fix+gpu.Fix, "nvidia-modprobe") {
		t.Errorf("a fix makes host /dev nodes (nvidia-modprobe) for a dev root %s", root)
	}

	// Run the fixes as printed.
	if _, errOut, code := ctk(strings.Fields(ctkCmd[1])...); code != 0 {
		t.Fatalf("nvidia-ctk %s: exit %d: %s", ctkCmd[1], code, errOut)
	}
	for _, m := range mknods {
		if out, err := exec.Command(mknod, strings.Fields(m[0])[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", m[0], err, out)
		}
	}
	got = doctorRun()
	for _, n := range []string{doctor.CheckDeviceNodes, doctor.CheckGPUNodes} {
		if c := got[n]; c.Status != doctor.Pass {
			t.Errorf("after the printed fix: %+v", c)
		}
	}
}
