package doctor

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/createproto"
	"github.com/gantry-gpu/gantry/internal/ctrckpt"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/engineconfig"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/ldcache"
)

// Status is the outcome of one check.
type Status string

const (
	Pass Status = "PASS"
	Fail Status = "FAIL"
	Skip Status = "SKIP"
	// Info is said of a path not in use here (an engine present but not
	// used for GPUs, a container that asked for none): not a failure.
	Info Status = "INFO"
	// Warn is said of a risk that breaks nothing (others may read what
	// they should not): not a failure, but printed with its fix.
	Warn Status = "WARN"
)

// Check is one link of the chain.
type Check struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	// OK is false only for a failed check; a skipped check is not a failure.
	OK       bool   `json:"ok"`
	Evidence string `json:"evidence"`
	// Fix says what to do about a failure.
	Fix string `json:"fix,omitempty"`
}

// Check names, in chain order. Tests and scripts match on them.
const (
	CheckKernel          = "kernel driver"
	CheckDeviceNodes     = "device nodes"
	CheckNVML            = "nvml"
	CheckGPUNodes        = "gpu device nodes"
	CheckPersistence     = "persistence mode"
	CheckVersions        = "driver and cuda versions"
	CheckDriverFiles     = "driver files"
	CheckLoaderCache     = "loader cache"
	CheckInventoryCache  = "inventory cache"
	CheckCDISpecs        = "cdi specs"
	CheckOldCDIHooks     = "old cdi hooks"
	CheckDocker          = "docker config"
	CheckContainerd      = "containerd config"
	CheckCRIO            = "cri-o config"
	CheckHook            = "hook on path"
	CheckCreateServer    = "create server"
	CheckContainer       = "container request"
	CheckContainerDevice = "container device access"
	CheckDevicePlugin    = "device plugin registration"
	CheckPluginHealth    = "device plugin health"
	CheckAllocatable     = "kubelet gpu resources"
	CheckCheckpoint      = "kubelet device checkpoint"
	CheckNode            = "node gpu capacity"
	CheckPod             = "pod devices"
	CheckPodContainers   = "pod containers"
)

// Default locations of the engines' configuration: the files `gantry
// runtime configure` edits (engineconfig has the one default per engine),
// so doctor reads what configure wrote.
var (
	DefaultDockerConfig     = engineconfig.DefaultPath(engineconfig.Docker)
	DefaultContainerdConfig = engineconfig.DefaultPath(engineconfig.Containerd)
	DefaultCRIODropins      = engineconfig.CRIODropinDir()
	// DefaultCRIOConfig is CRI-O's main file, which configure never edits.
	DefaultCRIOConfig = engineconfig.CRIOMainConfig
)

