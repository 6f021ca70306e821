package doctor

import (
	"strings"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
)

// The fixes doctor prints, each written once: Checks' documentation shows
// them as written (Markdown; upper-case words such as ROOT, FILE or
// NAMESPACE stand for what the evidence names) and fail prints them
// through fix, which fills those words in.
const (
	fixKernelModule = "load the kernel module (`modprobe nvidia`, or start the driver container), or point `--driver-root` at the driver install"
	fixVersionFile  = "check the file's permissions; it is written by the nvidia kernel module"
	fixDeviceNodes  = "create the nodes: `nvidia-modprobe -c=0 -u` (or `modprobe nvidia-uvm`, then `nvidia-smi` as root), or set `--dev-root` to where the driver container made them"
	fixNVML         = "make sure `libnvidia-ml.so.1` of the running driver is in the driver root's `ld.so.cache`; after a driver upgrade, reboot or reload the kernel modules"
	fixSimGPUs      = "fix the `--gpus` value or the simulator file"
	fixGPUNode      = "create the node: `nvidia-modprobe -c=MINOR` (or `mknod -m 666 /dev/nvidiaMINOR c 195 MINOR`; or restart the driver container that makes them)"
	// The same under a dev root other than /, where nvidia-modprobe,
	// which makes host /dev nodes, would not help.
	fixDeviceNodesIn = "create the control nodes under the dev root: `nvidia-ctk system create-device-nodes --control-devices --driver-root ROOT --dev-root DEVROOT` (Gantry answers to nvidia-ctk; it takes the majors from ROOT's proc/devices when it has one, else the host's; after `modprobe nvidia-uvm` when /proc/devices lacks it), and each GPU's node with `mknod` (see `" + CheckGPUNodes + "`); or set `--dev-root` to where the driver container made them"
	fixGPUNodeIn     = "create the node under the dev root: `mknod -m 666 DEVROOT/dev/nvidiaMINOR c 195 MINOR` (or restart the driver container that makes them)"
	fixVersions      = "the user-space driver was upgraded but the old kernel module is still loaded: reboot, or unload and reload the nvidia modules"
	fixModuleOlder   = "load the kernel module of the installed libraries; keep the libraries (do not downgrade them): reboot, or stop what uses the GPU (`nvidia-smi` lists it; the device plugin, `nvidia-persistenced`, DCGM, a display server) and reload the modules: `rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia` (those `lsmod` lists), then `modprobe nvidia && modprobe nvidia_uvm`; with a driver container, restart it"
	fixModuleNewer   = "install the user-space libraries of driver VERSION, the loaded module's (the distribution's packages of that version, or its installer with `--no-kernel-module`), then `ldconfig`"
	fixDriverRoot    = "point `--driver-root` at the driver install"
	fixReinstall     = "reinstall the driver's user-space libraries for version VERSION"
	fixSONAME        = "recreate the SONAME links: `ldconfig -r ROOT` (ROOT is the driver root)"
	fixLoaderCache   = "rebuild the cache: `ldconfig -r ROOT` (ROOT is the driver root)"
	fixOldCDIHooks   = "rewrite them: `sudo gantry cdi fix-hooks FILE...` (atomically, each original kept as FILE.bak; `make install` does this for /etc/cdi and /var/run/cdi)"
	fixCDISpec       = "regenerate it: `gantry cdi generate --output FILE` (`gantry cdi generate` belongs in the driver upgrade procedure)"

	fixContentStore     = "`chmod 700 ROOT` (containerd's root), and upgrade containerd to a release with the CVE-2024-25621 fix, which makes it 0700 itself at every start; older ones keep the mode an existing root has. Safe for containerd: it runs as root and is the only program that opens its root (ctr, crictl, Docker and the kubelet go through its socket), and containers keep their root filesystems, mounted by root; or checkpoint with `ctr tasks checkpoint --image-path DIR` (Gantry makes DIR 0700) and remove content-store checkpoint images (`ctr images rm`) at once"
	fixNetworkLock      = "install iptables where the engine runs (Debian, Ubuntu: `apt-get install iptables`; it brings both programs) and restart the engine if its PATH lacked their directory; or choose CRIU's network lock with a line in /etc/criu/runc.conf (`network-lock nftables`, with a CRIU built with libnftables; or `network-lock skip` where nothing else reaches the container's network during the dump)"
	fixReadable         = "make the file readable"
	fixDockerRestart    = "`systemctl restart docker` (dockerd reads daemon.json when it starts)"
	fixContainerdTOML   = "correct the TOML (containerd will not start with it)"
	fixContainerdImport = "correct it, or run `nvidia-ctk runtime configure --runtime=containerd` again to regenerate Gantry's drop-in (containerd will not start with it)"
	fixCRIOTOML         = "correct the TOML (CRI-O will not start with it)"
	fixNVMLHelper       = "install `gantry` beside `gantry-runtime` (`make install` does), or set `runtime.gantry-path` in the Gantry configuration to the gantry binary: `gantry-runtime` links no NVML and asks it for MIG devices"
	fixHookPath         = "add DIR, where the hook is, to dockerd's `PATH` (an `Environment=PATH=` line in `docker.service`), or `ln -s gantry-runtime /usr/bin/nvidia-container-runtime-hook` (`make install` does it), then `systemctl restart docker`"

	fixServerHeld        = "stop the process that holds the socket without answering (`kill PID`, COMM) and remove the socket (`rm SOCKET`); then start the create server again if you use it (`systemctl restart gantry-runtime-server.service`): until then each GPU create waits"
	fixServerUnitHeld    = "systemd holds SOCKET for the socket unit but its service does not answer: `systemctl status gantry-runtime-server.service`, then `systemctl restart gantry-runtime-server.service`, or `systemctl stop gantry-runtime-server.socket` to create in-process"
	fixServerHeldUnknown = "find what holds the socket (`ss -xlp | grep SOCKET`), stop it and remove the socket (`rm SOCKET`)"

	fixNoContainer = "name a running container (`docker ps`; `ctr -n NAMESPACE tasks ls`; `crictl ps`) and run doctor as root on its host, where the docker CLI reaches the daemon; for containerd give `--namespace`, and `--containerd-state` if its state directory is not `" + DefaultContainerdState + "`"
	fixPlainRunc   = "run it with `--runtime nvidia`, or `--gpus all`ORCDI"
	fixNoSpec      = "run doctor on the pod's node with `--containerd-state` at containerd's state directory (or a CRI runtime that reports the container's spec)"

	// A device cgroup that lost the GPU: restart the container (each
	// engine's way), keep the rule in its own configuration, and create
	// the /dev/char links (NVIDIA's lasting fix: systemd resolves a rule
	// through /dev/char/MAJOR:MINOR, which the NVIDIA nodes lack).
	fixDeviceRefused = "RESTART; RECUR; " + fixDevChar
	fixDevChar       = "on systemd hosts also create the /dev/char links systemd resolves device rules through: nvidia-ctk system create-dev-char-symlinks --create-all (Gantry answers to nvidia-ctk; make install links it)"
	fixRestartDocker = "restart the container (`docker restart ID`)"
	fixRestartTask   = "restart the task so runc rebuilds its cgroup from the spec (`ctr -n NS task kill -s SIGKILL ID`; `ctr -n NS task delete ID`; `ctr -n NS task start ID`), or the service that owns it"
	fixRestartPod    = "delete the pod so it is recreated with a fresh cgroup (`kubectl delete pod -n NAMESPACE NAME`)"
	fixRestartRunc   = "recreate the container so runc rebuilds its cgroup from the spec (`runc --root DIR delete --force ID`, then create it again through gantry-runtime)"
	fixRecurDocker   = "to stop it recurring list the nodes with `--device` (`--device /dev/nvidiactl --device /dev/nvidia0`, ...) so the rule is in the container's own configORCDI"
	// ORCDI in a Docker fix: the CDI way, said only where the running
	// dockerd has CDI (dockerCDI).
	fixOrCDI          = ", or give the GPUs through CDI (`--device nvidia.com/gpu=all`)"
	fixOrCDIOnly      = " (said only where the running dockerd has CDI: Docker 25 and later with the `cdi` feature, whose `docker info` lists CDI spec dirs; Debian's dockerd 20.10 has none)"
	fixRecurSpec      = "to stop it recurring give the GPUs through gantry-runtime or CDI, so the device rules are in the container's spec (`linux.resources.devices`) rather than added to its cgroup by a hook"
	fixProbe          = "run doctor as root on the container's host; see the error: an open that fails otherwise than with `operation not permitted` or `no such device or address` says nothing about the cgroup"
	fixNoCtl          = "the container got no GPU: see `" + CheckContainer + "` above"
	fixKubeletDir     = "is the kubelet running (`systemctl status kubelet`; `journalctl -u kubelet`), and is `--kubelet-dir` its root directory?"
	fixNoKubeletSock  = "the kubelet is not running or has the device plugin manager off: `systemctl status kubelet`; `journalctl -u kubelet`"
	fixCheckpoint     = "the kubelet cannot read it either and forgets which containers hold which devices: see `journalctl -u kubelet`; the kubelet rewrites it when it allocates devices again"
	fixCheckpointGone = "those containers run on devices that no longer exist (the GPUs were reconfigured, e.g. MIG, or the plugin's resources changed): delete the pods (find a UID with `kubectl get pods -A -o custom-columns=NS:.metadata.namespace,NAME:.metadata.name,UID:.metadata.uid`) so they are scheduled again"
	fixPodNoGPU       = "give its containers `resources.limits` `nvidia.com/gpu: N` (or a MIG resource) and recreate the pod"
	// The device plugin's pods on this node (deployments/: namespace
	// kube-system, label app.kubernetes.io/name=gantry); NODE is the node.
	pluginPods          = "kubectl -n kube-system get pods -l app.kubernetes.io/name=gantry --field-selector spec.nodeName=NODE"
	pluginPod           = "`" + pluginPods + " -o wide`"
	pluginLogs          = "`kubectl -n kube-system logs $(" + pluginPods + " -o name)`"
	fixPluginNotRunning = "the device plugin is not running or not registered: " + pluginPod + "; see its logs: " + pluginLogs
	fixPluginStale      = "the plugin that served it has crashed or stopped and left its socket: check its pod (" + pluginPod + ") and logs (" + pluginLogs + "); restarting it (`kubectl -n kube-system delete pod POD`; the DaemonSet makes a new one) serves the socket and registers again; a socket no plugin will serve again can be deleted. The kubelet counts the resource's devices as unhealthy once the plugin's stream ends"
	fixPluginHung       = "the plugin does not answer as the kubelet asks it (" + pluginPod + "; " + pluginLogs + "); restart it: `kubectl -n kube-system delete pod POD`"
	fixUnhealthy        = "see why (XID, double-bit ECC, fallen off the bus) in the Node's events (`kubectl get events -A --field-selector involvedObject.kind=Node,involvedObject.name=NODE`; reason `GPUUnhealthy`) and the plugin's log (" + pluginLogs + "); the plugin returns a GPU to healthy after its quiet period (`gantry.health.recoveryQuietPeriod`, default 10m) without a new error; for a persistent fault drain the node (`kubectl drain NODE --ignore-daemonsets`), reset the GPU (`nvidia-smi -r -i UUID`) or reboot, then `kubectl uncordon NODE`; pods holding the GPU keep it until they are deleted"
	fixReregister       = "restart the device plugin so it registers again (`kubectl -n kube-system delete pod POD`; " + pluginPod + "), and see the kubelet's log (`journalctl -u kubelet | grep -i 'device plugin'`)"
	fixKubeletBehind    = "the kubelet would place new pods on failed GPUs: " + fixReregister
	fixAllUnhealthy     = "every GPU the plugin advertises is unhealthy (see `" + CheckPluginHealth + "`): " + fixUnhealthy
	fixNodeUnhealthy    = "the scheduler sees fewer GPUs than the node has because some are unhealthy (see `" + CheckPluginHealth + "`): " + fixUnhealthy
	fixPodResources     = "the kubelet serves pod-resources on this socket from Kubernetes 1.15 (`GetAllocatableResources` from 1.23, GA in 1.28): is the kubelet running (`systemctl status kubelet`), and is `--kubelet-dir` its root directory?"
	fixNoAllocatable    = "the kubelet predates `GetAllocatableResources`: upgrade it to 1.28 or later, or enable the `KubeletPodResourcesGetAllocatable` feature gate"
	fixWrongNode        = "run doctor on the node the pod runs on (`kubectl get pod -n NAMESPACE NAME -o wide`), or point `--kubelet-dir` at the kubelet's root directory"
	fixCRISocket        = "is the container engine running with its CRI service (containerd: the cri plugin is not in `disabled_plugins`; CRI-O: `systemctl status crio`), and is `--cri-socket` its socket (containerd: `/run/containerd/containerd.sock`, CRI-O: `/run/crio/crio.sock`)?"
	fixCRIPluginFailed  = "correct containerd's configuration so that its CRI plugin loads (the error names what it could not use: `containerd config dump` shows what containerd read, `journalctl -u containerd` the error; `default_runtime_name` must name a runtime of `containerd.runtimes`, such as `runc`, which `gantry runtime configure --runtime containerd` keeps), then `systemctl restart containerd`; `ctr plugins ls` then shows the cri plugin `ok`"
	fixCRIDisabled      = "enable containerd's CRI plugin (remove `cri` from `disabled_plugins` in CONFIG, or in the file containerd was started with), then `systemctl restart containerd`; or point `--cri-socket` at the engine the kubelet uses"
	fixNoSandbox        = "run doctor on the node the pod runs on (`kubectl get pod -n NAMESPACE NAME -o wide`), or point `--cri-socket` at the engine that runs it"
	fixNoContainers     = "wait until the pod's containers are created (`kubectl describe pod -n NAMESPACE NAME`)"
)

