//go:build linux

package engines

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// dockerImage is the test image's name in the private Docker daemon.
const dockerImage = "gantry-test/probe:1"

// dockerEngine is a private dockerd: its own data root, exec root, socket
// and containerd, all under dir; nothing of the host's Docker is read or
// written.
type dockerEngine struct {
	f    *fixture
	dir  string
	sock string
	cli  []string // client environment: DOCKER_HOST, DOCKER_CONFIG, PATH
	d    *daemon
	env  []string // the daemons' environment
	argv []string // dockerd's command line
}

// startDocker configures and starts a private dockerd with Gantry's runtime
// registered by `gantry runtime configure --runtime docker`, and imports the
// test image into it.
func startDocker(t *testing.T) *dockerEngine {
	return startDockerEnv(t, need(t).daemonEnv())
}

// startDockerEnv is startDocker with env for dockerd and its containerd.
func startDockerEnv(t *testing.T, env []string) *dockerEngine {
	f := need(t)
	return startDockerWith(t, env, func(env []string, daemonJSON string) (string, error) {
		return command(env, f.gantry, "runtime", "configure", "--runtime", "docker",
			"--config-file", daemonJSON, "--runtime-path", f.runtime)
	})
}

// startDockerWith is startDockerEnv with another configure command, run on
// the private daemon.json before dockerd starts on it.
func startDockerWith(t *testing.T, env []string, configure func(env []string, daemonJSON string) (string, error)) *dockerEngine {
	f := need(t)
	dockerd, err := exec.LookPath("dockerd")
	if err != nil {
		t.Skip("dockerd not installed (apt-get install docker.io; scripts/deps.sh --test does)")
	}
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("the docker client is not installed (apt-get install docker.io)")
	}
	if why := containerdSkip(); why != "" {
		t.Skip(why + "; dockerd runs on a private containerd")
	}
	hostDirsCleanup(t)
	e := &dockerEngine{f: f, dir: t.TempDir(), env: env}
	// dockerd would otherwise start a containerd of its own, which keeps
	// files in /opt/containerd; this one keeps everything in the test's
	// directory.
	_, containerdSock := startContainerdDaemonEnv(t, f, filepath.Join(e.dir, "containerd"), nil, env)

	ddir := filepath.Join(e.dir, "docker")
	if err := os.Mkdir(ddir, 0o700); err != nil {
		t.Fatal(err)
	}
	e.sock = filepath.Join(ddir, "docker.sock")
	e.cli = slices.Concat(env, []string{"DOCKER_HOST=unix://" + e.sock, "DOCKER_CONFIG=" + filepath.Join(e.dir, "client")})

	// The daemon's own settings, which configure must keep: every path
	// private (the trust key too, which would go to /etc/docker), no
	// bridge, no iptables or sysctl changes on the host.
	storage := "vfs"
	if f.overlay {
		storage = "overlay2"
	}
	daemonJSON := filepath.Join(ddir, "daemon.json")
	base := map[string]any{
		"data-root":           filepath.Join(ddir, "data"),
		"exec-root":           filepath.Join(ddir, "exec"),
		"pidfile":             filepath.Join(ddir, "docker.pid"),
		"deprecated-key-path": filepath.Join(ddir, "key.json"),
		"hosts":               []string{"unix://" + e.sock},
		"containerd":          containerdSock,
		"storage-driver":      storage,
		"bridge":              "none",
		"iptables":            false,
		"ip-forward":          false,
		"ip-masq":             false,
		"log-level":           "info",
	}
	b, _ := json.MarshalIndent(base, "", "  ")
	if err := os.WriteFile(daemonJSON, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := configure(env, daemonJSON)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var got map[string]any
	b, err = os.ReadFile(daemonJSON)
	if err == nil {
		err = json.Unmarshal(b, &got)
	}
	if err != nil {
		t.Fatalf("daemon.json after gantry runtime configure: %v\n%s", err, b)
	}
	for k, v := range base {
		if fmt.Sprint(got[k]) != fmt.Sprint(v) {
			t.Errorf("gantry runtime configure changed %q: %v, was %v", k, got[k], v)
		}
	}

	e.argv = []string{dockerd, "--config-file", daemonJSON}
	e.start(t)
	if out, err := e.docker("import", f.rootfsTar, dockerImage); err != nil {
		t.Fatalf("%v\n%s\ndockerd log:\n%s", err, out, tail(e.d.log, 4000))
	}
	return e
}

