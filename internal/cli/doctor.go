package cli

import (
	"flag"
	"os"
	"strings"

	"github.com/gantry-gpu/gantry/internal/createproto"
	"github.com/gantry-gpu/gantry/internal/doctor"
)

func init() {
	register(&command{
		name:  "doctor",
		usage: "[--json] [--container ID [--namespace NS] [--runc-root DIR]] [--pod NAMESPACE/NAME] [--kubelet-dir DIR] [--node NAME] [--cri-socket PATH] [--create-server-socket PATH]",
		// The checks follow the engines registered (doctor.AllChecks).
		texts:   func() (string, string) { return doctorSummary, doctor.Help() + doctorHelp },
		errCode: 2,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			asJSON := fs.Bool("json", false, "print the checks as JSON")
			container := fs.String("container", "", "also examine this container: Docker (ID or name), else containerd (ID or unique prefix)")
			namespace := fs.String("namespace", "", "look --container up in this containerd namespace only (default: every namespace, after Docker)")
			runcRoot := fs.String("runc-root", doctor.DefaultRuncRoot, "runc's state directory (runc --root), for containers runc runs without an engine")
			containerdRoot := fs.String("containerd-root", "", "containerd's root directory (its config's root), where its content store keeps checkpoint images (default: that of the containerd at the CRI socket, else the root its --containerd-config sets, else "+doctor.DefaultContainerdRoot+")")
			containerdState := fs.String("containerd-state", "", "containerd's state directory (its config's state), where its tasks' bundles are (default: that of the containerd at --cri-socket when given, else "+doctor.DefaultContainerdState+")")
			criSocket := fs.String("cri-socket", "", "the CRI runtime service socket, for every check that reads containerd (its live configuration, --pod) (default: the first of "+strings.Join(criSockets, ", ")+" that exists)")
			serverSocket := fs.String("create-server-socket", "", "the create server's socket, which every GPU create of gantry-runtime asks first (default: $"+createproto.ServerSocketEnv+", else "+createproto.DefaultServerSocket+")")
			dockerConfig := fs.String("docker-config", doctor.DefaultDockerConfig, "Docker's daemon.json")
			dockerSocket := fs.String("docker-socket", dockerSocketDefault(), "the running dockerd's API socket, asked what runtimes it registered (default: $DOCKER_HOST when unix://, else "+doctor.DefaultDockerSocket+")")
			containerdConfig := fs.String("containerd-config", doctor.DefaultContainerdConfig, "containerd's config.toml")
			crioConfig := fs.String("crio-config", doctor.DefaultCRIOConfig, "CRI-O's main configuration file, read before its drop-ins")
			crioDropins := fs.String("crio-dropins", doctor.DefaultCRIODropins, "CRI-O's drop-in directory")
			podmanStorage := fs.String("podman-storage", doctor.DefaultPodmanStorage, "Podman's graph root: containers there mean Podman is in use (it takes GPUs only through CDI)")
			proc := fs.String("proc", "/proc", "the host's procfs, where dockerd's environment (its PATH, for the hook) is read; /host/proc when doctor runs in a container")
			kubeletDir := fs.String("kubelet-dir", doctor.DefaultKubeletDir, "the kubelet's root directory (Kubernetes checks run when it exists)")
			pod := fs.String("pod", "", "also report the GPUs this pod holds (NAMESPACE/NAME, on this node)")
			node := fs.String("node", "", "this node's Node name, for its capacity from the API server (default $NODE_NAME)")
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
					Proc:             *proc,
					Container:        *container,
					Namespace:        *namespace,
					RuncRoot:         *runcRoot,
					ContainerdState:  *containerdState,
					ContainerdRoot:   *containerdRoot,
					CRISocket:        *criSocket,
					CRISockets:       criSockets,
					RuntimeSocket:    *serverSocket,
					DockerConfig:     *dockerConfig,
					DockerSocket:     *dockerSocket,
					ContainerdConfig: *containerdConfig,
					CRIOConfig:       *crioConfig,
					CRIODropins:      *crioDropins,
					PodmanStorage:    *podmanStorage,
					KubeletDir:       *kubeletDir,
					Pod:              *pod,
					NodeName:         *node,
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

// criSockets are where doctor looks for a running containerd or CRI-O when
// --cri-socket is not given; the tests point them into a temporary
// directory, so that a CRI runtime running on the test's host is not judged.
var criSockets = doctor.DefaultCRISockets

// dockerSocketDefault is the socket the docker CLI would use.
func dockerSocketDefault() string {
	if p, ok := strings.CutPrefix(os.Getenv("DOCKER_HOST"), "unix://"); ok && p != "" {
		return p
	}
	return doctor.DefaultDockerSocket
}

const doctorSummary = "Walk the chain from kernel driver to container and name the first broken link, with the fix"

var doctorHelp = `

A check whose prerequisite failed is skipped and names it. With --container, the
container is a Docker container if the docker CLI knows the ID or name, else a
containerd task (any namespace, or --namespace) read from containerd's state
directory, else a container runc runs without an engine (its state under
--runc-root, default /run/runc). Its device cgroup is tested by a short-lived
host process placed in the container's cgroup that opens a 195:255 node
(the state NVML inside reports as "Failed to initialize NVML: Unknown Error");
nothing from the image runs (the probe needs root, and counts for a moment
against the container's memory and pids limits). With --pod, the pod's
containers are found through the CRI socket (--cri-socket) and examined the
same way. The Kubernetes checks run where --kubelet-dir exists; the Node is read
from the API server in a pod with a service account (NODE_NAME or --node names
it). Prints "PASS|FAIL|WARN|INFO|SKIP name: evidence" per check and a fix under
each failure and warning (INFO: a path not in use here, with the reason; WARN: a
risk that fails nothing, such as checkpoint images others can read). ` + doctor.ExitCodes
