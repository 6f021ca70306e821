package doctor

import "github.com/gantry-gpu/gantry/internal/createproto"

// CheckDef is one check of gantry doctor, the one place it is described:
// its name, what it needs to run, how it runs, and its documentation with
// each way it fails and the fix. Run runs Checks in order; --help lists
// them (Help) and docs/troubleshooting.md is generated from them
// (Troubleshooting; go generate ./internal/doctor).
type CheckDef struct {
	Name string
	// Summary is the line --help shows.
	Summary string
	// Needs are the conditions the check runs under; when one does not
	// hold, Run reports the check as SKIP with the reason (or, for
	// NeedContainer and NeedPod, leaves it out).
	Needs    []Need
	Verifies string
	Failures []FailureDoc
	run      func(*env) []Check
}

// FailureDoc is one failure of a check: what doctor reports and the fix.
type FailureDoc struct {
	Reports string
	Fix     string
}

// ExitCodes says what gantry doctor's exit code means; --help and
// docs/troubleshooting.md both print it.
const ExitCodes = "The exit code is 0 when nothing failed on the GPU paths in use here (an engine present but not used for GPUs, or a container that asked for no GPU, is INFO or SKIP with the reason, not a failure; nor is a WARN, a risk named with its fix), 1 when a check failed, and 2 when doctor itself could not run (a bad flag or argument, a configuration file it cannot load, output it cannot write)."

// createServerVerifies is what the engine checks say of the create
// server (createserver.go).
const createServerVerifies = " For each registered runtime that is a Gantry binary, the PASS line says what the create server (`gantry-runtime --create-server`, on `$GANTRY_RUNTIME_SOCKET`, else `/run/gantry/runtime.sock`) is, asked with a ping carrying that runtime's identity: of the same build; not running (each GPU create then starts Go, about 2 ms more); another build, whose creates are not served (after an upgrade of the runtime's file the server stops when asked, as at that runtime's next GPU create; otherwise the unit runs another file: make its ExecStart the runtime's); not a create server; or not checked (doctor is not root, or runs in another mount namespace than the server). None of these fails the check: a GPU create without the server runs in-process, as correct."