// Options says what to examine. Empty paths take the defaults above, so
// tests point them at temporary files.
type Options struct {
	Config config.Config
	// Proc is the host's procfs ("/proc").
	Proc string
	// Sys is the host's sysfs ("/sys"), where the loaded module's
	// module/nvidia/version is.
	Sys          string
	DockerConfig string
	// DockerSocket is the running dockerd's API socket
	// (DefaultDockerSocket), asked what it registered.
	DockerSocket     string
	ContainerdConfig string
	CRIOConfig       string
	CRIODropins      string
	// EngineConfigs is the configuration file of each registered engine
	// that has no check written out (engineCheck); its DefaultPath when
	// absent.
	EngineConfigs map[engineconfig.Engine]string
	// Container is a container ID (or name, for Docker) to examine: Docker's
	// if the docker CLI knows it, else a containerd task; empty for none.
	Container string
	// Namespace restricts the containerd lookup to one namespace (and skips
	// Docker); empty searches every namespace.
	Namespace string
	// ContainerdRoot is containerd's root directory, where its content
	// store is; empty takes the running containerd's (its CRI status),
	// else the root ContainerdConfig sets, else DefaultContainerdRoot.
	ContainerdRoot string
	// ContainerdState is containerd's state directory
	// (DefaultContainerdState), where its runtime v2 tasks are.
	ContainerdState string
	// RuncRoot is runc's state directory (DefaultRuncRoot), for containers
	// runc runs without an engine.
	RuncRoot string
	// CRISocket is the CRI runtime service socket for Pod; empty takes the
	// first of CRISockets that exists.
	CRISocket string
	// CRISockets are the sockets tried, in order, when CRISocket is empty
	// (DefaultCRISockets): where a running containerd or CRI-O is looked
	// for, so tests point them into a temporary directory.
	CRISockets []string
	// Docker is the docker CLI ("docker", looked up in PATH).
	Docker string
	// KubeletDir is the kubelet's root (DefaultKubeletDir); the Kubernetes
	// checks run only when it exists.
	KubeletDir string
	// Pod is NAMESPACE/NAME of a pod whose devices to report; empty for none.
	Pod string
	// NodeName is this node's Node, read from the API server (default
	// $NODE_NAME; the host name in suggested commands).
	NodeName string
	// APIServer is the API server's URL (default https://
	// $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT) and
	// ServiceAccountDir holds the token and ca.crt to use with it
	// (DefaultServiceAccountDir). Without them the Node is not read.
	APIServer         string
	ServiceAccountDir string
	// PodmanStorage is rootful Podman's graph root
	// (DefaultPodmanStorage): containers there mean Podman is in use, and
	// takes GPUs only through CDI.
	PodmanStorage string
	// RuntimeSocket is the create server's socket (gantry-runtime
	// --create-server), asked whether it runs the registered
	// gantry-runtime's build: default $GANTRY_RUNTIME_SOCKET, else
	// /run/gantry/runtime.sock, as gantry-runtime looks for it. Empty
	// (only where defaults did not run) leaves the server unchecked.
	RuntimeSocket string
	// ServicePATH is the PATH dockerd runs with when none runs now to read
	// it from (DefaultServicePATH: systemd's PATH for services), where
	// docker run --gpus will look for the hook.
	ServicePATH string
	// CRIUConfigs are the CRIU configuration files read for a
	// network-lock line (ctrckpt.CRIUConfigs: runc's, then CRIU's default).
	CRIUConfigs []string

	// serverPings holds each ping's answer by socket and runtime, so
	// that the engine checks ask once: a ping of a new build, after an
	// upgrade, stops the server.
	serverPings map[string]serverPing
	// dockerCDIs holds, by socket, whether the running dockerd has CDI.
	dockerCDIs map[string]bool
	// serverProbes holds what was found at the create server's socket.
	serverProbes map[string]*serverProbe
}

func (o *Options) defaults() {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&o.Proc, "/proc")
	def(&o.Sys, "/sys")
	def(&o.DockerConfig, DefaultDockerConfig)
	def(&o.DockerSocket, DefaultDockerSocket)
	def(&o.ContainerdConfig, DefaultContainerdConfig)
	def(&o.CRIOConfig, DefaultCRIOConfig)
	def(&o.CRIODropins, DefaultCRIODropins)
	def(&o.Docker, "docker")
	def(&o.KubeletDir, DefaultKubeletDir)
	def(&o.ContainerdState, DefaultContainerdState)
	def(&o.RuncRoot, DefaultRuncRoot)
	def(&o.PodmanStorage, DefaultPodmanStorage)
	def(&o.ServicePATH, DefaultServicePATH)
	if o.CRISockets == nil {
		o.CRISockets = DefaultCRISockets
	}
	if o.CRIUConfigs == nil {
		o.CRIUConfigs = ctrckpt.CRIUConfigs
	}
	def(&o.RuntimeSocket, os.Getenv(createproto.ServerSocketEnv))
	def(&o.RuntimeSocket, createproto.DefaultServerSocket)
	if o.serverPings == nil {
		o.serverPings = map[string]serverPing{}
	}
	if o.dockerCDIs == nil {
		o.dockerCDIs = map[string]bool{}
	}
	if o.serverProbes == nil {
		o.serverProbes = map[string]*serverProbe{}
	}
	if o.Config.DriverRoot == "" {
		o.Config.DriverRoot = "/"
	}
}

// Failed reports whether any check failed.
func Failed(checks []Check) bool {
	for _, c := range checks {
		if !c.OK {
			return true
		}
	}
	return false
}