// start starts dockerd and waits until it answers.
func (e *dockerEngine) start(t *testing.T) {
	t.Helper()
	ddir := filepath.Join(e.dir, "docker")
	e.d = startDaemon(t, "dockerd", filepath.Join(ddir, "dockerd.log"), ddir, e.env, e.argv...)
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", e.sock)
		},
	}, Timeout: 5 * time.Second}
	e.d.waitReady(t, func() error {
		resp, err := client.Get("http://docker/_ping")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/_ping: %s", resp.Status)
		}
		return nil
	})
}

// restart stops dockerd and starts it again on the same files, what
// systemctl restart docker does.
func (e *dockerEngine) restart(t *testing.T) {
	t.Helper()
	e.d.stop(t)
	e.start(t)
}

// docker runs the docker client against the private daemon.
func (e *dockerEngine) docker(args ...string) (string, error) {
	return command(e.cli, append([]string{"docker"}, args...)...)
}

// apparmorUnusable reports a kernel with AppArmor on but no apparmor_parser
// (docker.io installed without its recommended apparmor package): Docker
// would then give containers a docker-default profile it could not load,
// and runc would fail to start them, which is not what these tests are about.
func apparmorUnusable() bool {
	b, err := os.ReadFile("/sys/module/apparmor/parameters/enabled")
	if err != nil || strings.TrimSpace(string(b)) != "Y" {
		return false
	}
	_, err = exec.LookPath("apparmor_parser")
	return err != nil
}

// run runs gpuScript in a throwaway container with the given docker run
// options.
func (e *dockerEngine) run(opts ...string) (string, error) {
	args := []string{"run", "--rm", "--network", "none"}
	if apparmorUnusable() {
		args = append(args, "--security-opt", "apparmor=unconfined")
	}
	args = append(args, opts...)
	return e.docker(append(args, dockerImage, "sh", "-c", gpuScript)...)
}