// Checks lists every check in the order Run runs them. A test keeps it in
// step with the Check* names and with docs/troubleshooting.md.
var Checks = []CheckDef{
	{
		Name:     CheckKernel,
		Summary:  "the NVIDIA kernel module is loaded (its version file)",
		run:      (*env).kernel,
		Verifies: "The NVIDIA kernel module is loaded: its version file, `proc/driver/nvidia/version` under the driver root, else the host's `/proc/driver/nvidia/version` or `/sys/module/nvidia/version`.",
		Failures: []FailureDoc{
			{"no version file anywhere: the nvidia kernel module is not loaded",
				fixKernelModule},
			{"the version file exists but cannot be read",
				fixVersionFile},
		},
	},
	{
		Name:     CheckDeviceNodes,
		Summary:  "/dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidiaN with the kernel's major numbers",
		Needs:    []Need{NeedDriver},
		run:      (*env).deviceNodes,
		Verifies: "Under the dev root: `/dev/nvidiactl` is the character device 195:255, `/dev/nvidia-uvm` has the major the kernel gave `nvidia-uvm` in `/proc/devices`, and at least one `/dev/nvidiaN` with major 195 exists.",
		Failures: []FailureDoc{
			{"`/dev/nvidiactl` missing or not 195:255; `nvidia-uvm` not in `/proc/devices` (the module is not loaded; CUDA needs it); `/dev/nvidia-uvm` missing or with a stale major from an earlier boot; no `/dev/nvidiaN`",
				fixDeviceNodes},
			{"the same, with a dev root other than `/` (`--dev-root`, else `--driver-root`), where the fix makes the nodes", fixDeviceNodesIn},
		},
	},
	{
		Name:     CheckNVML,
		Summary:  "NVML loads and lists the GPUs (not with simulated GPUs)",
		Needs:    []Need{NeedDriver},
		run:      (*env).nvml,
		Verifies: "NVML (`libnvidia-ml.so.1`) loads and initialises and lists the GPUs; skipped when the GPUs are simulated (`--gpus sim:…`), and when the kernel driver or the device nodes failed.",
		Failures: []FailureDoc{
			{"NVML cannot be loaded or initialised",
				fixNVML},
			{"the simulated host cannot be read (`--gpus sim:…`)",
				fixSimGPUs},
		},
	},
	{
		Name:     CheckGPUNodes,
		Summary:  "each GPU the driver reports has its node /dev/nvidia<minor>",
		Needs:    []Need{NeedDriver},
		run:      (*env).gpuNodes,
		Verifies: "Each GPU the driver reports (NVML, or the simulated host) has its own node `/dev/nvidia<minor>`, the character device 195:<minor>; skipped when no GPUs were reported.",
		Failures: []FailureDoc{
			{"GPU N's node is missing or has the wrong numbers (the evidence names the GPU, its UUID and the node)",
				fixGPUNode},
			{"the same, with a dev root other than `/`", fixGPUNodeIn},
		},
	},
	{
		Name:     CheckPersistence,
		Summary:  "advice only: persistence mode is on for every GPU",
		Needs:    []Need{NeedDriver},
		run:      (*env).persistence,
		Verifies: "Every GPU has persistence mode on (NVML). Advice, never a failure: without it the driver tears a GPU down when its last client exits, so each container start initialises it again; the evidence names the GPUs with it off, and says to run `nvidia-smi -pm 1` or `nvidia-persistenced`. Skipped when the GPUs are simulated or NVML did not pass.",
	},
	{
		Name:     CheckVersions,
		Summary:  "the kernel module's driver version is the libraries' and NVML's; the CUDA version",
		Needs:    []Need{NeedDriver},
		run:      (*env).versions,
		Verifies: "The loaded kernel module's driver version is that of the user-space libraries the loader finds under the driver root (`libnvidia-ml.so.1` and `libcuda.so.1`, through its `ld.so.cache` or the library directories, by the version in the file each leads to), and that NVML reports; the CUDA version the driver supports. The libraries are read from the files, so a mismatch is named even where NVML cannot start because of it. While the versions differ, `" + CheckDriverFiles + "`, `" + CheckLoaderCache + "` and `" + CheckCDISpecs + "` are skipped: they look for the module's version of the files, and their fix would downgrade the libraries.",
		Failures: []FailureDoc{
			{"the kernel module is older than the user-space libraries: the libraries were upgraded and the old module is still loaded (`Driver/library version mismatch`); the evidence names both versions and the libraries",
				fixModuleOlder},
			{"the kernel module is newer than the user-space libraries",
				fixModuleNewer},
			{"NVML reports another driver version than the kernel module (`Driver/library version mismatch`)",
				fixVersions},
		},
	},
	{
		Name:     CheckDriverFiles,
		Summary:  "the driver files a container gets exist, and their SONAME links",
		Needs:    []Need{NeedDriver},
		run:      (*env).driverFiles,
		Verifies: "The driver files Gantry would inject (libraries, programs, firmware) are found under the driver root, the core ones (libcuda, libnvidia-ml, nvidia-smi) among them, and each library's SONAME link resolves to it.",
		Failures: []FailureDoc{
			{"no driver under the driver root", fixDriverRoot},
			{"core driver files not found", fixReinstall},
			{"SONAME links (`libcuda.so.1`, …) missing, dangling or leading to another file",
				fixSONAME},
		},
	},
	{
		Name:     CheckLoaderCache,
		Summary:  "the driver root's ld.so.cache lists the driver's libraries",
		Needs:    []Need{NeedDriver},
		run:      (*env).loaderCache,
		Verifies: "The driver root's `/etc/ld.so.cache` is a loader cache that lists every driver library beside `libcuda` and `libnvidia-ml` by its SONAME: NVML on the host and every program linked to `libcuda` find them through it, so a corrupt cache, or one written before the driver was installed, breaks them while the files are fine.",
		Failures: []FailureDoc{
			{"the cache is missing, corrupt or not a loader cache (the evidence names the file)",
				fixLoaderCache},
			{"the cache has no entry for some driver libraries (the evidence names them)",
				fixLoaderCache},
			{"no driver under the driver root", fixDriverRoot},
		},
	},
	{
		Name:     CheckInventoryCache,
		Summary:  "the runtime's cached inventories and the driver each was made for",
		Needs:    []Need{NeedDriver},
		run:      (*env).inventoryCache,
		Verifies: "The runtime's cached driver inventories in `runtime.cache-dir` and which driver version each was made for. A stale one is reported, not failed: `gantry-runtime` replaces it on the next GPU container.",
	},
	{
		Name:     CheckCDISpecs,
		Summary:  "the CDI specs, resolved as the CDI library does: every path they name exists, made for the running driver",
		Needs:    []Need{NeedDriver},
		run:      (*env).cdiSpecs,
		Verifies: "The CDI specs of the configured kind's vendor in the configured spec directories (`cdi.spec-dirs`, default `/etc/cdi` then `/var/run/cdi`), resolved as engines resolve them, with the CDI library's cache: a device in a later directory shadows the same device in an earlier one (a shadowed spec is noted, not used), and two specs in one directory that define the same device conflict (the library drops that device from both). Each spec an engine uses is checked against the host: every device node, mount `hostPath` and hook program it names exists (the evidence names the spec file, the devices and the path), it was generated for the running driver, and its hooks carry an explicit `env`. With no spec of the kind, the check is SKIP, unless Podman is in use (`podman` on `PATH`, or containers in its storage, `--podman-storage`): Podman takes GPUs only through CDI.",
		Failures: []FailureDoc{
			{"a path the spec names is gone (a library, an ICD or other file deleted or replaced after the spec was generated, the persistenced socket, a device node, the hook program), or the spec was generated for another driver version, or a file in a spec directory that the CDI library cannot load",
				fixCDISpec},
			{"the broken spec is in a later directory (`/var/run/cdi`) and shadows an intact spec of the same devices in an earlier one (`/etc/cdi`)",
				fixCDIStale},
			{"two specs in one directory define the same devices (`nvidia.com/gpu=0`, …): the CDI library refuses those devices in both (\"conflicting device\"), so `--device nvidia.com/gpu=0` fails with \"unresolvable CDI devices\" (the older, or the broken, one is named for removal)",
				fixCDIConflict},
			{"a spec's hooks (spec-wide or a device's) have no explicit `env`: a runtime runs such a hook as root on the host with the container image's environment, the CVE-2025-23266 class (the evidence names the file and the hooks)",
				fixCDISpec},
			{"no spec of the kind while Podman is in use (`podman` on `PATH`, or Podman containers): `podman run --device nvidia.com/gpu=all` fails with \"unresolvable CDI devices\"",
				fixPodmanNoSpec},
		},
	},
	{
		Name:     CheckOldCDIHooks,
		Summary:  "no CDI spec runs the gantry CLI (or nvidia-ctk hook) as a hook without an env",
		Needs:    []Need{NeedDriver},
		run:      (*env).oldCDIHooks,
		Verifies: "No CDI spec of any kind in the configured spec directories has a hook of the forms written before `gantry-cdi-hook` existed: `gantry hook update-ldcache|create-symlinks ...`, or nvidia-ctk's `nvidia-ctk hook ...`, with no `env`. An engine that injects such a spec (containerd, CRI-O, Podman) runs the hook as root on the host with the image's environment on runc before 1.2, and `gantry` is dynamically linked: the image's `LD_PRELOAD` runs as host root before any of Gantry's code (Gantry's own `gantry hook` then refuses to go on, so the container fails). Nor a hook named by a relative path, which a runtime resolves in the container's root filesystem: the image's file would run as host root. Specs that are links (NixOS) are read as engines read them, through the link; a spec that cannot be read FAILs too, since its hooks are unknown.",
		Failures: []FailureDoc{
			{"a spec has such hooks, or cannot be read (the evidence names each file and its hooks)", fixOldCDIHooks},
		},
	},
	{
		Name:     CheckDocker,
		Summary:  "daemon.json registers a GPU runtime the running dockerd has (docker --runtime nvidia)",
		Needs:    []Need{NeedDriver, NeedDocker},
		run:      (*env).docker,
		Verifies: "Docker's `daemon.json` (`--docker-config`) registers a runtime that runs `gantry-runtime` or `nvidia-container-runtime`, and that program exists; skipped when Docker is not installed. Only the Docker paths in use can fail: when the file registers no GPU runtime but the hook is on dockerd's `PATH`, `docker run --gpus` works and only `--runtime nvidia` is unavailable (INFO); when neither is set up (no `daemon.json` or no GPU runtime in it, and no hook), Docker is not used for GPU containers on this host, e.g. a Kubernetes node (INFO, with the command that sets it up)." + createServerVerifies,
		Failures: []FailureDoc{
			{"`daemon.json` registers a GPU runtime (or a default runtime) that the running dockerd, asked over its socket (`GET /info` on `--docker-socket`, default `$DOCKER_HOST` or `/var/run/docker.sock`), does not have: the file changed and dockerd was not restarted (`docker run --runtime nvidia` says \"Unknown runtime specified\")",
				fixDockerRestart},
			{"a registered runtime's program does not exist, is a dangling link, or is on neither the engine's nor doctor's `PATH`",
				fixDockerReinstall},
			{"a registered runtime's program, as the engine looks it up (a name without a slash in the engine's own `PATH`, read from `/proc/PID/environ` of the daemon on the socket doctor asks, else systemd's default service `PATH`), is found only on doctor's `PATH`",
				fixRuntimeAbsPath},
			{"a registered runtime's program exists but is not executable (the engine's exec fails with \"permission denied\")",
				fixProgramMode},
			{"a registered `gantry-runtime`, which links no NVML, finds no `gantry` binary to ask for the GPUs (beside it, `runtime.gantry-path`, `/usr/bin/gantry`) while MIG instances exist (without them: a note on the PASS line)",
				fixNVMLHelper},
			{"the file registers no GPU runtime but sets a `default-runtime` (Docker is meant for GPU containers here)", fixDockerConfigure},
			{"the file is not valid JSON (dockerd will not start)", fixDockerJSON},
			{"the file cannot be read", fixReadable},
		},
	},
	{
		Name:     CheckContainerd,
		Summary:  "the running containerd (else its config.toml) registers a GPU runtime",
		Needs:    []Need{NeedDriver, NeedContainerd},
		run:      (*env).containerd,
		Verifies: "The running containerd's configuration, asked over its CRI socket (`--cri-socket`, default the first of `/run/containerd/containerd.sock`, `/run/crio/crio.sock` that is containerd's: CRI `Status` with verbose info), else its `config.toml` (`--containerd-config`; config versions 1, 2, 3 and 4) with the files its `imports` name (such as the drop-in `/etc/containerd/conf.d/99-nvidia.toml` that `nvidia-ctk runtime configure` writes), registers a runtime whose `options.BinaryName` is `gantry-runtime` or `nvidia-container-runtime`, and that program exists; skipped when neither answers nor exists. A config that registers no GPU runtime is INFO, not a failure, where containerd runs no GPU containers through CRI: its CRI plugin is disabled (`disabled_plugins = [\"cri\"]`, Docker CE's config) or this is no Kubernetes node (no `--kubelet-dir`; Debian's containerd under Docker)." + createServerVerifies,
		Failures: []FailureDoc{
			{"no GPU runtime registered on a Kubernetes node",
				fixContainerdConfigure},
			{"the running containerd, asked over its CRI socket, registers no GPU runtime on a Kubernetes node (or its runtime's program is missing)",
				fixContainerdLive},
			{"the CRI socket answers containerd's own services but not CRI: its CRI plugin failed to load (the evidence quotes the plugin's error, as `ctr plugins ls` shows it; e.g. containerd 1.6 with no runtime named by `default_runtime_name`)",
				fixCRIPluginFailed},
			{"the CRI socket's containerd has no CRI plugin (disabled) on a Kubernetes node, or where `--cri-socket` names it",
				fixCRIDisabled},
			{"`--cri-socket` names no socket, or one that does not answer",
				fixCRISocket},
			{"a file `imports` names does not parse or cannot be read",
				fixContainerdImport},
			{"a registered runtime's program does not exist, is a dangling link, or is on neither the engine's nor doctor's `PATH`",
				fixContainerdReinstall},
			{"a registered runtime's program, as the engine looks it up (a name without a slash in the engine's own `PATH`, read from `/proc/PID/environ` of the daemon on the socket doctor asks, else systemd's default service `PATH`), is found only on doctor's `PATH`",
				fixRuntimeAbsPath},
			{"a registered runtime's program exists but is not executable (the engine's exec fails with \"permission denied\")",
				fixProgramMode},
			{"a registered `gantry-runtime`, which links no NVML, finds no `gantry` binary to ask for the GPUs (beside it, `runtime.gantry-path`, `/usr/bin/gantry`) while MIG instances exist (without them: a note on the PASS line)",
				fixNVMLHelper},
			{"the file is not valid TOML (containerd will not start), or a `version` this gantry does not know", fixContainerdTOML},
			{"the file cannot be read", fixReadable},
		},
	},
	{
		Name:     CheckCRIO,
		Summary:  "CRI-O's crio.conf and drop-ins register a GPU runtime",
		Needs:    []Need{NeedDriver, NeedCRIO},
		run:      (*env).crio,
		Verifies: "CRI-O's `/etc/crio/crio.conf` and its drop-ins (`--crio-dropins`, read in name order) register a runtime whose `runtime_path` is `gantry-runtime` or `nvidia-container-runtime`, and that program exists; skipped when neither exists. No GPU runtime is INFO when this is no Kubernetes node: CRI-O serves only a kubelet." + createServerVerifies,
		Failures: []FailureDoc{
			{"no GPU runtime registered on a Kubernetes node",
				fixCRIOConfigure},
			{"a registered runtime's program does not exist, is a dangling link, or is on neither the engine's nor doctor's `PATH`",
				fixCRIOReinstall},
			{"a registered runtime's program, as the engine looks it up (a name without a slash in the engine's own `PATH`, read from `/proc/PID/environ` of the daemon on the socket doctor asks, else systemd's default service `PATH`), is found only on doctor's `PATH`",
				fixRuntimeAbsPath},
			{"a registered runtime's program exists but is not executable (the engine's exec fails with \"permission denied\")",
				fixProgramMode},
			{"a registered `gantry-runtime`, which links no NVML, finds no `gantry` binary to ask for the GPUs (beside it, `runtime.gantry-path`, `/usr/bin/gantry`) while MIG instances exist (without them: a note on the PASS line)",
				fixNVMLHelper},
			{"a file is not valid TOML (CRI-O will not start)", fixCRIOTOML},
			{"a file cannot be read", fixReadable},
		},
	},
	{
		Name:     CheckHook,
		Summary:  "nvidia-container-runtime-hook is on dockerd's PATH (docker --gpus)",
		Needs:    []Need{NeedDriver},
		run:      (*env).hook,
		Verifies: "`nvidia-container-runtime-hook` is on dockerd's `PATH`, read from `/proc/PID/environ` of the `dockerd` that listens on the socket doctor asks (`--docker-socket`, default `$DOCKER_HOST` or `/var/run/docker.sock`; matched by the socket's inode among the daemon's open files, or its `-H` flag: with several dockerds, never merely the first; systemd's default service `PATH` when none runs), not doctor's: `docker run --gpus` makes dockerd look it up there; skipped when Docker is not installed. When the hook is missing but Docker's `--runtime nvidia` path works (docker config passes), only `--gpus` is unavailable: INFO, not a failure. When the hook is Gantry's, the PASS line says what the create server is for it, as the engine checks do for a runtime: the server does the hook's work for callers of its build.",
		Failures: []FailureDoc{
			{"the hook is installed (on doctor's `PATH`) but not on dockerd's: `docker run --gpus` fails with \"could not select device driver\" (a hook installed nowhere means `--gpus` is not set up: INFO)",
				fixHookPath},
			{"the hook on dockerd's `PATH` is a dangling symbolic link (what it pointed at was removed or moved): dockerd skips it and `docker run --gpus` fails with \"could not select device driver\"; the fix names the installed program to point it at (the link's target found elsewhere, else `gantry-runtime`)",
				fixHookLink},
			{"the hook is a dangling symbolic link and no installed program to point it at is found",
				fixHookReinstall},
			{"the hook on dockerd's `PATH` is a file without an execute bit",
				fixHookMode},
		},
	},
	{
		Name:     CheckCreateServer,
		Summary:  "the create server's socket answers, or nothing listens there",
		Needs:    []Need{NeedDriver},
		run:      (*env).createServer,
		Verifies: "Every GPU create of `gantry-runtime` first asks the create server's socket (`--create-server-socket`, default `$GANTRY_RUNTIME_SOCKET`, else `/run/gantry/runtime.sock`): doctor pings it once. A server that answers (any build; the engine checks say which runtimes it serves) is PASS; no socket, or a stale one nobody listens on, is INFO (creates run in-process, about 2 ms more); a listener that is not root's, or not a create server but answers or closes, is INFO (gantry-runtime leaves it at once).",
		Failures: []FailureDoc{
			{"a root process holds the socket listening and never answers (hung, stopped, or not a create server that never reads): every GPU create waits the C start's bounds (" + createproto.ServerConnectTimeout.String() + " to connect and send, " + createproto.ServerAckTimeout.String() + " for the server's acceptance byte, which only a create server of this build writes) before running in-process; the evidence names the cost and the holder's pid and command (from `/proc/net/unix` and `/proc/PID/fd`)",
				fixServerHeld},
			{"the same, the socket held by systemd (pid 1) for `gantry-runtime-server.socket`", fixServerUnitHeld},
			{"the same, the holder not found (another PID namespace)", fixServerHeldUnknown},
		},
	},
	{
		Name:     CheckContainer,
		Summary:  "what the container asked for and what it got",
		Needs:    []Need{NeedDriver, NeedContainer},
		run:      (*env).container,
		Verifies: "With `--container ID`: what the container asked for and what it got. A Docker container (when the docker CLI knows the ID or name): its runtime, `NVIDIA_VISIBLE_DEVICES`, `--gpus` device requests, CDI or `/dev/nvidia*` devices. Else a containerd task (every namespace, or `--namespace`), read from its bundle under `--containerd-state` (`io.containerd.runtime.v2.task/NAMESPACE/ID/config.json`, the OCI spec as the runtime ran it): `NVIDIA_VISIBLE_DEVICES`, `NVIDIA_DRIVER_CAPABILITIES`, `cdi.k8s.io/` annotations, the runc binary, and what was injected (`/dev/nvidia*` devices, driver mounts). With `--pod`, the same for each of the pod's containers, with the devices the kubelet assigned. A container that asked for no GPU is INFO (\"no GPU requested\"), and its device access is not probed: it is not broken. `NVIDIA_VISIBLE_DEVICES` `void`, `none` or empty (in any case, with any runtime) asks for no GPU device, as the environment contract says (`none` still gets the driver files): no device rule to lose, so never the device cgroup failure.",
		Failures: []FailureDoc{
			{"neither Docker nor containerd knows the container (no such container, no daemon reachable, or containerd's state elsewhere)",
				fixNoContainer},
			{"a containerd container asks for GPUs (`NVIDIA_VISIBLE_DEVICES`, CDI annotations) but its spec has no `/dev/nvidia*` device: the runtime is not registered, or runc was used directly",
				fixNoRuntime},
			{"`NVIDIA_VISIBLE_DEVICES` asks for GPUs (not `void`, `none` or empty) but the container runs under plain runc, which ignores it",
				docFill(fixPlainRunc, "ORCDI", fixOrCDI+fixOrCDIOnly)},
			{"a pod's container has no OCI spec to read: no task bundle under `--containerd-state`, and the CRI runtime reports none",
				fixNoSpec},
			{"the CRI runtime does not answer about one of the pod's containers", fixCRISocket},
		},
	},
	{
		Name:     CheckContainerDevice,
		Summary:  "its device cgroup still allows the GPU, probed from the host",
		Needs:    []Need{NeedDriver, NeedContainer},
		run:      (*env).containerDevice,
		Verifies: "With `--container ID` (or `--pod`), for a running container: its device cgroup still allows `/dev/nvidiactl` (195:255), and the container has the node. Nothing from the image runs: a short-lived host process (doctor's own binary) is placed in the container's cgroup (cgroup v2: created there with `clone3` `CLONE_INTO_CGROUP`; v1: moved into its devices cgroup) and opens a 195:255 node on the host; the kernel checks the open against the container's rules (the v1 `devices.list`, shown as evidence, or the eBPF program on v2). `No such device or address` there means allowed, with no driver behind the node (a host without a GPU).",
		Failures: []FailureDoc{
			{"`operation not permitted`: the device cgroup no longer allows the GPU, which NVML inside reports as `Failed to initialize NVML: Unknown Error`; usually `systemctl daemon-reload` rewrote the cgroup (the evidence says when the container's spec has no rule for 195:255 either) (a Docker container)",
				docFill(fixDeviceRefused, "RESTART", fixRestartDocker, "RECUR", docFill(fixRecurDocker, "ORCDI", fixOrCDI+fixOrCDIOnly))},
			{"`operation not permitted`: the device cgroup no longer allows the GPU, which NVML inside reports as `Failed to initialize NVML: Unknown Error`; usually `systemctl daemon-reload` rewrote the cgroup (the evidence says when the container's spec has no rule for 195:255 either) (a containerd task)",
				docFill(fixDeviceRefused, "RESTART", fixRestartTask, "RECUR", fixRecurSpec)},
			{"`operation not permitted`: the device cgroup no longer allows the GPU, which NVML inside reports as `Failed to initialize NVML: Unknown Error`; usually `systemctl daemon-reload` rewrote the cgroup (the evidence says when the container's spec has no rule for 195:255 either) (a Kubernetes pod's container)",
				docFill(fixDeviceRefused, "RESTART", fixRestartPod, "RECUR", fixRecurSpec)},
			{"`operation not permitted`: the device cgroup no longer allows the GPU, which NVML inside reports as `Failed to initialize NVML: Unknown Error`; usually `systemctl daemon-reload` rewrote the cgroup (the evidence says when the container's spec has no rule for 195:255 either) (a container runc runs without an engine)",
				docFill(fixDeviceRefused, "RESTART", fixRestartRunc, "RECUR", fixRecurSpec)},
			{"the container has no `/dev/nvidiactl`", fixNoCtl},
			{"the probe cannot run (not root, the process is gone, the cgroup is frozen by a pause) or its open fails in a way that says nothing about the cgroup", fixProbe},
		},
	},
	{
		Name:     CheckDevicePlugin,
		Summary:  "a device plugin serves a socket next to kubelet.sock and answers",
		Needs:    []Need{NeedDriver, NeedKubernetes},
		run:      (*env).devicePlugin,
		Verifies: "On a Kubernetes node (the kubelet directory, `--kubelet-dir`, exists; skipped otherwise): a device plugin serves a socket in `device-plugins/` next to the kubelet's registration socket `kubelet.sock`, and each socket named as NVIDIA's (`nvidia-gpu.sock`, `nvidia-mig-….sock`; Gantry's plugin uses the same names) answers `GetDevicePluginOptions` within 3 s, as the kubelet asks it. Gantry's plugin names its resource in a response header; another vendor's plugin sockets are listed, not checked.",
		Failures: []FailureDoc{
			{"the `device-plugins/` directory cannot be read", fixKubeletDir},
			{"no `kubelet.sock` socket: no device plugin can register", fixNoKubeletSock},
			{"no plugin socket next to `kubelet.sock`",
				fixPluginNotRunning},
			{"stale registration: connection refused on a plugin socket, nothing serves it any more (the plugin crashed or was killed and left its socket)",
				fixPluginStale},
			{"a plugin socket accepts but does not answer within 3 s (the plugin is hung)",
				fixPluginHung},
		},
	},
	{
		Name:     CheckPluginHealth,
		Summary:  "each resource's devices and their health, from Gantry's plugin",
		Needs:    []Need{NeedDriver, NeedKubernetes},
		run:      (*env).pluginHealth,
		Verifies: "Per resource, the devices Gantry's plugin advertises and their health, from its first `ListAndWatch` answer (the list the kubelet acts on): N devices, M healthy, the unhealthy IDs and the pods holding them. Doctor's stream ends as soon as it has the answer and does not disturb the kubelet's. The `ListAndWatch` of NVIDIA's k8s-device-plugin is not opened: it hands each health change to one stream only, and a stream opened beside the kubelet's would take the next one from it; its health is then seen in `" + CheckNode + "`.",
		Failures: []FailureDoc{
			{"a device is unhealthy (an XID such as 79 or 48, a double-bit ECC error, a GPU fallen off the bus): the kubelet no longer offers it, pods holding it keep it",
				fixUnhealthy},
		},
	},
	{
		Name:     CheckAllocatable,
		Summary:  "the kubelet's allocatable nvidia.com/ devices against the plugin's",
		Needs:    []Need{NeedDriver, NeedKubernetes},
		run:      (*env).allocatable,
		Verifies: "On a Kubernetes node: the kubelet's pod-resources API (`pod-resources/kubelet.sock`) lists allocatable `nvidia.com/` devices (`nvidia.com/gpu`, `nvidia.com/mig-…`); reports how many of each are allocatable and how many the node's pods hold, and compares them with what Gantry's plugin advertises: the kubelet offers exactly a registered plugin's healthy devices.",
		Failures: []FailureDoc{
			{"no allocatable `nvidia.com/` device",
				fixPluginNotRunning},
			{"no allocatable `nvidia.com/` device, and every GPU the plugin advertises is unhealthy", fixAllUnhealthy},
			{"the plugin advertises healthy devices the kubelet does not offer (the plugin is not registered with this kubelet)",
				fixReregister},
			{"the kubelet still offers devices the plugin reports unhealthy (its stream from the plugin is behind; kubelets before 1.23 listed unhealthy devices here too)", fixKubeletBehind},
			{"the pod-resources socket is missing or does not answer",
				fixPodResources},
			{"the kubelet does not implement `GetAllocatableResources`",
				fixNoAllocatable},
		},
	},
	{
		Name:     CheckCheckpoint,
		Summary:  "the kubelet's device checkpoint: devices held by pods",
		Needs:    []Need{NeedDriver, NeedKubernetes},
		run:      (*env).checkpoint,
		Verifies: "The kubelet's device checkpoint, `device-plugins/kubelet_internal_checkpoint` (JSON: `Data.RegisteredDevices`, the healthy devices when it was written, and `Data.PodDeviceEntries`, which container holds which device; both formats, before and since Kubernetes 1.20; its checksum is not verified): how many `nvidia.com/` devices are registered and held by pods. Skipped when the kubelet has not written one.",
		Failures: []FailureDoc{
			{"the file is not the kubelet's checkpoint JSON", fixCheckpoint},
			{"pods hold devices the plugin no longer advertises (the GPUs were reconfigured, e.g. MIG, or the plugin's resources changed)", fixCheckpointGone},
		},
	},
	{
		Name:     CheckNode,
		Summary:  "the Node's capacity and allocatable from the API server (in a pod)",
		Needs:    []Need{NeedDriver, NeedKubernetes},
		run:      (*env).node,
		Verifies: "What the scheduler sees: the Node's `status.capacity` (every device) and `status.allocatable` (the healthy ones) for `nvidia.com/` resources, read from the API server with plain HTTPS when doctor runs in a pod with a service account (`KUBERNETES_SERVICE_HOST`, `/var/run/secrets/kubernetes.io/serviceaccount`) that may get nodes, for the Node `NODE_NAME` (`--node`); compared with what Gantry's plugin advertises. Skipped, never failed, without credentials or when the API server cannot be reached.",
		Failures: []FailureDoc{
			{"allocatable is less than capacity: some GPUs are unhealthy (named when Gantry's plugin reports them)",
				fixNodeUnhealthy},
			{"no device plugin serves the Node's resources", fixPluginNotRunning},
			{"the Node's capacity differs from the number of devices the plugin advertises, or the Node has no `nvidia.com/` resource",
				fixReregister},
		},
	},
	{
		Name:     CheckPod,
		Summary:  "the devices each of the pod's containers holds",
		Needs:    []Need{NeedDriver, NeedPod},
		run:      (*env).pod,
		Verifies: "With `--pod NAMESPACE/NAME`: the `nvidia.com/` devices (resource and device IDs) each of the pod's containers holds, from the kubelet's pod-resources API.",
		Failures: []FailureDoc{
			{"the pod holds no GPU", fixPodNoGPU},
			{"the kubelet's pod-resources API does not answer `List`", fixPodResources},
			{"the pod is not among the kubelet's pods, or this is not a Kubernetes node",
				fixWrongNode},
		},
	},
	{
		Name:     CheckPodContainers,
		Summary:  "each container of the pod, examined as with --container",
		Needs:    []Need{NeedDriver, NeedPod},
		run:      (*env).podContainers,
		Verifies: "With `--pod NAMESPACE/NAME`: the pod's sandbox and containers, asked of the CRI runtime service (`--cri-socket`; default the first of `/run/containerd/containerd.sock`, `/run/crio/crio.sock`) by the kubelet's labels `io.kubernetes.pod.namespace` and `io.kubernetes.pod.name`. Each container is then examined as `" + CheckContainer + "` and `" + CheckContainerDevice + "` (its spec from containerd's task bundle, else the one the runtime reports; its pid from the verbose container status).",
		Failures: []FailureDoc{
			{"no CRI socket, or the runtime service does not answer",
				fixCRISocket},
			{"the runtime has no sandbox for the pod: it does not run on this node",
				fixNoSandbox},
			{"the pod has no containers yet", fixNoContainers},
		},
	},
}
