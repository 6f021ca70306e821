package doctor

// CheckDoc describes one check for people: what it verifies and each way
// it fails, with the fix doctor prints. docs/troubleshooting.md is
// generated from Catalog (go test ./docs -update).
type CheckDoc struct {
	Name     string
	Verifies string
	Failures []FailureDoc
}

// FailureDoc is one failure of a check: what doctor reports and the fix.
type FailureDoc struct {
	Reports string
	Fix     string
}

// ExitCodes says what gantry doctor's exit code means; --help and
// docs/troubleshooting.md both print it.
const ExitCodes = "The exit code is 0 when nothing failed on the GPU paths in use here (an engine present but not used for GPUs, or a container that asked for no GPU, is INFO or SKIP with the reason, not a failure), 1 when a check failed, and 2 when doctor itself could not run (a bad flag or argument, a configuration file it cannot load, output it cannot write)."

// Catalog lists every check in the order Run reports them. A test keeps it
// in step with the Check* names.
var Catalog = []CheckDoc{
	{
		Name:     CheckKernel,
		Verifies: "The NVIDIA kernel module is loaded: its version file, `proc/driver/nvidia/version` under the driver root, else the host's `/proc/driver/nvidia/version` or `/sys/module/nvidia/version`.",
		Failures: []FailureDoc{
			{"no version file anywhere: the nvidia kernel module is not loaded",
				"load the kernel module (`modprobe nvidia`, or start the driver container), or point `--driver-root` at the driver install"},
			{"the version file exists but cannot be read",
				"check the file's permissions; it is written by the nvidia kernel module"},
		},
	},
	{
		Name:     CheckDeviceNodes,
		Verifies: "Under the dev root: `/dev/nvidiactl` is the character device 195:255, `/dev/nvidia-uvm` has the major the kernel gave `nvidia-uvm` in `/proc/devices`, and at least one `/dev/nvidiaN` with major 195 exists.",
		Failures: []FailureDoc{
			{"`/dev/nvidiactl` missing or not 195:255; `nvidia-uvm` not in `/proc/devices` (the module is not loaded; CUDA needs it); `/dev/nvidia-uvm` missing or with a stale major from an earlier boot; no `/dev/nvidiaN`",
				"create the nodes: `nvidia-modprobe -c=0 -u` (or `modprobe nvidia-uvm`, then `nvidia-smi` as root), or set `--dev-root` to where the driver container made them"},
		},
	},
	{
		Name:     CheckNVML,
		Verifies: "NVML (`libnvidia-ml.so.1`) loads and initialises and lists the GPUs; skipped when the GPUs are simulated (`--gpus sim:…`), and when the kernel driver or the device nodes failed.",
		Failures: []FailureDoc{
			{"NVML cannot be loaded or initialised",
				"make sure `libnvidia-ml.so.1` of the running driver is in the driver root's `ld.so.cache`; after a driver upgrade, reboot or reload the kernel modules"},
			{"the simulated host cannot be read (`--gpus sim:…`)",
				"fix the `--gpus` value or the simulator file"},
		},
	},
	{
		Name:     CheckGPUNodes,
		Verifies: "Each GPU the driver reports (NVML, or the simulated host) has its own node `/dev/nvidia<minor>`, the character device 195:<minor>; skipped when no GPUs were reported.",
		Failures: []FailureDoc{
			{"GPU N's node is missing or has the wrong numbers (the evidence names the GPU, its UUID and the node)",
				"create the node: `nvidia-modprobe -c=<minor>` (or `mknod -m 666 /dev/nvidiaN c 195 N`; or restart the driver container that makes them)"},
		},
	},
	{
		Name:     CheckPersistence,
		Verifies: "Every GPU has persistence mode on (NVML). Advice, never a failure: without it the driver tears a GPU down when its last client exits, so each container start initialises it again; the evidence names the GPUs with it off, and says to run `nvidia-smi -pm 1` or `nvidia-persistenced`. Skipped when the GPUs are simulated or NVML did not pass.",
	},
	{
		Name:     CheckVersions,
		Verifies: "The driver version NVML reports is the kernel module's, and the CUDA version the driver supports.",
		Failures: []FailureDoc{
			{"NVML reports another driver version than the kernel module (`Driver/library version mismatch`)",
				"the user-space driver was upgraded but the old kernel module is still loaded: reboot, or unload and reload the nvidia modules"},
		},
	},
	{
		Name:     CheckDriverFiles,
		Verifies: "The driver files Gantry would inject (libraries, programs, firmware) are found under the driver root, the core ones (libcuda, libnvidia-ml, nvidia-smi) among them, and each library's SONAME link resolves to it.",
		Failures: []FailureDoc{
			{"no driver under the driver root", "point `--driver-root` at the driver install"},
			{"core driver files not found", "reinstall the driver's user-space libraries for the running version"},
			{"SONAME links (`libcuda.so.1`, …) missing, dangling or leading to another file",
				"recreate the SONAME links: `ldconfig` (`ldconfig -r DRIVER_ROOT` for another driver root)"},
		},
	},
	{
		Name:     CheckLoaderCache,
		Verifies: "The driver root's `/etc/ld.so.cache` is a loader cache that lists every driver library beside `libcuda` and `libnvidia-ml` by its SONAME: NVML on the host and every program linked to `libcuda` find them through it, so a corrupt cache, or one written before the driver was installed, breaks them while the files are fine.",
		Failures: []FailureDoc{
			{"the cache is missing, corrupt or not a loader cache (the evidence names the file)",
				"rebuild the cache: `ldconfig` (`ldconfig -r ROOT` for a driver root)"},
			{"the cache has no entry for some driver libraries (the evidence names them)",
				"rebuild the cache: `ldconfig` (`ldconfig -r ROOT` for a driver root)"},
		},
	},
	{
		Name:     CheckInventoryCache,
		Verifies: "The runtime's cached driver inventories in `runtime.cache-dir` and which driver version each was made for. A stale one is reported, not failed: `gantry-runtime` replaces it on the next GPU container.",
	},
	{
		Name:     CheckCDISpecs,
		Verifies: "Every CDI spec of the configured kind in the configured spec directories was generated for the running driver (a spec from before a driver upgrade mounts libraries that are gone).",
		Failures: []FailureDoc{
			{"a spec's hooks (spec-wide or a device's) have no explicit `env`: a runtime runs such a hook as root on the host with the container image's environment, the CVE-2025-23266 class (the evidence names the file and the hooks)",
				"regenerate it: `gantry cdi generate --output FILE`"},
			{"a spec generated for another driver version, or a file in a spec directory that is not a CDI spec",
				"regenerate it: `gantry cdi generate --output FILE` (it belongs in the driver upgrade procedure)"},
		},
	},
	{
		Name:     CheckDocker,
		Verifies: "Docker's `daemon.json` (`--docker-config`) registers a runtime that runs `gantry-runtime` or `nvidia-container-runtime`, and that program exists; skipped when Docker is not installed. Only the Docker paths in use can fail: when the file registers no GPU runtime but the hook is on dockerd's `PATH`, `docker run --gpus` works and only `--runtime nvidia` is unavailable (INFO); when neither is set up (no `daemon.json` or no GPU runtime in it, and no hook), Docker is not used for GPU containers on this host, e.g. a Kubernetes node (INFO, with the command that sets it up).",
		Failures: []FailureDoc{
			{"`daemon.json` registers a GPU runtime (or a default runtime) that the running dockerd, asked over its socket (`GET /info` on `--docker-socket`, default `$DOCKER_HOST` or `/var/run/docker.sock`), does not have: the file changed and dockerd was not restarted (`docker run --runtime nvidia` says \"Unknown runtime specified\")",
				"`systemctl restart docker` (dockerd reads daemon.json when it starts)"},
			{"a registered runtime's program does not exist or is not on `PATH`",
				"install `gantry-runtime` there, or re-register it (`gantry runtime configure --runtime docker`)"},
			{"the file is not valid JSON (dockerd will not start)", "correct the JSON, then register the runtime"},
			{"the file cannot be read", "make the file readable"},
		},
	},
	{
		Name:     CheckContainerd,
		Verifies: "The running containerd's configuration, asked over its CRI socket (`--cri-socket`, default the first of `/run/containerd/containerd.sock`, `/run/crio/crio.sock` that is containerd's: CRI `Status` with verbose info), else its `config.toml` (`--containerd-config`; config versions 1, 2 and 3) with the files its `imports` name (such as the drop-in `/etc/containerd/conf.d/99-nvidia.toml` that `nvidia-ctk runtime configure` writes), registers a runtime whose `options.BinaryName` is `gantry-runtime` or `nvidia-container-runtime`, and that program exists; skipped when neither answers nor exists. A config that registers no GPU runtime is INFO, not a failure, where containerd runs no GPU containers through CRI: its CRI plugin is disabled (`disabled_plugins = [\"cri\"]`, Docker CE's config) or this is no Kubernetes node (no `--kubelet-dir`; Debian's containerd under Docker).",
		Failures: []FailureDoc{
			{"no GPU runtime registered on a Kubernetes node",
				"`gantry runtime configure --runtime containerd`, then `systemctl restart containerd`"},
			{"a file `imports` names does not parse",
				"correct it, or run `nvidia-ctk runtime configure --runtime=containerd` again to regenerate Gantry's drop-in"},
			{"a registered runtime's program does not exist or is not on `PATH`",
				"install `gantry-runtime` there, or re-register it (`gantry runtime configure --runtime containerd`)"},
			{"the file is not valid TOML (containerd will not start)", "correct the TOML"},
			{"the file cannot be read", "make the file readable"},
		},
	},
	{
		Name:     CheckCRIO,
		Verifies: "CRI-O's `/etc/crio/crio.conf` and its drop-ins (`--crio-dropins`, read in name order) register a runtime whose `runtime_path` is `gantry-runtime` or `nvidia-container-runtime`, and that program exists; skipped when neither exists. No GPU runtime is INFO when this is no Kubernetes node: CRI-O serves only a kubelet.",
		Failures: []FailureDoc{
			{"no GPU runtime registered on a Kubernetes node",
				"`gantry runtime configure --runtime crio`, then `systemctl restart crio`"},
			{"a registered runtime's program does not exist or is not on `PATH`",
				"install `gantry-runtime` there, or re-register it (`gantry runtime configure --runtime crio`)"},
			{"a file is not valid TOML (CRI-O will not start)", "correct the TOML"},
			{"a file cannot be read", "make the file readable"},
		},
	},
	{
		Name:     CheckHook,
		Verifies: "`nvidia-container-runtime-hook` is on dockerd's `PATH`, read from `/proc/PID/environ` of the running `dockerd` (systemd's default service `PATH` when none runs), not doctor's: `docker run --gpus` makes dockerd look it up there; skipped when Docker is not installed. When the hook is missing but Docker's `--runtime nvidia` path works (docker config passes), only `--gpus` is unavailable: INFO, not a failure.",
		Failures: []FailureDoc{
			{"the hook is installed (on doctor's `PATH`) but not on dockerd's: `docker run --gpus` fails with \"could not select device driver\" (a hook installed nowhere means `--gpus` is not set up: INFO)",
				"`ln -s gantry-runtime /usr/bin/nvidia-container-runtime-hook` (`make install` does it), or add its directory to dockerd's `PATH` (an `Environment=PATH=` line in `docker.service`), then `systemctl restart docker`"},
		},
	},
	{
		Name:     CheckContainer,
		Verifies: "With `--container ID`: what the container asked for and what it got. A Docker container (when the docker CLI knows the ID or name): its runtime, `NVIDIA_VISIBLE_DEVICES`, `--gpus` device requests, CDI or `/dev/nvidia*` devices. Else a containerd task (every namespace, or `--namespace`), read from its bundle under `--containerd-state` (`io.containerd.runtime.v2.task/NAMESPACE/ID/config.json`, the OCI spec as the runtime ran it): `NVIDIA_VISIBLE_DEVICES`, `NVIDIA_DRIVER_CAPABILITIES`, `cdi.k8s.io/` annotations, the runc binary, and what was injected (`/dev/nvidia*` devices, driver mounts). With `--pod`, the same for each of the pod's containers, with the devices the kubelet assigned. A container that asked for no GPU is INFO (\"no GPU requested\"), and its device access is not probed: it is not broken.",
		Failures: []FailureDoc{
			{"neither Docker nor containerd knows the container (no such container, no daemon reachable, or containerd's state elsewhere)",
				"name a running container (`docker ps`; `ctr -n NAMESPACE tasks ls`; `crictl ps`) and run doctor as root on its host; for containerd give `--namespace`, and `--containerd-state` if its state directory is not `/run/containerd`"},
			{"a containerd container asks for GPUs (`NVIDIA_VISIBLE_DEVICES`, CDI annotations) but its spec has no `/dev/nvidia*` device: the runtime is not registered, or runc was used directly",
				"`gantry runtime configure --runtime containerd`, then `systemctl restart containerd`, and recreate the container under that runtime (Kubernetes: `runtimeClassName: nvidia`, or make it containerd's default runtime; ctr: `ctr run --runc-binary /usr/bin/gantry-runtime`)"},
			{"`NVIDIA_VISIBLE_DEVICES` is set but the container runs under plain runc, which ignores it",
				"run it with `--runtime nvidia`, or `--gpus all`, or `--device nvidia.com/gpu=all` (CDI)"},
		},
	},
	{
		Name:     CheckContainerDevice,
		Verifies: "With `--container ID` (or `--pod`), for a running container: its device cgroup still allows `/dev/nvidiactl` (195:255), and the container has the node. Nothing from the image runs: a short-lived host process (doctor's own binary) is placed in the container's cgroup (cgroup v2: created there with `clone3` `CLONE_INTO_CGROUP`; v1: moved into its devices cgroup) and opens a 195:255 node on the host; the kernel checks the open against the container's rules (the v1 `devices.list`, shown as evidence, or the eBPF program on v2). `No such device or address` there means allowed, with no driver behind the node (a host without a GPU).",
		Failures: []FailureDoc{
			{"`operation not permitted`: the device cgroup no longer allows the GPU, which NVML inside reports as `Failed to initialize NVML: Unknown Error`; usually `systemctl daemon-reload` rewrote the cgroup (the evidence says when the container's spec has no rule for 195:255 either)",
				"restart the container (`docker restart ID`; containerd: `ctr -n NS task kill -s SIGKILL ID`, `ctr -n NS task delete ID`, `ctr -n NS task start ID`; Kubernetes: `kubectl delete pod -n NS NAME` so it is recreated); to stop it recurring give the GPUs through the runtime or CDI (`--device nvidia.com/gpu=all`) or list the nodes with `--device`, so the rule is in the container's own config; on systemd hosts also create the `/dev/char` links systemd resolves device rules through: `nvidia-ctk system create-dev-char-symlinks --create-all` (NVIDIA's lasting fix; Gantry answers to `nvidia-ctk`)"},
			{"the container has no `/dev/nvidiactl`", "the container got no GPU: see " + CheckContainer},
			{"the probe cannot run (not root, the process is gone, the cgroup is frozen by a pause) or its open fails in a way that says nothing about the cgroup",
				"run doctor as root on the container's host; see the error"},
		},
	},
	{
		Name:     CheckDevicePlugin,
		Verifies: "On a Kubernetes node (the kubelet directory, `--kubelet-dir`, exists; skipped otherwise): a device plugin serves a socket in `device-plugins/` next to the kubelet's registration socket `kubelet.sock`, and each socket named as NVIDIA's (`nvidia-gpu.sock`, `nvidia-mig-….sock`; Gantry's plugin uses the same names) answers `GetDevicePluginOptions` within 3 s, as the kubelet asks it. Gantry's plugin names its resource in a response header; another vendor's plugin sockets are listed, not checked.",
		Failures: []FailureDoc{
			{"no `kubelet.sock` socket, or no `device-plugins/` directory",
				"is the kubelet running (`systemctl status kubelet`; `journalctl -u kubelet`), and is `--kubelet-dir` its root directory?"},
			{"no plugin socket next to `kubelet.sock`",
				"the device plugin is not running or not registered: `kubectl -n kube-system get pods -l app.kubernetes.io/name=gantry --field-selector spec.nodeName=NODE -o wide`; see its logs: `kubectl -n kube-system logs POD`"},
			{"stale registration: connection refused on a plugin socket, nothing serves it any more (the plugin crashed or was killed and left its socket)",
				"check the plugin's pod and logs (as above); restarting it (`kubectl -n kube-system delete pod POD`; the DaemonSet makes a new one) serves the socket and registers again; a socket no plugin will serve again can be deleted. The kubelet counts the resource's devices as unhealthy once the plugin's stream ends"},
			{"a plugin socket accepts but does not answer within 3 s (the plugin is hung)",
				"see the plugin's logs and restart it: `kubectl -n kube-system delete pod POD`"},
		},
	},
	{
		Name:     CheckPluginHealth,
		Verifies: "Per resource, the devices Gantry's plugin advertises and their health, from its first `ListAndWatch` answer (the list the kubelet acts on): N devices, M healthy, the unhealthy IDs and the pods holding them. Doctor's stream ends as soon as it has the answer and does not disturb the kubelet's. The `ListAndWatch` of NVIDIA's k8s-device-plugin is not opened: it hands each health change to one stream only, and a stream opened beside the kubelet's would take the next one from it; its health is then seen in `" + CheckNode + "`.",
		Failures: []FailureDoc{
			{"a device is unhealthy (an XID such as 79 or 48, a double-bit ECC error, a GPU fallen off the bus): the kubelet no longer offers it, pods holding it keep it",
				"see why in the Node's events (`kubectl get events -A --field-selector involvedObject.kind=Node,involvedObject.name=NODE`; reason `GPUUnhealthy`) and the plugin's log; the plugin returns a GPU to healthy after its quiet period (`gantry.health.recoveryQuietPeriod`, default 10m) without a new error; for a persistent fault drain the node (`kubectl drain NODE --ignore-daemonsets`), reset the GPU (`nvidia-smi -r -i UUID`) or reboot, then `kubectl uncordon NODE`; delete the pods that hold it"},
		},
	},
	{
		Name:     CheckAllocatable,
		Verifies: "On a Kubernetes node: the kubelet's pod-resources API (`pod-resources/kubelet.sock`) lists allocatable `nvidia.com/` devices (`nvidia.com/gpu`, `nvidia.com/mig-…`); reports how many of each are allocatable and how many the node's pods hold, and compares them with what Gantry's plugin advertises: the kubelet offers exactly a registered plugin's healthy devices.",
		Failures: []FailureDoc{
			{"no allocatable `nvidia.com/` device",
				"the device plugin is not running or not registered (see `" + CheckDevicePlugin + "`), or every GPU is unhealthy (see `" + CheckPluginHealth + "`)"},
			{"the plugin advertises healthy devices the kubelet does not offer (the plugin is not registered with this kubelet), or the kubelet still offers devices the plugin reports unhealthy (its stream from the plugin is behind; kubelets before 1.23 listed unhealthy devices here too)",
				"restart the device plugin so it registers again (`kubectl -n kube-system delete pod POD`), and see the kubelet's log (`journalctl -u kubelet | grep -i 'device plugin'`)"},
			{"the pod-resources socket is missing or does not answer",
				"is the kubelet running (`systemctl status kubelet`), and is `--kubelet-dir` its root directory?"},
			{"the kubelet does not implement `GetAllocatableResources`",
				"upgrade the kubelet to 1.28 or later, or enable the `KubeletPodResourcesGetAllocatable` feature gate"},
		},
	},
	{
		Name:     CheckCheckpoint,
		Verifies: "The kubelet's device checkpoint, `device-plugins/kubelet_internal_checkpoint` (JSON: `Data.RegisteredDevices`, the healthy devices when it was written, and `Data.PodDeviceEntries`, which container holds which device; both formats, before and since Kubernetes 1.20; its checksum is not verified): how many `nvidia.com/` devices are registered and held by pods. Skipped when the kubelet has not written one.",
		Failures: []FailureDoc{
			{"the file is not the kubelet's checkpoint JSON",
				"the kubelet cannot read it either and forgets which containers hold which devices: see `journalctl -u kubelet`; the kubelet rewrites it when it allocates devices again"},
			{"pods hold devices the plugin no longer advertises (the GPUs were reconfigured, e.g. MIG, or the plugin's resources changed)",
				"delete those pods so they are scheduled again (the evidence names their UIDs; `kubectl get pods -A -o custom-columns=NS:.metadata.namespace,NAME:.metadata.name,UID:.metadata.uid` finds them)"},
		},
	},
	{
		Name:     CheckNode,
		Verifies: "What the scheduler sees: the Node's `status.capacity` (every device) and `status.allocatable` (the healthy ones) for `nvidia.com/` resources, read from the API server with plain HTTPS when doctor runs in a pod with a service account (`KUBERNETES_SERVICE_HOST`, `/var/run/secrets/kubernetes.io/serviceaccount`) that may get nodes, for the Node `NODE_NAME` (`--node`); compared with what Gantry's plugin advertises. Skipped, never failed, without credentials or when the API server cannot be reached.",
		Failures: []FailureDoc{
			{"allocatable is less than capacity: some GPUs are unhealthy (named when Gantry's plugin reports them)",
				"as for `" + CheckPluginHealth + "`: see the Node's events and the plugin's log; wait for the quiet period, or drain the node and reset the GPU"},
			{"the Node's capacity differs from the number of devices the plugin advertises, or the Node has no `nvidia.com/` resource",
				"the kubelet updates the Node every few seconds: if it persists, restart the device plugin so it registers again and see `journalctl -u kubelet`"},
		},
	},
	{
		Name:     CheckPod,
		Verifies: "With `--pod NAMESPACE/NAME`: the `nvidia.com/` devices (resource and device IDs) each of the pod's containers holds, from the kubelet's pod-resources API.",
		Failures: []FailureDoc{
			{"the pod holds no GPU", "give its containers `resources.limits` `nvidia.com/gpu: N` (or a MIG resource) and recreate the pod"},
			{"the pod is not among the kubelet's pods, or this is not a Kubernetes node",
				"run doctor on the node the pod runs on (`kubectl get pod -n NAMESPACE NAME -o wide`), or point `--kubelet-dir` at the kubelet's root directory"},
		},
	},
	{
		Name:     CheckPodContainers,
		Verifies: "With `--pod NAMESPACE/NAME`: the pod's sandbox and containers, asked of the CRI runtime service (`--cri-socket`; default the first of `/run/containerd/containerd.sock`, `/run/crio/crio.sock`) by the kubelet's labels `io.kubernetes.pod.namespace` and `io.kubernetes.pod.name`. Each container is then examined as `" + CheckContainer + "` and `" + CheckContainerDevice + "` (its spec from containerd's task bundle, else the one the runtime reports; its pid from the verbose container status).",
		Failures: []FailureDoc{
			{"no CRI socket, or the runtime service does not answer",
				"is the container engine running with its CRI service (containerd: the cri plugin is not in `disabled_plugins`; CRI-O: `systemctl status crio`), and is `--cri-socket` its socket?"},
			{"the runtime has no sandbox for the pod: it does not run on this node",
				"run doctor on the node the pod runs on (`kubectl get pod -n NAMESPACE NAME -o wide`), or point `--cri-socket` at the engine that runs it"},
			{"the pod has no containers yet", "wait until the pod's containers are created (`kubectl describe pod -n NAMESPACE NAME`)"},
		},
	},
}
