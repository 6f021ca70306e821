package cli

import (
	"flag"

	"github.com/gantry-gpu/gantry/internal/doctor"
)

func init() {
	register(&command{
		name:    "doctor",
		summary: "Walk the chain from kernel driver to container and name the first broken link, with the fix",
		usage:   "[--json] [--container ID]",
		help: `Checks, in order: the kernel driver, the device nodes and their major numbers,
NVML, the driver and CUDA versions, the driver files a container gets (and their
SONAME links), the cached inventory and CDI specs against the running driver,
Docker's, containerd's and CRI-O's configuration, and the hook Docker's --gpus
runs. A check whose prerequisite failed is skipped. With --container, also a
Docker container's GPU request and whether its device cgroup still allows the
GPU. Prints "PASS|FAIL|SKIP name: evidence" per check and a fix under each
failure. Exit code 0 when nothing failed, 1 otherwise.`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			asJSON := fs.Bool("json", false, "print the checks as JSON")
			container := fs.String("container", "", "also examine this Docker container (ID or name)")
			dockerConfig := fs.String("docker-config", doctor.DefaultDockerConfig, "Docker's daemon.json")
			containerdConfig := fs.String("containerd-config", doctor.DefaultContainerdConfig, "containerd's config.toml")
			crioDropins := fs.String("crio-dropins", doctor.DefaultCRIODropins, "CRI-O's drop-in directory")
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				checks := doctor.Run(doctor.Options{
					Config:           e.cfg,
					Container:        *container,
					DockerConfig:     *dockerConfig,
					ContainerdConfig: *containerdConfig,
					CRIODropins:      *crioDropins,
				})
				var err error
				if *asJSON {
					err = writeJSON(e.stdout, checks)
				} else {
					err = doctor.Write(e.stdout, checks)
				}
				if err != nil {
					return err
				}
				if doctor.Failed(checks) {
					return exitCode(1)
				}
				return nil
			}
		},
	})
}
