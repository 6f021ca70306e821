package nvdocker

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// What an impostor answers: the arguments that make docker run a container
// that owns the host.
const hostileText = "--privileged --pid=host -v /:/host"

var hostileJSON = `{"VolumeDriver":"nvidia-docker","Volumes":["/:/host"],"Devices":["/dev/nvidiactl","/dev/sda:/dev/nvidia0"]}`

// impostor answers the plugin protocol and the REST API with hostileText
// and hostileJSON.
func impostor() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/Plugin.Activate":
			io.WriteString(w, `{"Implements":["VolumeDriver"]}`)
		case "/docker/cli", "/v1.0/docker/cli":
			io.WriteString(w, hostileText)
		case "/docker/cli/json", "/v1.0/docker/cli/json":
			io.WriteString(w, hostileJSON)
		default:
			http.NotFound(w, r)
		}
	})
}

// TestNVDockerChild is the test binary's child roles: "attacker" (run as
// nobody) listens on ATTACK_TCP's addresses and ATTACK_UNIX's socket;
// "wrapper" runs the wrapper in a private network and mount namespace.
func TestNVDockerChild(t *testing.T) {
	switch os.Getenv("GANTRY_NVD_CHILD") {
	case "attacker":
		os.Exit(attackerMain())
	case "wrapper":
		os.Exit(wrapperMain())
	}
	t.Skip("a child process role (GANTRY_NVD_CHILD), not a test of its own")
}

func attackerMain() int {
	var lns []net.Listener
	for _, a := range strings.Split(os.Getenv("ATTACK_TCP"), ",") {
		if a == "" {
			continue
		}
		ln, err := net.Listen("tcp", a)
		if err != nil {
			fmt.Fprintf(os.Stderr, "attacker: %v\n", err)
			return 1
		}
		lns = append(lns, ln)
	}
	if p := os.Getenv("ATTACK_UNIX"); p != "" {
		ln, err := net.Listen("unix", p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "attacker: %v\n", err)
			return 1
		}
		lns = append(lns, ln)
	}
	for _, ln := range lns {
		go http.Serve(ln, impostor())
	}
	fmt.Printf("ready uid=%d\n", os.Getuid())
	io.Copy(io.Discard, os.Stdin) // until the parent closes it
	return 0
}

// startAttacker runs the test binary (a copy nobody may execute) as nobody
// with env; it is stopped when the test ends.
func startAttacker(t *testing.T, exe string, env ...string) {
	t.Helper()
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", exe, "-test.run=^TestNVDockerChild$")
	cmd.Env = append([]string{"GANTRY_NVD_CHILD=attacker", "PATH=/usr/bin:/bin"}, env...)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready uid=65534") {
		t.Fatalf("the attacker did not start as nobody: %q %v", line, err)
	}
}

// wrapperMain runs in `unshare --net --mount`: loopback up, /etc/hosts
// replaced by HOSTS_FILE, the attacker started as nobody on the loopback,
// then the wrapper with the plugin socket PLUGIN_SOCKET. It prints what an
// HTTP client of localhost:3476 gets (the control: the impostor is there).
func wrapperMain() int {
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "ip link set lo up: %v %s\n", err, out)
		return 90
	}
	if err := syscall.Mount(os.Getenv("HOSTS_FILE"), "/etc/hosts", "", syscall.MS_BIND, ""); err != nil {
		fmt.Fprintf(os.Stderr, "bind-mounting the hosts file: %v\n", err)
		return 90
	}
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", os.Getenv("ATTACKER_EXE"), "-test.run=^TestNVDockerChild$")
	cmd.Env = []string{"GANTRY_NVD_CHILD=attacker", "PATH=/usr/bin:/bin", "ATTACK_TCP=" + os.Getenv("ATTACK_TCP")}
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "starting the attacker: %v\n", err)
		return 90
	}
	defer func() { in.Close(); cmd.Process.Kill(); cmd.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready uid=65534") {
		fmt.Fprintf(os.Stderr, "the attacker did not start as nobody: %q %v\n", line, err)
		return 90
	}
	// The control: a client of localhost:3476 reaches the impostor.
	hc := &http.Client{Timeout: 30 * time.Second}
	if resp, err := hc.Get("http://localhost:3476/docker/cli"); err != nil {
		fmt.Printf("control: %v\n", err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("control: %s\n", b)
	}
	var errb bytes.Buffer
	pl := DefaultPlugin // all but the socket as the wrapper has it
	pl.Socket = os.Getenv("PLUGIN_SOCKET")
	pl.DevRoots = []string{os.Getenv("PLUGIN_DEV_ROOT")}
	procDevices = os.Getenv("PROC_DEVICES")
	code := run(strings.Fields(os.Getenv("WRAPPER_ARGS")), strings.NewReader(""), io.Discard, &errb, pl)
	fmt.Fprint(os.Stderr, errb.String())
	return code
}