// The fixes of the CDI spec resolution (cdicheck.go), of programs judged
// as their engine runs them (enginepath.go) and of a broken hook
// (hooklink.go).
const (
	fixCDIStale       = "remove the stale spec, which shadows the intact one: `rm STALE` (GOOD is then used; a spec in a later spec directory, `/var/run/cdi` after `/etc/cdi`, wins)"
	fixCDIConflict    = "keep one spec per device: `rm DROP` (KEEP stays)"
	fixPodmanNoSpec   = "generate the spec Podman reads: `gantry cdi generate --output FILE` (again after each driver upgrade)"
	fixProgramMode    = "make it executable: `chmod 755 FILE` (the engine execs the file itself)"
	fixRuntimeAbsPath = "register runtime NAME by the absolute path doctor found it at: in FILE, its path `ABSPATH` (or add DIR to ENGINE's `PATH`: an `Environment=PATH=` line in its unit); then `RESTART`"
	fixHookLink       = "point the link at the installed hook: `ln -sf TARGET LINK`, then `systemctl restart docker` (dockerd looks the hook up when it starts)"
	fixHookMode       = "make it executable: `chmod 755 FILE`, then `systemctl restart docker` (dockerd looks the hook up when it starts)"
	fixHookReinstall  = "no installed hook to point LINK at: install Gantry again (`make install` links `nvidia-container-runtime-hook` to `gantry-runtime`), or `rm LINK` if --gpus is not wanted; then `systemctl restart docker`"
)

