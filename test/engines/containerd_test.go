//go:build linux

package engines

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ctrImage is the test image's name in the private containerd.
const ctrImage = "docker.io/gantry-test/probe:1"

// containerdEngine is a private containerd driven by ctr.
type containerdEngine struct {
	f           *fixture
	sock        string
	dir         string
	namespace   string
	snapshotter string
	cli         []string
	d           *daemon
}

// containerdConfig is a private containerd's configuration, the file
// `gantry runtime configure` edits: root, state, sockets and the opt
// directory all under the test's directory.
const containerdConfig = `version = 2
root = %q
state = %q

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`

// containerdRunConfig is what the daemon is started with: the configured
// file imported as is, and the plugins the tests do not use turned off (CRI
// would want CNI and a streaming port).
const containerdRunConfig = `version = 2
imports = [%q]
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]
`

// containerdSkip returns why containerd tests cannot run here, or "".
func containerdSkip() string {
	for _, tool := range []string{"containerd", "ctr", "containerd-shim-runc-v2"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not installed (apt-get install containerd; scripts/deps.sh --test does)"
		}
	}
	return ""
}

// startContainerdDaemon runs a private containerd with everything under
// dir and returns it with its socket. configure, if not nil, may edit the
// configuration file before the daemon reads it. The daemon, its shims and
// their mounts go when the test ends.
func startContainerdDaemon(t *testing.T, f *fixture, dir string, configure func(config string)) (*daemon, string) {
	t.Helper()
	return startContainerdDaemonEnv(t, f, dir, configure, f.daemonEnv())
}

// startContainerdDaemonEnv is startContainerdDaemon with env for the daemon.
func startContainerdDaemonEnv(t *testing.T, f *fixture, dir string, configure func(config string), env []string) (*daemon, string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "containerd.sock")
	config := filepath.Join(dir, "config.toml")
	cfg := fmt.Sprintf(containerdConfig, filepath.Join(dir, "root"), filepath.Join(dir, "state"),
		sock, sock+".ttrpc", filepath.Join(dir, "opt"))
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if configure != nil {
		configure(config)
	}
	runConfig := filepath.Join(dir, "run.toml")
	if err := os.WriteFile(runConfig, []byte(fmt.Sprintf(containerdRunConfig, config)), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, "containerd", filepath.Join(dir, "containerd.log"), dir, env,
		"containerd", "--config", runConfig)
	d.waitReady(t, func() error {
		_, err := command(env, "ctr", "--address", sock, "version")
		return err
	})
	return d, sock
}

// startContainerd starts a private containerd whose configuration
// `gantry runtime configure --runtime containerd` edited (and containerd's
// own parser then reads back), and imports the test image.
func startContainerd(t *testing.T) *containerdEngine {
	f := need(t)
	if why := containerdSkip(); why != "" {
		t.Skip(why)
	}
	hostDirsCleanup(t)
	e := &containerdEngine{f: f, dir: t.TempDir(), snapshotter: "native", cli: f.daemonEnv()}
	if f.overlay {
		e.snapshotter = "overlayfs"
	}
	e.namespace = fmt.Sprintf("gantry-test-%d", os.Getpid())
	// containerd puts a namespace's containers in cgroups under a parent
	// named after the namespace and leaves the parent behind; remove it
	// (empty by then) once the daemon is gone. Registered first, so it runs last.
	t.Cleanup(func() { removeCgroupDirs("/" + e.namespace) })
	e.d, e.sock = startContainerdDaemon(t, f, filepath.Join(e.dir, "containerd"), func(config string) {
		out, err := command(e.cli, f.gantry, "runtime", "configure", "--runtime", "containerd",
			"--config-file", config, "--runtime-path", f.nvRuntime)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		// containerd's own parser must accept the edited file, keep the
		// private paths, and see the runtime with Gantry as its binary.
		dump, err := command(e.cli, "containerd", "--config", config, "config", "dump")
		if err != nil {
			t.Fatalf("containerd rejects the config gantry runtime configure wrote: %v\n%s\nconfig:\n%s", err, dump, tail(config, 4000))
		}
		for _, want := range []string{
			fmt.Sprintf("root = %q", filepath.Join(filepath.Dir(config), "root")),
			fmt.Sprintf("address = %q", filepath.Join(filepath.Dir(config), "containerd.sock")),
			`[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]`,
			fmt.Sprintf("BinaryName = %q", f.nvRuntime),
		} {
			if !strings.Contains(dump, want) {
				t.Errorf("containerd config dump lacks %s:\n%s", want, dump)
			}
		}
	})
	if out, err := e.ctr("images", "import", "--snapshotter", e.snapshotter, f.ociArchive); err != nil {
		t.Fatalf("%v\n%s\ncontainerd log:\n%s", err, out, tail(e.d.log, 4000))
	}
	return e
}