// needAttack skips without root or the tools the attack tests use, and
// returns a copy of the test binary that nobody may run.
func needAttack(t *testing.T) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root: the attacker runs as nobody, the wrapper as root in its own network namespace")
	}
	for _, tool := range []string{"setpriv", "unshare", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (util-linux, iproute2)", tool)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "nvdocker-attacker-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "nvdocker.test")
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return exe
}

// The attack of issue 27 item 1: a local user (nobody) listens on
// localhost:3476 before the wrapper asks: on [::1] while the plugin's REST
// API holds 127.0.0.1 (with the usual /etc/hosts, clients try [::1]
// first), or on 127.0.0.1 when the plugin was started with another -l. It
// answers --privileged --pid=host -v /:/host. root's nvidia-docker run,
// with the real plugin on its root socket, must hand docker the plugin's
// arguments and nothing of the impostor's. The wrapper runs in a network
// namespace of its own, so the test holds no port of the host's.
func TestWrapperIgnoresLoopbackImpostor(t *testing.T) {
	exe := needAttack(t)
	p, root := realPlugin(t)
	bin := t.TempDir()
	fakeDocker(t, bin, "docker")
	for _, tc := range []struct{ name, listen, hosts string }{
		{"[::1] while the API holds 127.0.0.1", "[::1]:3476", "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"},
		{"127.0.0.1 with the API elsewhere", "127.0.0.1:3476,[::1]:3476", "127.0.0.1 localhost\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hosts := filepath.Join(t.TempDir(), "hosts")
			if err := os.WriteFile(hosts, []byte(tc.hosts), 0o644); err != nil {
				t.Fatal(err)
			}
			log := filepath.Join(t.TempDir(), "argv")
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "unshare", "--net", "--mount", "--propagation", "private", "--", exe, "-test.run=^TestNVDockerChild$")
			cmd.Env = append(os.Environ(), "GANTRY_NVD_CHILD=wrapper", "ATTACKER_EXE="+exe, "ATTACK_TCP="+tc.listen,
				"HOSTS_FILE="+hosts, "PLUGIN_SOCKET="+p.Socket, "PLUGIN_DEV_ROOT="+root, "PROC_DEVICES="+procDevices, "WRAPPER_ARGS=run --rm cuda nvidia-smi",
				"PATH="+bin+":"+os.Getenv("PATH"), "FAKE_DOCKER_LOG="+log, "FAKE_DOCKER_EXIT=0", "NV_GPU=1", "NV_DOCKER=", "DOCKER_HOST=")
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			if !strings.Contains(out.String(), "control: "+hostileText) {
				t.Fatalf("control failed: a client of localhost:3476 did not reach the impostor (the test proves nothing): %q\n%s", out.String(), errb.String())
			}
			if err != nil {
				t.Fatalf("wrapper: %v\n%s", err, errb.String())
			}
			got := strings.Join(readLines(t, log), " ")
			for _, bad := range []string{"--privileged", "--pid=host", "/:/host"} {
				if strings.Contains(got, bad) {
					t.Fatalf("docker ran with the impostor's %s: %q", bad, got)
				}
			}
			want := "--volume-driver=nvidia-docker --volume=nvidia_driver_580.159.04:/usr/local/nvidia:ro --device=" + root + "/dev/nvidiactl:/dev/nvidiactl"
			if !strings.Contains(got, want) {
				t.Errorf("docker argv %q: want the plugin's %q", got, want)
			}
		})
	}
}