// docFill fills a fix's placeholders with other documented fixes, for
// the documentation (Markdown kept).
func docFill(doc string, kv ...string) string { return strings.NewReplacer(kv...).Replace(doc) }

// The fixes that register Gantry's runtime with an engine: the engine's
// configure command and restart, from engineconfig's registry.
var (
	fixDockerConfigure     = configureFix(engineconfig.Docker)
	fixDockerReinstall     = reinstallFix(fixDockerConfigure)
	fixDockerJSON          = "correct the JSON (dockerd will not start with it), then: " + fixDockerConfigure
	fixContainerdConfigure = configureFix(engineconfig.Containerd)
	fixContainerdLive      = fixContainerdConfigure + " (the containerd serving SOCKET, with the file it was started with)"
	fixContainerdReinstall = reinstallFix(fixContainerdConfigure)
	fixCRIOConfigure       = configureFix(engineconfig.CRIO)
	fixCRIOReinstall       = reinstallFix(fixCRIOConfigure)
	fixNoRuntime           = "register Gantry's runtime: " + fixContainerdConfigure + ", and recreate the container under it (Kubernetes: `runtimeClassName: nvidia`, or make nvidia containerd's default runtime; ctr: `ctr run --runc-binary /usr/bin/gantry-runtime`)"
)

// configureFix is "`gantry runtime configure --runtime E`, then `RESTART`".
func configureFix(e engineconfig.Engine) string {
	d, _ := engineconfig.Lookup(e)
	return d.ConfigureCommand()
}

// fix renders a documented fix for the terminal: the Markdown code marks
// dropped, and each placeholder of kv (pairs: the word, its value)
// replaced, the first pair first where two start at the same place.
func fix(doc string, kv ...string) string {
	s := strings.ReplaceAll(doc, "`", "")
	if len(kv) > 0 {
		s = strings.NewReplacer(kv...).Replace(s)
	}
	return s
}
