// Package nvdocker is the nvidia-docker command of NVIDIA's first container
// generation, for the scripts that still call it: `NV_GPU=0,1 nvidia-docker
// run IMAGE` runs `docker run --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=0,1
// IMAGE`, so the GPUs come through the runtime (gantry-runtime registered
// as "nvidia"); every other command is passed to docker unchanged.
//
// The environment, as nvidia-docker read it:
//   - NV_GPU: the GPUs, by index or UUID, separated by commas or spaces.
//     Unset or empty means all GPUs (nvidia-docker 1.0 gave every GPU; 2.0
//     left the choice to the image, whose CUDA base sets "all").
//   - NV_DOCKER: the docker command, split on white space ("sudo docker",
//     "/usr/local/bin/docker --config /etc/docker-ci"); default "docker".
//
// When nvidia-docker-plugin runs (gantry serve --volume-plugin answers on
// /run/docker/plugins/nvidia-docker.sock), the wrapper uses it, as
// nvidia-docker 1.0 did: run and create get the plugin's arguments for
// NV_GPU's GPUs:
// --volume-driver=nvidia-docker --volume=nvidia_driver_<version>:/usr/local/nvidia:ro
// and the --device flags, plus -e NVIDIA_VISIBLE_DEVICES=void, so that a
// GPU runtime Docker may run by default adds nothing to the GPUs chosen.
// It asks the plugin's own socket (GET /docker/cli/json), and only when
// root made it: the socket and each directory above it are root's and
// writable by no one else, and the server on it runs as root
// (SO_PEERCRED). It never asks the REST API on localhost:3476, where any
// local user may listen first ([::1], or 127.0.0.1 when the plugin was
// started with another -l). The answer must hold only the forms above
// (CheckArgs); anything else stops the wrapper before docker runs. The
// socket is root's, mode 0600, so only root's nvidia-docker uses the
// plugin; others get the runtime's arguments. A plugin that cannot be
// used (an older one without /docker/cli/json on its socket, a socket not
// root's) is passed over with a warning; one that refuses the GPUs (an
// unknown index) stops the wrapper. Only a docker talking to this host's
// daemon uses it (no -H, --host, --context, and DOCKER_HOST unset or
// unix://): a remote daemon gets the runtime's arguments as before.
//
// `nvidia-docker version` prints "NVIDIA Docker: <version>" before docker's
// own output, as both generations did; `nvidia-docker --help` (or help) a
// summary of NV_GPU and NV_DOCKER before docker's help.
//
// Docker is run as a child process with the wrapper's standard streams
// (a terminal stays a terminal); its exit status is the wrapper's, and
// SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to the wrapper are passed on.
package nvdocker

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/gantry-gpu/gantry/internal/version"
)

// Runtime is the runtime name Docker knows Gantry's shim by (gantry runtime
// configure registers it under NVIDIA's name too).
const Runtime = "nvidia"

// Docker's global options that take a value (docker --help); the command is
// the first word that is neither one of these, its value, nor another option.
var globalWithValue = map[string]bool{
	"--config": true, "-c": true, "--context": true, "-H": true, "--host": true,
	"-l": true, "--log-level": true, "--tlscacert": true, "--tlscert": true, "--tlskey": true,
}

// Rewrite returns the docker arguments for nvidia-docker's args with NV_GPU
// set to gpus: the runtime and the device selection go right after the run
// or create command (docker run, docker container run); anything else is
// returned as it came.
func Rewrite(args []string, gpus string) []string {
	at := runAt(args)
	if at < 0 {
		return args
	}
	return insert(args, at, "--runtime="+Runtime, "-e", "NVIDIA_VISIBLE_DEVICES="+VisibleDevices(gpus))
}

// runAt returns where the GPU arguments go in a run or create command
// line (right after the command), -1 for other commands.
func runAt(args []string) int {
	i := commandIndex(args)
	if i < 0 {
		return -1
	}
	switch args[i] {
	case "run", "create":
		return i + 1
	case "container":
		if j := i + 1; j < len(args) && (args[j] == "run" || args[j] == "create") {
			return j + 1
		}
	}
	return -1
}

func insert(args []string, at int, words ...string) []string {
	out := make([]string, 0, len(args)+len(words))
	out = append(out, args[:at]...)
	out = append(out, words...)
	return append(out, args[at:]...)
}

// VisibleDevices turns NV_GPU ("0,1", "0 1", "GPU-...") into an
// NVIDIA_VISIBLE_DEVICES value; empty means all.
func VisibleDevices(gpus string) string {
	ids := strings.FieldsFunc(gpus, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
	if len(ids) == 0 {
		return "all"
	}
	return strings.Join(ids, ",")
}

// commandIndex finds docker's command word after its global options; -1 if none.
func commandIndex(args []string) int {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return -1
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			return i
		}
		if globalWithValue[a] {
			i++ // its value
		}
	}
	return -1
}