// A plugin socket that root did not make is not believed: one owned by
// nobody in a sticky world-writable directory, and one whose file is
// root's but whose listener runs as nobody (SO_PEERCRED). The wrapper
// warns and gives the runtime's arguments; nothing of the impostor's
// reaches docker.
func TestWrapperRefusesSocketNotRoots(t *testing.T) {
	exe := needAttack(t)
	bin := t.TempDir()
	fakeDocker(t, bin, "docker")
	log := filepath.Join(t.TempDir(), "argv")
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_DOCKER_LOG", log)
	t.Setenv("FAKE_DOCKER_EXIT", "0")
	t.Setenv("NV_DOCKER", "")
	t.Setenv("DOCKER_HOST", "")
	t.Setenv("NV_GPU", "0")
	for _, chown := range []bool{false, true} {
		t.Run(fmt.Sprintf("file chowned to root %v", chown), func(t *testing.T) {
			dir, err := os.MkdirTemp("", "nvdocker-sock-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(dir, "nvidia-docker.sock")
			startAttacker(t, exe, "ATTACK_UNIX="+sock)
			if err := os.Chmod(sock, 0o600); err != nil {
				t.Fatal(err)
			}
			want := "owned by uid 65534"
			if chown {
				if err := os.Chown(sock, 0, 0); err != nil {
					t.Fatal(err)
				}
				want = "runs as uid 65534"
			}
			var errb bytes.Buffer
			code := run([]string{"run", "cuda"}, strings.NewReader(""), io.Discard, &errb, Plugin{Socket: sock})
			if code != 0 || !strings.Contains(errb.String(), want) {
				t.Fatalf("exit %d, stderr %q; want a warning saying %q", code, errb.String(), want)
			}
			if got := strings.Join(readLines(t, log), " "); got != "run --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=0 cuda" {
				t.Errorf("docker argv %q: want the runtime's", got)
			}
		})
	}
}

// A plugin on root's socket that answers anything but the arguments a
// plugin gives stops the wrapper before docker runs, naming the argument.
func TestWrapperRefusesHostileAnswer(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the socket must be root's")
	}
	sock := filepath.Join(t.TempDir(), "nvidia-docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: impostor()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	bin := t.TempDir()
	fakeDocker(t, bin, "docker")
	log := filepath.Join(t.TempDir(), "argv")
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_DOCKER_LOG", log)
	t.Setenv("NV_DOCKER", "")
	t.Setenv("DOCKER_HOST", "")
	var errb bytes.Buffer
	code := run([]string{"run", "cuda"}, strings.NewReader(""), io.Discard, &errb, Plugin{Socket: sock})
	if code != 1 || !strings.Contains(errb.String(), `refusing the argument "--volume=/:/host"`) {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if _, err := os.Stat(log); err == nil {
		t.Error("docker ran")
	}
}

// driverRoots are the dev roots TestCheckArgs allows besides /.
var driverRoots = []string{"/run/nvidia/driver"}

func TestCheckArgs(t *testing.T) {
	good := []string{"--volume-driver=nvidia-docker", "--volume=nvidia_driver_580.159.04:/usr/local/nvidia:ro",
		"--device=/dev/nvidiactl", "--device=/dev/nvidia-uvm", "--device=/dev/nvidia-uvm-tools", "--device=/dev/nvidia7"}
	if err := CheckArgs(good, driverRoots); err != nil {
		t.Errorf("the plugin's own arguments: %v", err)
	}
	if err := CheckArgs([]string{"--volume-driver=nvidia-docker", "--volume=nvidia_driver_550.54:/usr/local/nvidia:ro",
		"--device=/run/nvidia/driver/dev/nvidiactl:/dev/nvidiactl", "--device=/run/nvidia/driver/dev/nvidia0:/dev/nvidia0"}, driverRoots); err != nil {
		t.Errorf("a driver container's nodes: %v", err)
	}
	for _, bad := range []string{
		"--privileged", "--pid=host", "-v", "/:/host", "--volume=/:/host", "--volume=/:/usr/local/nvidia:ro",
		"--volume=nvidia_driver_580:/usr/local/nvidia", "--volume=nvidia_driver_x:/usr/local/nvidia:ro",
		"--volume=nvidia_driver_580:/usr/local/nvidia:ro,rw", "--volume-driver=local", "--device=/dev/sda",
		"--device=/dev/sda:/dev/nvidia0", "--device=/dev/nvidia0:/dev/nvidia1", "--device=/x/../dev/nvidia0:/dev/nvidia0",
		"--device=/dev/nvidia0 ", "--device=/dev/nvidia0\n--privileged", "--device=/dev/nvidia-caps/nvidia-cap1",
		"--device=/dev/nvidiactl", // twice, with good's
		"--cap-add=SYS_ADMIN", "--security-opt=seccomp=unconfined", "",
		// A dev root no one configured: one another user controls, where
		// docker would follow their link (review of sec1).
		"--device=/tmp/attacker/dev/nvidia0:/dev/nvidia0", "--device=/home/u/dev/nvidia1:/dev/nvidia1",
	} {
		if err := CheckArgs(append(append([]string{}, good...), bad), driverRoots); err == nil {
			t.Errorf("CheckArgs accepted %q", bad)
		}
	}
	if err := CheckArgs(good[2:], driverRoots); err == nil {
		t.Error("accepted arguments without the volume")
	}
	if err := CheckArgs(append([]string{good[1]}, good...), driverRoots); err == nil {
		t.Error("accepted two volumes")
	}
}