// Write prints one line per check, "STATUS name: evidence", and a
// "fix:" line under each failure and warning.
func Write(w io.Writer, checks []Check) error {
	var b bytes.Buffer
	for _, c := range checks {
		fmt.Fprintf(&b, "%s %s: %s\n", c.Status, c.Name, c.Evidence)
		if (c.Status == Fail || c.Status == Warn) && c.Fix != "" {
			fmt.Fprintf(&b, "     fix: %s\n", c.Fix)
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

func pass(name, format string, a ...any) Check {
	return Check{Name: name, Status: Pass, OK: true, Evidence: fmt.Sprintf(format, a...)}
}

func skip(name, format string, a ...any) Check {
	return Check{Name: name, Status: Skip, OK: true, Evidence: fmt.Sprintf(format, a...)}
}

func info(name, format string, a ...any) Check {
	return Check{Name: name, Status: Info, OK: true, Evidence: fmt.Sprintf(format, a...)}
}

// warn is a risk worth fixing that fails nothing: OK, with its fix.
func warn(name, fix, format string, a ...any) Check {
	return Check{Name: name, Status: Warn, OK: true, Evidence: fmt.Sprintf(format, a...), Fix: fix}
}

func fail(name, fix, format string, a ...any) Check {
	return Check{Name: name, Status: Fail, Evidence: fmt.Sprintf(format, a...), Fix: fix}
}

// after returns a skip naming the failed prerequisite, or nil when all passed.
func after(name string, prereqs ...Check) *Check {
	for _, p := range prereqs {
		if p.Status != Pass {
			c := skip(name, "not checked: %s did not pass", p.Name)
			return &c
		}
	}
	return nil
}

func isSim(cfg config.Config) bool { return strings.HasPrefix(cfg.GPUs, "sim:") }

func checkKernel(opts Options) (Check, string) {
	cfg := opts.Config
	version, file, err := kernelVersion(opts)
	if err != nil {
		return fail(CheckKernel, fix(fixVersionFile),
			"reading the driver version: %v", err), ""
	}
	if version == "" {
		return fail(CheckKernel, fix(fixKernelModule),
			"no proc/driver/nvidia/version under %s nor %s or %s on the host: the nvidia kernel module is not loaded",
			cfg.DriverRoot, filepath.Join(opts.Proc, "driver/nvidia/version"), filepath.Join(opts.Sys, "module/nvidia/version")), ""
	}
	return pass(CheckKernel, "NVIDIA kernel module %s (%s)", version, file), version
}

// checkDeviceNodes checks the control nodes and counts the GPU nodes.
func checkDeviceNodes(opts Options) Check {
	devRoot := opts.Config.EffectiveDevRoot()
	var problems, found []string
	ctl, err := driver.StatDevice(devRoot, "/dev/nvidiactl")
	switch {
	case err != nil:
		problems = append(problems, fmt.Sprintf("/dev/nvidiactl: %v", err))
	case ctl.Major != 195 || ctl.Minor != 255:
		problems = append(problems, fmt.Sprintf("/dev/nvidiactl is %d:%d, want 195:255", ctl.Major, ctl.Minor))
	default:
		found = append(found, "nvidiactl 195:255")
	}
	uvmMajor, devicesFile := procDevicesMajor(opts, "nvidia-uvm")
	uvm, err := driver.StatDevice(devRoot, "/dev/nvidia-uvm")
	switch {
	case uvmMajor < 0:
		problems = append(problems, fmt.Sprintf("nvidia-uvm is not in %s: the nvidia-uvm module is not loaded (CUDA needs it)", devicesFile))
	case err != nil:
		problems = append(problems, fmt.Sprintf("/dev/nvidia-uvm: %v", err))
	case uvm.Major != int64(uvmMajor):
		problems = append(problems, fmt.Sprintf("/dev/nvidia-uvm has major %d but %s gives nvidia-uvm major %d (a stale node from an earlier boot)", uvm.Major, devicesFile, uvmMajor))
	default:
		found = append(found, fmt.Sprintf("nvidia-uvm %d:%d", uvm.Major, uvm.Minor))
	}
	gpus := 0
	entries, _ := os.ReadDir(filepath.Join(devRoot, "dev"))
	for _, e := range entries {
		n, ok := strings.CutPrefix(e.Name(), "nvidia")
		if _, err := strconv.Atoi(n); !ok || err != nil {
			continue
		}
		if f, err := driver.StatDevice(devRoot, "/dev/"+e.Name()); err == nil && f.Major == 195 {
			gpus++
		}
	}
	if gpus == 0 {
		problems = append(problems, fmt.Sprintf("no /dev/nvidiaN GPU node with major 195 under %s", filepath.Join(devRoot, "dev")))
	} else {
		found = append(found, fmt.Sprintf("%d GPU nodes /dev/nvidiaN", gpus))
	}
	if len(problems) > 0 {
		f := fix(fixDeviceNodes)
		if filepath.Clean(devRoot) != "/" {
			f = fix(fixDeviceNodesIn, "DEVROOT", devRoot, "ROOT", opts.Config.DriverRoot)
		}
		return fail(CheckDeviceNodes, f, "%s", strings.Join(problems, "; "))
	}
	return pass(CheckDeviceNodes, "%s under %s", strings.Join(found, ", "), devRoot)
}

// procDevicesMajor returns the character major of name from the driver
// root's proc/devices if it has one (a fake or containerised root), else the
// host's; -1 when not listed.
func procDevicesMajor(opts Options, name string) (int, string) {
	file := filepath.Join(opts.Proc, "devices")
	if r := filepath.Join(opts.Config.DriverRoot, "proc/devices"); opts.Config.DriverRoot != "/" {
		if _, err := os.Stat(r); err == nil {
			file = r
		}
	}
	f, err := os.Open(file)
	if err != nil {
		return -1, file
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "Block devices") {
			break
		}
		fields := strings.Fields(line)
		if len(fields) == 2 && fields[1] == name {
			if n, err := strconv.Atoi(fields[0]); err == nil {
				return n, file
			}
		}
	}
	return -1, file
}

// checkGPUNodes checks each GPU the driver reports against its own node,
// /dev/nvidia<minor>: counting the nodes says nothing about which is gone.
func checkGPUNodes(opts Options, sys *gpu.System) Check {
	if sys == nil {
		return skip(CheckGPUNodes, "not checked: the driver reported no GPUs (see %s)", CheckNVML)
	}
	devRoot := opts.Config.EffectiveDevRoot()
	var problems, fixes, mknods, minors []string
	for _, d := range sys.Devices {
		path := d.DevicePath()
		f, err := driver.StatDevice(devRoot, path)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("GPU %d (%s): %s: %v", d.Index, d.UUID, path, err))
		case f.Major != 195 || f.Minor != int64(d.Minor):
			problems = append(problems, fmt.Sprintf("GPU %d (%s): %s is %d:%d, want 195:%d", d.Index, d.UUID, path, f.Major, f.Minor, d.Minor))
		default:
			continue
		}
		fixes = append(fixes, fmt.Sprintf("nvidia-modprobe -c=%d", d.Minor))
		mknods = append(mknods, fmt.Sprintf("mknod -m 666 %s c 195 %d", filepath.Join(devRoot, "dev", fmt.Sprintf("nvidia%d", d.Minor)), d.Minor))
		minors = append(minors, strconv.Itoa(d.Minor))
	}
	if len(problems) > 0 {
		minor := "N"
		if len(minors) == 1 {
			minor = minors[0]
		}
		f := fix(fixGPUNode, "nvidia-modprobe -c=MINOR", strings.Join(fixes, "; "), "MINOR", minor)
		if filepath.Clean(devRoot) != "/" {
			f = fix(fixGPUNodeIn, "mknod -m 666 DEVROOT/dev/nvidiaMINOR c 195 MINOR", strings.Join(mknods, "; "))
		}
		return fail(CheckGPUNodes, f, "%s", strings.Join(problems, "; "))
	}
	return pass(CheckGPUNodes, "each of the %d GPUs has its node /dev/nvidia<minor> 195:<minor> under %s", len(sys.Devices), devRoot)
}

