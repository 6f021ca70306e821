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
		Name:     CheckInventoryCache,
		Verifies: "The runtime's cached driver inventories in `runtime.cache-dir` and which driver version each was made for. A stale one is reported, not failed: `gantry-runtime` replaces it on the next GPU container.",
	},
	{
		Name:     CheckCDISpecs,
		Verifies: "Every CDI spec of the configured kind in the configured spec directories was generated for the running driver (a spec from before a driver upgrade mounts libraries that are gone).",
		Failures: []FailureDoc{
			{"a spec generated for another driver version, or a file in a spec directory that is not a CDI spec",
				"regenerate it: `gantry cdi generate --output FILE` (it belongs in the driver upgrade procedure)"},
		},
	},
	{
		Name:     CheckDocker,
		Verifies: "Docker's `daemon.json` (`--docker-config`) registers a runtime that runs `gantry-runtime` or `nvidia-container-runtime`, and that program exists; skipped when Docker is not installed.",
		Failures: []FailureDoc{
			{"`dockerd` is installed but `daemon.json` does not exist, or it registers no GPU runtime",
				"`gantry runtime configure --runtime docker`, then `systemctl restart docker`"},
			{"a registered runtime's program does not exist or is not on `PATH`",
				"install `gantry-runtime` there, or re-register it (`gantry runtime configure --runtime docker`)"},
			{"the file is not valid JSON (dockerd will not start)", "correct the JSON, then register the runtime"},
			{"the file cannot be read", "make the file readable"},
		},
	},
	{
		Name:     CheckContainerd,
		Verifies: "Containerd's `config.toml` (`--containerd-config`; config versions 1, 2 and 3) registers a runtime whose `options.BinaryName` is `gantry-runtime` or `nvidia-container-runtime`, and that program exists; skipped when the file does not exist.",
		Failures: []FailureDoc{
			{"no GPU runtime registered",
				"`gantry runtime configure --runtime containerd`, then `systemctl restart containerd`"},
			{"a registered runtime's program does not exist or is not on `PATH`",
				"install `gantry-runtime` there, or re-register it (`gantry runtime configure --runtime containerd`)"},
			{"the file is not valid TOML (containerd will not start)", "correct the TOML"},
			{"the file cannot be read", "make the file readable"},
		},
	},
	{
		Name:     CheckCRIO,
		Verifies: "CRI-O's `/etc/crio/crio.conf` and its drop-ins (`--crio-dropins`, read in name order) register a runtime whose `runtime_path` is `gantry-runtime` or `nvidia-container-runtime`, and that program exists; skipped when neither exists.",
		Failures: []FailureDoc{
			{"no GPU runtime registered",
				"`gantry runtime configure --runtime crio`, then `systemctl restart crio`"},
			{"a registered runtime's program does not exist or is not on `PATH`",
				"install `gantry-runtime` there, or re-register it (`gantry runtime configure --runtime crio`)"},
			{"a file is not valid TOML (CRI-O will not start)", "correct the TOML"},
			{"a file cannot be read", "make the file readable"},
		},
	},
	{
		Name:     CheckHook,
		Verifies: "`nvidia-container-runtime-hook` is on `PATH`: `docker run --gpus` runs it; skipped when Docker is not installed.",
		Failures: []FailureDoc{
			{"the hook is not on `PATH`: `docker run --gpus` fails with \"could not select device driver\"",
				"`ln -s /usr/bin/gantry /usr/bin/nvidia-container-runtime-hook` (`make install` does it)"},
		},
	},
	{
		Name:     CheckContainer,
		Verifies: "With `--container ID`: what the Docker container asked for (runtime, `NVIDIA_VISIBLE_DEVICES`, `--gpus` device requests, CDI or `/dev/nvidia*` devices).",
		Failures: []FailureDoc{
			{"`docker inspect` fails (no such container, or no daemon reachable)",
				"name a running container (`docker ps`), and run doctor where the docker CLI reaches the daemon"},
			{"`NVIDIA_VISIBLE_DEVICES` is set but the container runs under plain runc, which ignores it",
				"run it with `--runtime nvidia`, or `--gpus all`, or `--device nvidia.com/gpu=all` (CDI)"},
			{"no GPU request at all",
				"run it with `--gpus all`, or `--runtime nvidia -e NVIDIA_VISIBLE_DEVICES=all`, or `--device nvidia.com/gpu=all` (CDI)"},
		},
	},
	{
		Name:     CheckContainerDevice,
		Verifies: "With `--container ID`, for a running container: it can open `/dev/nvidiactl` (`docker exec`), and on cgroup v1 its `devices.list` GPU rules.",
		Failures: []FailureDoc{
			{"`Operation not permitted`: the device cgroup no longer allows the GPU, which NVML inside reports as `Failed to initialize NVML: Unknown Error`; usually `systemctl daemon-reload` rewrote the cgroup",
				"restart the container; to stop it recurring give the GPUs through CDI (`--device nvidia.com/gpu=all`) or list the nodes with `--device`, so the rule is in the container's own config"},
			{"`No such device or address`: the cgroup allows the node but no kernel driver answers",
				"load the nvidia kernel module on the host (see " + CheckKernel + ")"},
			{"the container has no `/dev/nvidiactl`", "the container got no GPU: see " + CheckContainer},
			{"`docker exec` fails otherwise", "see the error; `docker exec` must work for this check"},
		},
	},
	{
		Name:     CheckDevicePlugin,
		Verifies: "On a Kubernetes node (the kubelet directory, `--kubelet-dir`, exists; skipped otherwise): a device plugin's socket is in `device-plugins/` next to the kubelet's registration socket `kubelet.sock`.",
		Failures: []FailureDoc{
			{"no `kubelet.sock` socket, or no `device-plugins/` directory",
				"is the kubelet running (`systemctl status kubelet`; `journalctl -u kubelet`), and is `--kubelet-dir` its root directory?"},
			{"no plugin socket next to `kubelet.sock`",
				"the device plugin is not running or not registered: `kubectl -n kube-system get pods -l app=gantry-device-plugin`; see its logs"},
		},
	},
	{
		Name:     CheckAllocatable,
		Verifies: "On a Kubernetes node: the kubelet's pod-resources API (`pod-resources/kubelet.sock`) lists allocatable `nvidia.com/` devices (`nvidia.com/gpu`, `nvidia.com/mig-…`); reports how many of each are allocatable and how many the node's pods hold.",
		Failures: []FailureDoc{
			{"no allocatable `nvidia.com/` device",
				"the device plugin is not running or not registered: `kubectl -n kube-system get pods -l app=gantry-device-plugin`; see its logs"},
			{"the pod-resources socket is missing or does not answer",
				"is the kubelet running (`systemctl status kubelet`), and is `--kubelet-dir` its root directory?"},
			{"the kubelet does not implement `GetAllocatableResources`",
				"upgrade the kubelet to 1.28 or later, or enable the `KubeletPodResourcesGetAllocatable` feature gate"},
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
}