// TestDocker drives a real Docker daemon: the runtime registered by
// `gantry runtime configure`, Docker's own --gpus flag through the hook, a
// container with no GPU request, a bad request, and Compose.
func TestDocker(t *testing.T) {
	e := startDocker(t)
	f := e.f
	if out, err := e.docker("version", "--format", "client {{.Client.Version}}, daemon {{.Server.Version}}"); err == nil {
		t.Logf("docker %s", strings.TrimSpace(out))
	}

	t.Run("RuntimesRegistered", func(t *testing.T) {
		out, err := e.docker("info", "--format", "{{json .Runtimes}}")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var runtimes map[string]struct {
			Path string `json:"path"`
		}
		if err := json.Unmarshal([]byte(out), &runtimes); err != nil {
			t.Fatalf("docker info runtimes: %v\n%s", err, out)
		}
		for _, name := range []string{"nvidia", "gantry"} {
			if got := runtimes[name].Path; got != f.runtime {
				t.Errorf("docker info: runtime %q has path %q, want %q (all: %s)", name, got, f.runtime, out)
			}
		}
	})

	t.Run("RuntimeNvidiaEnv", func(t *testing.T) {
		out, err := e.run("--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=1")
		if err != nil {
			t.Fatalf("%v\n%s\n%s", err, out, f.runtimeLogTail())
		}
		report(t, f, "docker run --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=1", checkOnlyGPU1(f, out), out)
	})

	t.Run("GPUsFlagHook", func(t *testing.T) {
		// No --runtime: Docker runs its default runtime, plain runc, and
		// adds its prestart hook, nvidia-container-runtime-hook from its
		// PATH, which is Gantry.
		if rt, err := e.docker("info", "--format", "{{.DefaultRuntime}}"); err != nil || strings.TrimSpace(rt) != "runc" {
			t.Fatalf("the daemon's default runtime is %q (%v), want runc: the hook would not be what is tested", strings.TrimSpace(rt), err)
		}
		out, err := e.run("--gpus", `"device=1"`)
		if err != nil {
			t.Fatalf("%v\n%s\ndockerd log:\n%s", err, out, tail(e.d.log, 3000))
		}
		report(t, f, `docker run --gpus "device=1"`, checkOnlyGPU1(f, out), out)
		sec := sections(out)
		if !contains(sec["env"], "NVIDIA_VISIBLE_DEVICES=1") {
			t.Errorf("docker --gpus should set NVIDIA_VISIBLE_DEVICES=1 in the container, env: %q", sec["env"])
		}
	})

	t.Run("NoGPURequest", func(t *testing.T) {
		for _, opts := range [][]string{
			nil,                  // runc alone
			{"--runtime=nvidia"}, // the shim, asked for nothing
			{"--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=void"},
		} {
			out, err := e.run(opts...)
			if err != nil {
				t.Fatalf("docker run %v: %v\n%s\n%s", opts, err, out, f.runtimeLogTail())
			}
			report(t, f, fmt.Sprintf("docker run %v (no GPU asked for)", opts), checkNoGPU(out), out)
		}
	})

	t.Run("MissingGPU", func(t *testing.T) {
		// sim:h100x8 has GPUs 0-7: asking for 9, through the runtime or
		// through the hook, must fail the container with an error naming
		// the request, not start it without a GPU.
		for _, opts := range [][]string{
			{"--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=9"},
			{"--gpus", `"device=9"`},
		} {
			out, err := e.run(opts...)
			if err == nil {
				t.Fatalf("docker run %v: a container asking for GPU 9 of 8 started:\n%s", opts, out)
			}
			if strings.Contains(out, "== dev") {
				t.Errorf("docker run %v: the container ran although its GPU request failed:\n%s", opts, out)
			}
			if !strings.Contains(out, "9") || !strings.Contains(strings.ToLower(out), "gpu") {
				t.Errorf("docker run %v: the error does not name the missing GPU 9:\n%s", opts, out)
			}
			t.Logf("docker run %v: the engine reports: %s", opts, strings.TrimSpace(out))
		}
		if ps, err := e.docker("ps", "-aq"); err != nil || strings.TrimSpace(ps) != "" {
			t.Errorf("containers left after the failed runs: %q %v", ps, err)
		}
	})

	t.Run("Compose", func(t *testing.T) {
		testCompose(t, e)
	})
}

// composeFile asks for GPU 1 the way Compose documents GPU access: a device
// reservation with the nvidia driver and the gpu capability, which Docker
// turns into the same hook as --gpus.
const composeFile = `services:
  probe:
    image: %s
    network_mode: none
    security_opt: [%s]
    command: ["sh", "-c", %s]
    deploy:
      resources:
        reservations:
          devices:
            - driver: nvidia
              device_ids: ["1"]
              capabilities: [gpu]
`

func testCompose(t *testing.T, e *dockerEngine) {
	compose, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Skip("docker-compose not installed (apt-get install docker-compose; scripts/deps.sh --test does)")
	}
	script, _ := json.Marshal(gpuScript)
	dir := t.TempDir()
	file := filepath.Join(dir, "compose.yaml")
	secOpt := ""
	if apparmorUnusable() {
		secOpt = "apparmor=unconfined"
	}
	if err := os.WriteFile(file, []byte(fmt.Sprintf(composeFile, dockerImage, secOpt, script)), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{compose, "--ansi", "never", "-f", file, "-p", "gantrytest"}
	if out, err := command(e.cli, compose, "version", "--short"); err == nil {
		t.Logf("docker-compose %s", strings.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := command(e.cli, append(base, "down", "--remove-orphans")...); err != nil {
			t.Logf("docker-compose down: %v\n%s", err, out)
		}
	})
	out, err := command(e.cli, append(base, "run", "--rm", "-T", "probe")...)
	if err != nil {
		t.Fatalf("%v\n%s\ndockerd log:\n%s", err, out, tail(e.d.log, 3000))
	}
	report(t, e.f, "docker-compose run with a GPU reservation for device 1", checkOnlyGPU1(e.f, out), out)
}