func checkNVML(cfg config.Config) (Check, *gpu.System) {
	sys, err := discover.GPUs(cfg, false)
	if isSim(cfg) {
		if err != nil {
			return fail(CheckNVML, fix(fixSimGPUs), "simulated GPUs %s: %v", cfg.GPUs, err), nil
		}
		return skip(CheckNVML, "not initialised: GPUs are simulated (--gpus %s, %d GPUs)", cfg.GPUs, len(sys.Devices)), sys
	}
	if err != nil {
		return fail(CheckNVML, fix(fixNVML),
			"%v", err), nil
	}
	return pass(CheckNVML, "initialised: %d GPUs", len(sys.Devices)), sys
}

// checkDriverFiles discovers the files a container would get and checks
// that the core ones exist and every library's SONAME link leads to it.
func checkDriverFiles(cfg config.Config) Check {
	inv, err := discover.Driver(cfg)
	if err != nil {
		return fail(CheckDriverFiles, fix(fixDriverRoot), "%v", err)
	}
	var problems []string
	if len(inv.Missing) > 0 {
		problems = append(problems, fmt.Sprintf("driver %s under %s: not found: %s", inv.Version, inv.Root, strings.Join(inv.Missing, ", ")))
	}
	var badLinks []string
	for _, lib := range inv.Libraries {
		if lib.SONAME == "" || lib.SONAME == filepath.Base(lib.ContainerPath) {
			continue
		}
		link := filepath.Join(filepath.Dir(lib.ContainerPath), lib.SONAME)
		got, err := driver.ResolveInRoot(inv.Root, link)
		if err == nil {
			if st, serr := os.Stat(got); serr != nil || !st.Mode().IsRegular() {
				err = fmt.Errorf("dangling")
			} else if got != lib.HostPath {
				err = fmt.Errorf("leads to %s, not %s", got, lib.HostPath)
			}
		}
		if err != nil {
			badLinks = append(badLinks, fmt.Sprintf("%s (%v)", link, err))
		}
	}
	if len(badLinks) > 0 {
		problems = append(problems, "SONAME links that do not resolve to the driver's library: "+strings.Join(badLinks, ", "))
	}
	if len(problems) > 0 {
		f := fix(fixReinstall, "VERSION", inv.Version)
		if len(inv.Missing) == 0 {
			f = fix(fixSONAME, "ROOT", inv.Root)
		}
		return fail(CheckDriverFiles, f, "%s", strings.Join(problems, "; "))
	}
	return pass(CheckDriverFiles, "driver %s under %s: %d libraries (SONAME links resolve), %d programs, %d firmware files",
		inv.Version, inv.Root, len(inv.Libraries), len(inv.Binaries), len(inv.Firmware))
}

