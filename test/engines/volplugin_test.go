package engines

import (
	"bufio"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/drivervol"
)

// pluginSocket is where Docker looks for the plugin nvidia-docker: plugin
// discovery reads this directory whatever the daemon's own paths are.
const pluginSocket = "/run/docker/plugins/nvidia-docker.sock"

// restAddr is nvidia-docker-plugin's REST address, where the nvidia-docker
// wrapper asks for its arguments.
const restAddr = "127.0.0.1:3476"

// startPlugin runs gantry serve --volume-plugin (nvidia-docker-plugin) on
// the fake driver, and returns a function that stops it.
func startPlugin(t *testing.T, f *fixture, volumes string) (stop func()) {
	t.Helper()
	cmd := exec.Command(f.gantry, "serve", "--volume-plugin", "--listen", restAddr, "--volumes-dir", volumes)
	cmd.Env = f.daemonEnv()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var log []string
	deadline := time.After(30 * time.Second)
	for started := false; !started; {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				t.Fatalf("gantry serve --volume-plugin exited:\n%s", strings.Join(log, "\n"))
			}
			log = append(log, l)
			started = strings.Contains(l, "listening on ")
		case <-deadline:
			cmd.Process.Kill()
			t.Fatalf("gantry serve --volume-plugin did not start:\n%s", strings.Join(log, "\n"))
		}
	}
	go func() {
		for range lines {
		}
	}()
	t.Logf("plugin: %s", strings.Join(log, "\n"))
	done := false
	stop = func() {
		if done {
			return
		}
		done = true
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("gantry serve --volume-plugin: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func dockerCLI(t *testing.T, query string) []string {
	t.Helper()
	resp, err := http.Get("http://" + restAddr + "/docker/cli" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("/docker/cli%s: %d %s", query, resp.StatusCode, b)
	}
	return strings.Fields(string(b))
}

// TestDockerVolumePlugin runs nvidia-docker 1.0's way against a real
// dockerd: the volume plugin nvidia-docker serves nvidia_driver_<version>,
// `docker run $(curl localhost:3476/docker/cli?dev=1)` on plain runc gives a
// container with GPU 1 alone whose libcuda, NVML and nvidia-smi come from
// the volume at /usr/local/nvidia, `NV_GPU=1 nvidia-docker run` does the
// same, and the volume survives a restart of the plugin.
func TestDockerVolumePlugin(t *testing.T) {
	e := startDocker(t)
	f := e.f
	if _, err := os.Lstat(pluginSocket); err == nil {
		t.Skipf("%s exists: a plugin of this host's is there, which the test must not replace", pluginSocket)
	}
	if ln, err := net.Listen("tcp", restAddr); err != nil {
		t.Skipf("%s is taken (%v): the wrapper asks the plugin there", restAddr, err)
	} else {
		ln.Close()
	}
	if err := os.Symlink("gantry", filepath.Join(f.binDir, "nvidia-docker")); err != nil && !errors.Is(err, fs.ErrExist) {
		t.Fatal(err)
	}
	volumes := t.TempDir()
	// The plugin makes the volume a read-only mount: take it off, whatever
	// happens, before the directory is removed.
	t.Cleanup(func() { drivervol.Store{Dir: filepath.Join(volumes, "nvidia_driver")}.Remove(f.driver.Version) })
	stop := startPlugin(t, f, volumes)

	vol := "nvidia_driver_" + f.driver.Version
	args := dockerCLI(t, "?dev=1")
	if len(args) < 2 || args[0] != "--volume-driver=nvidia-docker" || args[1] != "--volume="+vol+":/usr/local/nvidia:ro" {
		t.Fatalf("/docker/cli?dev=1: %q", args)
	}
	// The image sets no PATH or LD_LIBRARY_PATH for /usr/local/nvidia;
	// the CUDA images of that generation did.
	env := []string{"-e", "PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"-e", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib"}
	out, err := e.run(append(args, env...)...)
	if err != nil {
		t.Fatalf("docker run %q: %v\n%s\ndockerd log:\n%s", args, err, out, tail(e.d.log, 3000))
	}
	report(t, f, "docker run $(curl localhost:3476/docker/cli?dev=1)", checkOnlyGPU1(f, out), out)

	ls, err := e.docker("volume", "ls", "--format", "{{.Driver}} {{.Name}}")
	if err != nil || !strings.Contains(ls, "nvidia-docker "+vol) {
		t.Errorf("docker volume ls: %v\n%s", err, ls)
	}
	out, err = e.docker("run", "--rm", "--network", "none", "--volume-driver=nvidia-docker", "--volume="+vol+":/usr/local/nvidia:ro",
		dockerImage, "sh", "-c", "ls /usr/local/nvidia/lib64; touch /usr/local/nvidia/lib64/x 2>&1 || echo read-only")
	if err != nil || !strings.Contains(out, "libcuda.so.1") || !strings.Contains(out, "read-only") {
		t.Errorf("ls /usr/local/nvidia/lib64 in the volume: %v\n%s", err, out)
	}

	// Without :ro the volume is read-only all the same: the plugin's
	// mountpoint is a read-only mount, and the tree's files are hard links
	// of the driver's.
	out, err = e.docker("run", "--rm", "--network", "none", "--volume-driver=nvidia-docker", "--volume="+vol+":/usr/local/nvidia",
		dockerImage, "sh", "-c", "echo x >> /usr/local/nvidia/lib64/libcuda.so.1 2>&1 || echo read-only")
	if err != nil || !strings.Contains(out, "read-only") {
		t.Errorf("a volume mounted without :ro: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(f.driver.Root, f.driver.LibDir, "libcuda.so.1")); strings.HasSuffix(string(b), "x\n") {
		t.Error("a container wrote to the host's libcuda through the volume")
	}

	// The wrapper, with the plugin running: no runtime, the plugin's arguments.
	out, err = command(append(e.cli, "NV_GPU=1"), append([]string{filepath.Join(f.binDir, "nvidia-docker"), "run", "--rm", "--network", "none"},
		append(env, dockerImage, "sh", "-c", gpuScript)...)...)
	if err != nil {
		t.Fatalf("NV_GPU=1 nvidia-docker run: %v\n%s", err, out)
	}
	report(t, f, "NV_GPU=1 nvidia-docker run (volume plugin)", checkOnlyGPU1(f, out), out)
	if sec := sections(out); !contains(sec["env"], "NVIDIA_VISIBLE_DEVICES=void") {
		t.Errorf("nvidia-docker did not take the plugin's path: env %q", sec["env"])
	}

	// A restart of the plugin: Docker still has the volume, the same tree.
	stop()
	startPlugin(t, f, volumes)
	out, err = e.run(append(args, env...)...)
	if err != nil {
		t.Fatalf("docker run after the plugin restarted: %v\n%s\ndockerd log:\n%s", err, out, tail(e.d.log, 3000))
	}
	report(t, f, "docker run after a plugin restart", checkOnlyGPU1(f, out), out)
	if out, err := e.docker("volume", "rm", vol); err != nil {
		t.Errorf("docker volume rm: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(volumes, "nvidia_driver", f.driver.Version)); err == nil {
		t.Error("docker volume rm left the tree")
	}
}