// localDaemon reports whether docker talks to this host's daemon: no -H,
// --host or --context option, and DOCKER_HOST unset or a unix socket.
func localDaemon(args []string, dockerHost string) bool {
	if dockerHost != "" && !strings.HasPrefix(dockerHost, "unix://") {
		return false
	}
	end := commandIndex(args)
	if end < 0 {
		end = len(args)
	}
	for _, a := range args[:end] {
		name, _, _ := strings.Cut(a, "=")
		if name == "-H" || name == "--host" || name == "--context" || name == "-c" {
			return false
		}
	}
	return true
}

// isHelp reports whether docker is asked for its own help: --help or -h
// before any command, or the command help with nothing after it.
func isHelp(args []string) bool {
	i := commandIndex(args)
	if i >= 0 {
		return args[i] == "help" && i == len(args)-1
	}
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "--help" || a == "-h" {
			return true
		}
	}
	return false
}

// Usage is what nvidia-docker --help prints before docker's help.
const Usage = `nvidia-docker: docker with NVIDIA GPUs on run and create (Gantry).
  NV_GPU      the GPUs, by index or UUID, separated by commas or spaces
              (NV_GPU=0,1 nvidia-docker run ...); unset or empty: all GPUs
  NV_DOCKER   the docker command, split on white space (default docker)
run and create get --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=<NV_GPU>, or
nvidia-docker-plugin's volume and devices where it runs (as root, on this
host's daemon); every other command goes to docker unchanged.

`

// isVersion reports whether docker is asked for its version ("docker version").
func isVersion(args []string) bool {
	i := commandIndex(args)
	return i >= 0 && args[i] == "version"
}

// Main runs nvidia-docker with args (without the program name) and returns
// the exit code: docker's, or 1 when docker could not be started.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return run(args, stdin, stdout, stderr, DefaultPlugin)
}

// rewrite is Rewrite, or the plugin's arguments when it runs.
func rewrite(args []string, gpus string, p Plugin, stderr io.Writer) ([]string, error) {
	at := runAt(args)
	if at < 0 {
		return args, nil
	}
	if !localDaemon(args, os.Getenv("DOCKER_HOST")) {
		// The plugin serves this host's Docker only.
		return Rewrite(args, gpus), nil
	}
	words, err := p.Args(gpus)
	var unreachable *APIError
	if errors.As(err, &unreachable) {
		fmt.Fprintf(stderr, "nvidia-docker: warning: %v; using the runtime %q instead\n", err, Runtime)
		return Rewrite(args, gpus), nil
	}
	if err != nil {
		return nil, err
	}
	if words == nil {
		return Rewrite(args, gpus), nil
	}
	return insert(args, at, append(words, "-e", "NVIDIA_VISIBLE_DEVICES=void")...), nil
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer, p Plugin) int {
	dockerCmd := strings.Fields(os.Getenv("NV_DOCKER"))
	if len(dockerCmd) == 0 {
		dockerCmd = []string{"docker"}
	}
	bin, err := exec.LookPath(dockerCmd[0])
	if err != nil {
		fmt.Fprintf(stderr, "nvidia-docker: cannot find docker command %q: %v (install docker, or set NV_DOCKER to its path)\n", dockerCmd[0], err)
		return 1
	}
	if isVersion(args) {
		fmt.Fprintf(stdout, "NVIDIA Docker: %s (gantry)\n", version.Version)
	}
	if isHelp(args) {
		io.WriteString(stdout, Usage)
	}
	rewritten, err := rewrite(args, os.Getenv("NV_GPU"), p, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "nvidia-docker: %v\n", err)
		return 1
	}
	full := append(append([]string{}, dockerCmd[1:]...), rewritten...)
	cmd := exec.Command(bin, full...)
	cmd.Args[0] = dockerCmd[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr

	// Signals sent to the wrapper alone are passed on. Interrupts from a
	// terminal reach docker directly (same process group), so the wrapper
	// only catches them, to outlive docker and return its status. (Catching,
	// not ignoring: an ignored signal would stay ignored in docker.)
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGINT, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "nvidia-docker: starting %s: %v\n", bin, err)
		return 1
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				if s != syscall.SIGINT && s != syscall.SIGQUIT {
					cmd.Process.Signal(s)
				}
			case <-done:
				return
			}
		}
	}()
	err = cmd.Wait()
	close(done)
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	fmt.Fprintf(stderr, "nvidia-docker: running %s: %v\n", bin, err)
	return 1
}
