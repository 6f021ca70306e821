//go:build linux

package engines

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// daemonSetContainer is what the static manifest's DaemonSet runs: the
// image and the command, the fields the image must answer to.
type daemonSetContainer struct {
	Image   string   `json:"image"`
	Command []string `json:"command"`
	Args    []string `json:"args"`
}

// manifestContainer reads the DaemonSet's container from the static
// manifest (the chart renders the same; deployments/manifests_test.go checks
// that they agree).
func manifestContainer(t *testing.T) daemonSetContainer {
	t.Helper()
	b, err := os.ReadFile("../../deployments/static/gantry-device-plugin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---") {
		var obj struct {
			Kind string `json:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []daemonSetContainer `json:"containers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("static manifest: %v", err)
		}
		if obj.Kind == "DaemonSet" && len(obj.Spec.Template.Spec.Containers) == 1 {
			return obj.Spec.Template.Spec.Containers[0]
		}
	}
	t.Fatal("no DaemonSet with one container in deployments/static/gantry-device-plugin.yaml")
	return daemonSetContainer{}
}

// TestImageOffline builds the image the DaemonSet runs with
// scripts/build-image.sh (no registry, no Docker), loads it into a private
// dockerd and a private containerd and runs its programs the way the
// DaemonSet does: the tag is the manifest's, the DaemonSet's command
// resolves in the image's PATH to its entrypoint, and the device plugin, the
// CLI and the runtime start with the image's own glibc and report the
// version the script stamped.
func TestImageOffline(t *testing.T) {
	for _, tool := range []string{"sha256sum", "ldd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed: scripts/build-image.sh needs it", tool)
		}
	}
	need(t)
	ds := manifestContainer(t)
	if len(ds.Command) == 0 {
		t.Fatalf("the DaemonSet's container has no command: %+v", ds)
	}

	const version = "image-test-1"
	archive := filepath.Join(t.TempDir(), "gantry-image.tar")
	build := exec.Command("../../scripts/build-image.sh", "-o", archive)
	build.Env = append(os.Environ(), "VERSION="+version)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("scripts/build-image.sh: %v\n%s", err, out)
	}
	t.Run("Docker", func(t *testing.T) { testImageDocker(t, ds, archive, version) })
	t.Run("Containerd", func(t *testing.T) { testImageContainerd(t, ds, archive, version) })
}

