package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/ctrckpt"
	"github.com/gantry-gpu/gantry/internal/cudackpt"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
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
doctor says) and gantry-runtime beside this gantry (else /usr/bin).

gantry checkpoint --assess CONTAINER says, changing nothing, why the container
could not be checkpointed, from the driver's documented limits and what /proc
shows of its processes (found from its cgroup, each in its mount namespace):
"refused" (an MPS client, a host other than x86-64: a checkpoint is refused
before anything is done) or "warning" (/dev/nvidia-uvm held: managed memory
fails the checkpoint, and the container goes on; several CUDA processes: one
that imported another's GPU memory is lost at restore; NCCL; GPUs of several
models). Exit status 1 when refused.

gantry checkpoint --probe-remap (no container) asks the driver whether it
restores a CUDA process onto another GPU of the same model: a small CUDA
process of its own is checkpointed on one GPU and restored onto another (pairs
naming every GPU), and the verdict is printed and kept per driver version in
runtime.cache-dir (/run/gantry/cuda-remap-VERSION.json), where a restore onto
other GPUs reads it (and probes when there is none) before anything is changed.
Exit status 0 when the driver can (or the host has no two GPUs of one model and
restore with GPU pairs works), 1 when it cannot.`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			root := fs.String("root", "/run/runc", "runc's state directory (containerd: /run/containerd/runc/NAMESPACE)")
			image := fs.String("image-path", "", "the checkpoint's directory (required)")
			work := fs.String("work-path", "", "CRIU's logs and work files (default: the image directory)")
			leave := fs.Bool("leave-running", false, "keep the container running after the checkpoint")
			probe := fs.Bool("probe-remap", false, "probe whether the driver restores onto other GPUs (no container)")
			assess := fs.Bool("assess", false, "only say why CONTAINER could not be checkpointed (refusals and warnings); changes nothing")
			return func(e *env, args []string) error {
				if *assess {
					if len(args) != 1 {
						return usagef("name one container")
					}
					return assessContainer(e, *root, args[0])
				}
				if *probe {
					if len(args) != 0 {
						return usagef("--probe-remap takes no container")
					}
					return probeRemap(e)
				}
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
				if err := runRuntime(e, append(a, args[0])); err != nil {
					return err
				}
				printTimings(e, *image, false)
				return nil
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
				if err := runRuntime(e, append(a, args[0])); err != nil {
					return err
				}
				printTimings(e, *image, true)
				return nil
			}
		},
	})
}

// printTimings prints the phases gantry-runtime noted in the image's
// record (ctrckpt.Timings), when it has them.
func printTimings(e *env, image string, restore bool) {
	rec, found, err := ctrckpt.ReadRecord(image)
	if err != nil || !found {
		return
	}
	t := rec.Timings
	if restore {
		t = rec.LastRestore
	}
	if t != nil {
		fmt.Fprintf(e.stdout, "timings: %s\n", t)
	}
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

// probeRemap runs the driver probe of restores onto other GPUs, afresh,
// keeps and prints its verdict.
func probeRemap(e *env) error {
	inv, err := driver.Discover(driver.Options{Root: e.cfg.DriverRoot, DevRoot: e.cfg.DevRoot})
	if err != nil {
		return fmt.Errorf("the NVIDIA driver: %w", err)
	}
	lib := ""
	for _, l := range inv.Libraries {
		if l.SONAME == "libcuda.so.1" && l.Capability != driver.Compat32 {
			lib = l.HostPath
			break
		}
	}
	if lib == "" {
		return fmt.Errorf("no libcuda.so.1 among the driver's libraries (driver %s)", inv.Version)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	v, _, err := cudackpt.Probe(self, cudackpt.ProbeRequest{Lib: lib, CacheDir: e.cfg.Runtime.CacheDir, DriverVersion: inv.Version, Fresh: true})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "remap: %s\n%s\n", v.Remap, v)
	if e.cfg.Runtime.CacheDir != "" {
		fmt.Fprintf(e.stdout, "kept in %s\n", cudackpt.CacheFile(e.cfg.Runtime.CacheDir, inv.Version))
	}
	if !v.Allows() {
		return fmt.Errorf("restores onto other GPUs are refused on this driver (%s)", v.Remap)
	}
	return nil
}

// assessContainer prints why container id (runc, in root) could not be
// checkpointed.
func assessContainer(e *env, root, id string) error {
	runc, err := exec.LookPath("runc")
	if err != nil {
		return fmt.Errorf("runc: %w", err)
	}
	st, err := ctrckpt.Runtime{Path: runc, Global: []string{"--root", root}}.State(id)
	if err != nil {
		return err
	}
	if st.Status != "running" {
		return fmt.Errorf("container %s is %s: only a running container is examined", id, st.Status)
	}
	fs, err := ctrckpt.Assess(st.PID, nil)
	if err != nil {
		return err
	}
	if len(fs) == 0 {
		fmt.Fprintf(e.stdout, "container %s: nothing known keeps it from a checkpoint\n", id)
	}
	for _, f := range fs {
		fmt.Fprintf(e.stdout, "container %s: %s\n", id, f)
	}
	if r := ctrckpt.Refusals(fs); r != "" {
		return fmt.Errorf("container %s cannot be checkpointed", id)
	}
	return nil
}