func (e *containerdEngine) ctr(args ...string) (string, error) {
	return command(e.cli, append([]string{"ctr", "--address", e.sock, "--namespace", e.namespace}, args...)...)
}

// run runs gpuScript in a throwaway container with the given ctr run
// options.
func (e *containerdEngine) run(id string, opts ...string) (string, error) {
	// runc's state and the stdio FIFOs go under the test's directory, not
	// under /run/containerd where ctr puts them by default.
	args := append([]string{"run", "--rm", "--snapshotter", e.snapshotter,
		"--runc-root", filepath.Join(e.dir, "runc"), "--fifo-dir", filepath.Join(e.dir, "fifo")}, opts...)
	return e.ctr(append(args, ctrImage, id, "sh", "-c", gpuScript)...)
}

// TestContainerd runs containers through ctr with Gantry's runtime, under
// NVIDIA's name nvidia-container-runtime, as the runc binary of
// containerd's runc-v2 shim: what a containerd runtime entry with
// options.BinaryName (as `gantry runtime configure` writes) makes it.
func TestContainerd(t *testing.T) {
	e := startContainerd(t)
	f := e.f
	if out, err := e.ctr("version"); err == nil {
		t.Logf("%s", strings.TrimSpace(out))
	}

	t.Run("RuncBinaryEnv", func(t *testing.T) {
		out, err := e.run("gpu1", "--runc-binary", f.nvRuntime, "--env", "NVIDIA_VISIBLE_DEVICES=1")
		if err != nil {
			t.Fatalf("%v\n%s\n%s", err, out, f.runtimeLogTail())
		}
		report(t, f, "ctr run --runc-binary nvidia-container-runtime --env NVIDIA_VISIBLE_DEVICES=1", checkOnlyGPU1(f, out), out)
	})

	t.Run("NoGPURequest", func(t *testing.T) {
		out, err := e.run("nogpu", "--runc-binary", f.nvRuntime)
		if err != nil {
			t.Fatalf("%v\n%s\n%s", err, out, f.runtimeLogTail())
		}
		report(t, f, "ctr run --runc-binary nvidia-container-runtime (no GPU asked for)", checkNoGPU(out), out)
	})

	t.Run("MissingGPU", func(t *testing.T) {
		out, err := e.run("gpu9", "--runc-binary", f.nvRuntime, "--env", "NVIDIA_VISIBLE_DEVICES=9")
		if err == nil {
			t.Fatalf("a container asking for GPU 9 of 8 started:\n%s", out)
		}
		if strings.Contains(out, "== dev") {
			t.Errorf("the container ran although its GPU request failed:\n%s", out)
		}
		if !strings.Contains(out, "9") || !strings.Contains(strings.ToLower(out), "gpu") {
			t.Errorf("the error does not name the missing GPU 9:\n%s", out)
		}
		t.Logf("the engine reports: %s", strings.TrimSpace(out))
		// ctr run --rm does not delete a container whose task never
		// started; a clean failure leaves the container record only.
		_, _ = e.ctr("containers", "delete", "gpu9")
	})
}