// testImageDocker loads the archive with docker load (its manifest.json)
// and checks the image's configuration and programs.
func testImageDocker(t *testing.T, ds daemonSetContainer, archive, version string) {
	e := startDocker(t)
	out, err := e.docker("load", "-i", archive)
	if err != nil {
		t.Fatalf("%v\n%s\ndockerd log:\n%s", err, out, tail(e.d.log, 3000))
	}
	// The default tag is the one the manifests pull.
	if !strings.Contains(out, "Loaded image: "+ds.Image) {
		t.Fatalf("docker load did not load %s (the DaemonSet's image):\n%s", ds.Image, out)
	}

	out, err = e.docker("image", "inspect", "--format", "{{json .Config}}", ds.Image)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var cfg struct {
		Entrypoint []string
		Cmd        []string
		Env        []string
		Labels     map[string]string
	}
	if err := json.Unmarshal([]byte(out), &cfg); err != nil {
		t.Fatalf("image config: %v\n%s", err, out)
	}
	// Kubernetes' command replaces the entrypoint; the image's entrypoint is
	// the same program, so `docker run IMAGE --help` runs what the DaemonSet
	// runs.
	if len(cfg.Entrypoint) != 1 || filepath.Base(cfg.Entrypoint[0]) != filepath.Base(ds.Command[0]) {
		t.Errorf("image entrypoint %q, want the DaemonSet's command %q", cfg.Entrypoint, ds.Command)
	}
	var path string
	for _, kv := range cfg.Env {
		if p, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = p
		}
	}
	if !slices.Contains(filepath.SplitList(path), filepath.Dir(cfg.Entrypoint[0])) {
		t.Errorf("image PATH %q does not hold %s: the DaemonSet's command %q would not be found", path, filepath.Dir(cfg.Entrypoint[0]), ds.Command[0])
	}
	// NVIDIA's device plugin image's variables (its Dockerfile, v0.20.0),
	// which NVIDIA's static DaemonSets rely on to get NVML from the nvidia
	// runtime; the Dockerfile sets the same.
	dockerfile, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility", "NVIDIA_DISABLE_REQUIRE=true"} {
		if !slices.Contains(cfg.Env, want) {
			t.Errorf("image env %q lacks %s", cfg.Env, want)
		}
		if !strings.Contains(string(dockerfile), want) {
			t.Errorf("the Dockerfile does not set %s as scripts/build-image.sh does", want)
		}
	}
	if cfg.Labels["org.opencontainers.image.version"] != version || cfg.Labels["org.opencontainers.image.source"] == "" {
		t.Errorf("image labels %v: want org.opencontainers.image.version=%s and a source", cfg.Labels, version)
	}

	run := func(entrypoint string, args ...string) (string, error) {
		a := []string{"run", "--rm", "--network", "none"}
		if apparmorUnusable() {
			a = append(a, "--security-opt", "apparmor=unconfined")
		}
		if entrypoint != "" {
			a = append(a, "--entrypoint", entrypoint)
		}
		return e.docker(append(append(a, ds.Image), args...)...)
	}
	checks := []struct {
		name       string
		entrypoint string // "" = the image's
		args       []string
		want       []string
	}{
		{"entrypoint help", "", []string{"--help"}, []string{"gantry-device-plugin", "--dry-run"}},
		// As the DaemonSet starts it: its command by name, through PATH,
		// here on simulated GPUs and without a kubelet.
		{"daemonset command", ds.Command[0], []string{"--gpus", "sim:h100x8", "--dry-run"}, []string{"nvidia.com/gpu"}},
		{"gantry version", "gantry", []string{"--version"}, []string{"gantry " + version}},
		{"gantry info", "gantry", []string{"--gpus", "sim:h100x8", "info"}, []string{"NVIDIA H100"}},
		// The DRA DaemonSet's command (deployments/static/gantry-dra-plugin.yaml).
		{"dra plugin", "gantry-dra-plugin", []string{"--gpus", "sim:h100x8", "--node-name", "n", "--dry-run"}, []string{"kind: ResourceSlice", "driver: gpu.nvidia.com"}},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			out, err := run(c.entrypoint, c.args...)
			if err != nil {
				t.Fatalf("docker run --entrypoint %q %s %v: %v\n%s", c.entrypoint, ds.Image, c.args, err, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("docker run --entrypoint %q %s %v: output lacks %q:\n%s", c.entrypoint, ds.Image, c.args, w, out)
				}
			}
		})
	}

	// gantry-runtime starts too; it then wants runc, which is the host's
	// and not in the image (installers copy gantry-runtime to the host).
	out, err = run("gantry-runtime", "--version")
	if err == nil || !strings.Contains(out, "gantry-runtime: low-level runtime") {
		t.Errorf("gantry-runtime in the image: %v, want it to start and ask for runc:\n%s", err, out)
	}

	// The image holds nothing that could run a program from elsewhere: no
	// shell, and only our binaries in its bin directory.
	if out, err := run("/bin/sh", "-c", "true"); err == nil {
		t.Errorf("the image has a shell:\n%s", out)
	}
	out, err = e.docker("create", ds.Image)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// The ID is the last line (dockerd may warn about the network first).
	lines := strings.Split(strings.TrimSpace(out), "\n")
	id := strings.TrimSpace(lines[len(lines)-1])
	defer e.docker("rm", id)
	exported := filepath.Join(t.TempDir(), "rootfs.tar")
	if out, err := e.docker("export", "-o", exported, id); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	list, err := exec.Command("tar", "-tf", exported).Output()
	if err != nil {
		t.Fatal(err)
	}
	var bins []string
	for _, line := range strings.Split(string(bytes.TrimSpace(list)), "\n") {
		if rest, ok := strings.CutPrefix(line, "usr/bin/"); ok && rest != "" {
			bins = append(bins, rest)
		}
	}
	slices.Sort(bins)
	if got := fmt.Sprint(bins); got != "[gantry gantry-cdi-hook gantry-device-plugin gantry-dra-plugin gantry-runtime]" {
		t.Errorf("usr/bin of the image: %s, want gantry, gantry-cdi-hook, gantry-device-plugin, gantry-dra-plugin and gantry-runtime", got)
	}
}

// testImageContainerd imports the same archive with ctr (its OCI index.json,
// with the image name in its annotation) and runs the DaemonSet's command
// as the kubelet has containerd run it: the pod's command replaces the
// image's entrypoint and is looked up in the image's PATH.
func testImageContainerd(t *testing.T, ds daemonSetContainer, archive, version string) {
	e := startContainerd(t)
	out, err := e.ctr("images", "import", "--snapshotter", e.snapshotter, archive)
	if err != nil {
		t.Fatalf("%v\n%s\ncontainerd log:\n%s", err, out, tail(e.d.log, 3000))
	}
	if out, err := e.ctr("images", "ls", "-q"); err != nil || !slices.Contains(strings.Fields(out), ds.Image) {
		t.Fatalf("ctr images ls: %q %v, want %s (the DaemonSet's image)", out, err, ds.Image)
	}
	for i, args := range [][]string{
		append(append([]string{}, ds.Command...), "--gpus", "sim:h100x8", "--dry-run"),
		{"gantry", "--version"},
	} {
		run := append([]string{"run", "--rm", "--snapshotter", e.snapshotter,
			"--runc-root", filepath.Join(e.dir, "runc"), "--fifo-dir", filepath.Join(e.dir, "fifo"),
			ds.Image, fmt.Sprintf("image-%d", i)}, args...)
		out, err := e.ctr(run...)
		if err != nil {
			t.Fatalf("ctr run %v: %v\n%s", args, err, out)
		}
		want := "nvidia.com/gpu"
		if args[0] == "gantry" {
			want = "gantry " + version
		}
		if !strings.Contains(out, want) {
			t.Errorf("ctr run %v: output lacks %q:\n%s", args, want, out)
		}
	}
}
