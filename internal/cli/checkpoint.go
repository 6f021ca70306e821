package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
)

// gantry checkpoint and gantry restore: runc's checkpoint and restore of a
// container run with gantry-runtime, for users without an engine that
// checkpoints (the engines call gantry-runtime's checkpoint themselves).
func init() {
	register(&command{
		name:    "checkpoint",
		summary: "Checkpoint a running GPU container of gantry-runtime and runc (CUDA state included)",
		usage:   "CONTAINER",
		help: `Runs gantry-runtime checkpoint for CONTAINER (a runc container ID, in --root):
the CUDA state of its processes is moved to host memory (the driver's process
checkpoint API), CRIU dumps the container into --image-path (mode 0700, files
0600), and with --leave-running the container goes on. Needs CRIU 4.x (gantry
doctor says) and gantry-runtime beside this gantry (else /usr/bin).`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			root := fs.String("root", "/run/runc", "runc's state directory (containerd: /run/containerd/runc/NAMESPACE)")
			image := fs.String("image-path", "", "the checkpoint's directory (required)")
			work := fs.String("work-path", "", "CRIU's logs and work files (default: the image directory)")
			leave := fs.Bool("leave-running", false, "keep the container running after the checkpoint")
			return func(e *env, args []string) error {
				if len(args) != 1 {
					return usagef("name one container")
				}
				if *image == "" {
					return usagef("--image-path is required")
				}
				a := []string{"--root", *root, "checkpoint", "--image-path", *image}
				if *work != "" {
					a = append(a, "--work-path", *work)
				}
				if *leave {
					a = append(a, "--leave-running")
				}
				return runRuntime(e, append(a, args[0]))
			}
		},
	})
	register(&command{
		name:    "restore",
		summary: "Restore a GPU container checkpointed by gantry checkpoint (detached)",
		usage:   "CONTAINER",
		help: `Runs gantry-runtime restore --detach for CONTAINER from --image-path, with the
bundle --bundle (its config.json's GPU request decides the GPUs: another GPU of
the same model is mapped onto the checkpoint's where the driver allows, r580;
anything else is refused before the container is made).`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			root := fs.String("root", "/run/runc", "runc's state directory")
			image := fs.String("image-path", "", "the checkpoint's directory (required)")
			work := fs.String("work-path", "", "CRIU's logs and work files (default: the image directory)")
			bundle := fs.String("bundle", "", "the container's bundle (required)")
			return func(e *env, args []string) error {
				if len(args) != 1 {
					return usagef("name one container")
				}
				if *image == "" || *bundle == "" {
					return usagef("--image-path and --bundle are required")
				}
				a := []string{"--root", *root, "restore", "--detach", "--bundle", *bundle, "--image-path", *image}
				if *work != "" {
					a = append(a, "--work-path", *work)
				}
				return runRuntime(e, append(a, args[0]))
			}
		},
	})
}

// runRuntime runs gantry-runtime (beside this gantry, else /usr/bin) with
// args and this command's configuration.
func runRuntime(e *env, args []string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	rt := filepath.Join(filepath.Dir(self), "gantry-runtime")
	if !discover.IsExecutable(rt) {
		rt = "/usr/bin/gantry-runtime"
		if !discover.IsExecutable(rt) {
			return fmt.Errorf("gantry-runtime not found beside %s nor in /usr/bin: install it (make install)", self)
		}
	}
	cmd := exec.Command(rt, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, e.stdout, e.stderr
	cmd.Env = os.Environ()
	if e.cfgPath != "" {
		cmd.Env = append(cmd.Env, config.EnvPath+"="+e.cfgPath)
	}
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("gantry-runtime %s failed (exit %d)", args[2], ee.ExitCode())
		}
		return err
	}
	return nil
}
