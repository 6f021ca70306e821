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
// `nvidia-docker version` prints "NVIDIA Docker: <version>" before docker's
// own output, as both generations did.
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
	i := commandIndex(args)
	if i < 0 {
		return args
	}
	at := -1
	switch args[i] {
	case "run", "create":
		at = i + 1
	case "container":
		if j := i + 1; j < len(args) && (args[j] == "run" || args[j] == "create") {
			at = j + 1
		}
	}
	if at < 0 {
		return args
	}
	out := make([]string, 0, len(args)+3)
	out = append(out, args[:at]...)
	out = append(out, "--runtime="+Runtime, "-e", "NVIDIA_VISIBLE_DEVICES="+VisibleDevices(gpus))
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

// isVersion reports whether docker is asked for its version ("docker version").
func isVersion(args []string) bool {
	i := commandIndex(args)
	return i >= 0 && args[i] == "version"
}

// Main runs nvidia-docker with args (without the program name) and returns
// the exit code: docker's, or 1 when docker could not be started.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
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
	full := append(append([]string{}, dockerCmd[1:]...), Rewrite(args, os.Getenv("NV_GPU"))...)
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
