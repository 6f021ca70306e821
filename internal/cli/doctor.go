package cli

import (
	"flag"
	"strings"

	"github.com/gantry-gpu/gantry/internal/doctor"
)

func init() {
	register(&command{
		name:    "doctor",
		summary: "Walk the chain from kernel driver to container and name the first broken link, with the fix",
		usage:   "[--json] [--container ID] [--pod NAMESPACE/NAME] [--kubelet-dir DIR]",
		help: `Checks, in order: the kernel driver, the device nodes and their major numbers,
NVML, persistence mode (advice only), the driver and CUDA versions, the driver files a container gets (and their
SONAME links), the cached inventory and CDI specs against the running driver,
Docker's, containerd's and CRI-O's configuration, and the hook Docker's --gpus
runs. A check whose prerequisite failed is skipped. With --container, also a
Docker container's GPU request and whether its device cgroup still allows the
GPU. On a Kubernetes node (--kubelet-dir exists), also whether a device plugin
is registered and how many nvidia.com/ devices the kubelet can allocate and has
in use; with --pod, the devices that pod's containers hold. Prints "PASS|FAIL|SKIP name: evidence" per check and a fix under each
failure. Exit code 0 when nothing failed, 1 otherwise.`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			asJSON := fs.Bool("json", false, "print the checks as JSON")
			container := fs.String("container", "", "also examine this Docker container (ID or name)")
			dockerConfig := fs.String("docker-config", doctor.DefaultDockerConfig, "Docker's daemon.json")
			containerdConfig := fs.String("containerd-config", doctor.DefaultContainerdConfig, "containerd's config.toml")
			crioDropins := fs.String("crio-dropins", doctor.DefaultCRIODropins, "CRI-O's drop-in directory")
			kubeletDir := fs.String("kubelet-dir", doctor.DefaultKubeletDir, "the kubelet's root directory (Kubernetes checks run when it exists)")
			pod := fs.String("pod", "", "also report the GPUs this pod holds (NAMESPACE/NAME, on this node)")
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				if *pod != "" {
					ns, name, ok := strings.Cut(*pod, "/")
					if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
						return usagef("--pod %q: want NAMESPACE/NAME, e.g. --pod default/cuda-test", *pod)
					}
				}
				checks := doctor.Run(doctor.Options{
					Config:           e.cfg,
					Container:        *container,
					DockerConfig:     *dockerConfig,
					ContainerdConfig: *containerdConfig,
					CRIODropins:      *crioDropins,
					KubeletDir:       *kubeletDir,
					Pod:              *pod,
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
