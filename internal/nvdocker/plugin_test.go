package nvdocker

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/dockervol"
	"github.com/gantry-gpu/gantry/internal/drivervol"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/legacyapi"
)

// realPlugin serves nvidia-docker-plugin as gantry serve --volume-plugin
// does: the volume plugin on a unix socket, with the REST API's
// /docker/cli/json on it too, on a fake driver root and simulated GPUs.
func realPlugin(t *testing.T) (Plugin, string) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot build the fake driver root")
	}
	root := filepath.Join(t.TempDir(), "driver")
	res, err := fakedriver.Build(root, fakedriver.Options{Version: "580.159.04", Layout: fakedriver.LayoutGKE, GPUs: 4, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.RealDeviceNodes {
		t.Skip("needs root: the wrapper takes only character devices of NVIDIA's majors")
	}
	fakeProcDevices(t)
	cfg := config.Default()
	cfg.GPUs = "sim:h100x8"
	cfg.DriverRoot = root
	sys, err := discover.GPUs(cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := discover.Driver(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sockDir := t.TempDir()
	ln, err := dockervol.Listen(sockDir)
	if err != nil {
		t.Fatal(err)
	}
	api := legacyapi.New(legacyapi.Options{System: sys, Driver: inv, DevRoot: cfg.EffectiveDevRoot(), VolumePlugin: true})
	ps := dockervol.NewHTTPServer(dockervol.New(dockervol.Options{Store: drivervol.Store{Dir: t.TempDir()}, Driver: inv, DockerCLI: api}))
	go ps.Serve(ln)
	t.Cleanup(func() { ps.Close() })
	return Plugin{Socket: filepath.Join(sockDir, dockervol.SocketName), DevRoots: []string{root}}, root
}

// oldPlugin is a volume plugin that does not answer /docker/cli/json on its
// socket, as gantry serve did before the wrapper stopped asking a TCP port.
func oldPlugin(t *testing.T) Plugin {
	t.Helper()
	sockDir := t.TempDir()
	ln, err := dockervol.Listen(sockDir)
	if err != nil {
		t.Fatal(err)
	}
	ps := dockervol.NewHTTPServer(dockervol.New(dockervol.Options{Store: drivervol.Store{Dir: t.TempDir()}}))
	go ps.Serve(ln)
	t.Cleanup(func() { ps.Close() })
	return Plugin{Socket: filepath.Join(sockDir, dockervol.SocketName)}
}

func TestMainUsesPlugin(t *testing.T) {
	p, root := realPlugin(t)
	bin := t.TempDir()
	fakeDocker(t, bin, "docker")
	log := filepath.Join(t.TempDir(), "argv")
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_DOCKER_LOG", log)
	t.Setenv("FAKE_DOCKER_EXIT", "0")
	t.Setenv("NV_DOCKER", "")
	t.Setenv("DOCKER_HOST", "")
	dev := func(n string) string { return "--device=" + root + n + ":" + n }
	runtime := []string{"--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=1"}

	for _, tc := range []struct {
		name, gpus, dockerHost string
		plugin                 Plugin
		args, want             []string
		code                   int
		stderr                 string
	}{
		{name: "plugin", gpus: "1", plugin: p, args: []string{"run", "--rm", "cuda", "nvidia-smi"},
			want: []string{"run", "--volume-driver=nvidia-docker", "--volume=nvidia_driver_580.159.04:/usr/local/nvidia:ro",
				dev("/dev/nvidiactl"), dev("/dev/nvidia-uvm"), dev("/dev/nvidia-uvm-tools"), dev("/dev/nvidia1"),
				"-e", "NVIDIA_VISIBLE_DEVICES=void", "--rm", "cuda", "nvidia-smi"}},
		{name: "two GPUs by comma", gpus: "0,2", plugin: p, args: []string{"create", "cuda"},
			want: []string{"create", "--volume-driver=nvidia-docker", "--volume=nvidia_driver_580.159.04:/usr/local/nvidia:ro",
				dev("/dev/nvidiactl"), dev("/dev/nvidia-uvm"), dev("/dev/nvidia-uvm-tools"), dev("/dev/nvidia0"), dev("/dev/nvidia2"),
				"-e", "NVIDIA_VISIBLE_DEVICES=void", "cuda"}},
		{name: "no plugin", gpus: "1", plugin: Plugin{Socket: filepath.Join(t.TempDir(), "none.sock")},
			args: []string{"run", "cuda"}, want: append(append([]string{"run"}, runtime...), "cuda")},
		{name: "older plugin", gpus: "1", plugin: oldPlugin(t),
			args: []string{"run", "cuda"}, want: append(append([]string{"run"}, runtime...), "cuda"), stderr: "does not answer /docker/cli/json"},
		{name: "remote daemon", gpus: "1", plugin: p, args: []string{"-H", "tcp://gpu-host:2375", "run", "cuda"},
			want: append(append([]string{"-H", "tcp://gpu-host:2375", "run"}, runtime...), "cuda")},
		{name: "remote DOCKER_HOST", gpus: "1", dockerHost: "tcp://gpu-host:2375", plugin: p, args: []string{"run", "cuda"},
			want: append(append([]string{"run"}, runtime...), "cuda")},
		{name: "unknown GPU", gpus: "9", plugin: p, args: []string{"run", "cuda"}, code: 1, stderr: "invalid device: 9"},
		{name: "not run", gpus: "1", plugin: p, args: []string{"ps"}, want: []string{"ps"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(log)
			t.Setenv("NV_GPU", tc.gpus)
			t.Setenv("DOCKER_HOST", tc.dockerHost)
			var out, errb bytes.Buffer
			code := run(tc.args, strings.NewReader(""), &out, &errb, tc.plugin)
			if code != tc.code || !strings.Contains(errb.String(), tc.stderr) {
				t.Fatalf("exit %d, want %d; stderr %q, want %q", code, tc.code, errb.String(), tc.stderr)
			}
			if tc.code != 0 {
				if _, err := os.Stat(log); err == nil {
					t.Error("docker ran")
				}
				return
			}
			if got := readLines(t, log); strings.Join(got, "\x00") != strings.Join(tc.want, "\x00") {
				t.Errorf("docker argv %q\nwant %q", got, tc.want)
			}
		})
	}
}