// checkLoaderCache checks the driver root's ld.so.cache against the
// driver's libraries: the loader (NVML's dlopen on the host, and every
// program that links libcuda) finds them through it, so a corrupt cache or
// one written before the driver was installed breaks them while the files
// themselves are fine.
func checkLoaderCache(cfg config.Config) Check {
	root := cfg.DriverRoot
	f := fix(fixLoaderCache, "ROOT", root)
	file, err := driver.ResolveInRoot(root, "/etc/ld.so.cache")
	if err != nil {
		return fail(CheckLoaderCache, f, "%s/etc/ld.so.cache: %v", strings.TrimSuffix(root, "/"), err)
	}
	cache, err := ldcache.Open(file)
	if err != nil {
		return fail(CheckLoaderCache, f, "%s cannot be read as a loader cache: %v (the loader then finds no driver library outside the default directories)", file, err)
	}
	inv, err := discover.Driver(cfg)
	if err != nil {
		return fail(CheckLoaderCache, fix(fixDriverRoot), "%v", err)
	}
	inCache := map[string]bool{}
	for _, e := range cache.Entries {
		inCache[e.Name] = true
	}
	// The libraries the loader is meant to find are those beside libcuda
	// and libnvidia-ml; those in subdirectories (vdpau/, gbm/, xorg/) are
	// opened by path by their own loaders and are rightly not cached.
	loaderDirs := map[string]bool{}
	for _, lib := range inv.Libraries {
		if lib.SONAME == "libcuda.so.1" || lib.SONAME == "libnvidia-ml.so.1" {
			loaderDirs[filepath.Dir(lib.HostPath)] = true
		}
	}
	var missing []string
	n := 0
	for _, lib := range inv.Libraries {
		if lib.SONAME == "" || !loaderDirs[filepath.Dir(lib.HostPath)] {
			continue
		}
		n++
		if !inCache[lib.SONAME] {
			missing = append(missing, lib.SONAME)
		}
	}
	if len(missing) > 0 {
		return fail(CheckLoaderCache, f, "%s has no entry for %d of the driver's %d libraries: %s (the cache predates the driver install, or ldconfig was not run)",
			file, len(missing), n, strings.Join(missing, ", "))
	}
	return pass(CheckLoaderCache, "%s lists all %d of the driver's libraries (%d entries)", file, n, len(cache.Entries))
}
