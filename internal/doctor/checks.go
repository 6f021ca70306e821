package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

// Need is a condition a check runs under (CheckDef.Needs).
type Need string

// The needs. Run reports a check whose need does not hold as SKIP naming
// the reason, or leaves it out for NeedContainer and NeedPod.
const (
	// NeedDriver: the kernel driver check passed.
	NeedDriver Need = "driver"
	// NeedDocker: Docker is installed (dockerd on PATH, or its daemon.json).
	NeedDocker Need = "docker"
	// NeedContainerd: containerd's CRI service answers, or its config.toml exists.
	NeedContainerd Need = "containerd"
	// NeedCRIO: CRI-O's crio.conf or a drop-in exists.
	NeedCRIO Need = "cri-o"
	// NeedKubernetes: this is a Kubernetes node (the kubelet directory exists).
	NeedKubernetes Need = "kubernetes"
	// NeedContainer: a container was named (--container).
	NeedContainer Need = "container"
	// NeedPod: a pod was named (--pod).
	NeedPod Need = "pod"
)

// env is one run of the checks: the options and what earlier checks
// found, for the checks after them.
type env struct {
	opts    Options
	results map[string]Check // the first result of each check, by name

	version string      // the kernel module's driver version
	sys     *gpu.System // the GPUs the driver (or the simulator) reports

	device []Check // the container device checks, made with the request

	kube *kubeState

	liveDone   bool
	live       []registered // the running containerd's runtimes
	liveSocket string
	liveDirs   containerdDirs // its state and root directories
	liveErr    error
}

func newEnv(opts Options) *env { return &env{opts: opts, results: map[string]Check{}} }

// Run walks the chain and returns every check, in order.
func Run(opts Options) []Check {
	givenState := opts.ContainerdState != ""
	opts.defaults()
	e := newEnv(opts)
	// --cri-socket names the containerd to read: its tasks too, where
	// its state directory is, unless --containerd-state says otherwise.
	if !givenState && opts.CRISocket != "" && (opts.Container != "" || opts.Pod != "") {
		if _, _, err := e.containerdLive(); err == nil && e.liveDirs.State != "" {
			e.opts.ContainerdState = e.liveDirs.State
		}
	}
	return e.run(AllChecks())
}

// run runs defs in order.
func (e *env) run(defs []CheckDef) []Check {
	var out []Check
	for _, d := range defs {
		got, omit := e.unmet(d)
		if omit {
			continue
		}
		if got == nil {
			got = d.run(e)
		}
		for _, c := range got {
			if _, ok := e.results[c.Name]; !ok {
				e.results[c.Name] = c
			}
		}
		out = append(out, got...)
	}
	return out
}

// unmet returns the skip for the first need of d that does not hold, or
// omit when d is not asked for at all.
func (e *env) unmet(d CheckDef) (skipped []Check, omit bool) {
	o := e.opts
	// A container or pod not named is not reported at all, whatever else
	// does not hold.
	for _, n := range d.Needs {
		if n == NeedContainer && o.Container == "" || n == NeedPod && o.Pod == "" {
			return nil, true
		}
	}
	for _, n := range d.Needs {
		var c *Check
		switch n {
		case NeedDriver:
			// (A subset of the checks run without it, as checkKubernetes
			// runs them, does not ask.)
			if k, ok := e.results[CheckKernel]; ok {
				c = after(d.Name, k)
			}
		case NeedDocker:
			if !dockerInstalled(o) {
				s := skip(d.Name, "Docker is not installed (no dockerd on PATH, no %s)", o.DockerConfig)
				c = &s
			}
		case NeedContainerd:
			// A socket named, or one at a default path, is containerd
			// running (CRI answering or not).
			if _, socket, err := e.containerdLive(); err != nil && o.CRISocket == "" && !isSocket(socket) {
				if _, err := os.Stat(o.ContainerdConfig); errors.Is(err, fs.ErrNotExist) {
					s := skip(d.Name, "%s does not exist (containerd not installed, or running on defaults without GPU support)", o.ContainerdConfig)
					c = &s
				}
			}
		case NeedCRIO:
			if _, files, err := engineconfig.ReadCRIO(o.CRIOConfig, o.CRIODropins); len(files) == 0 && errors.Is(err, fs.ErrNotExist) {
				s := skip(d.Name, "neither %s nor %s exist (CRI-O not installed)", o.CRIOConfig, o.CRIODropins)
				c = &s
			}
		case NeedKubernetes:
			if !isDir(o.KubeletDir) {
				s := skip(d.Name, "not a Kubernetes node: no kubelet directory %s", o.KubeletDir)
				c = &s
			}
		case NeedContainer, NeedPod:
			// named (above)
		default:
			eng, ok := needEngine(n)
			if !ok {
				panic(fmt.Sprintf("doctor: check %q needs %q, which Run does not know", d.Name, n))
			}
			if !engineInstalled(o, eng) {
				s := skip(d.Name, "%s is not installed (no %s on PATH, no %s)", eng.Title, eng.Program, engineConfig(o, eng))
				c = &s
			}
		}
		if c != nil {
			return []Check{*c}, false
		}
	}
	return nil, false
}

// result is the first result of an earlier check; a SKIP when it did not run.
func (e *env) result(name string) Check {
	if c, ok := e.results[name]; ok {
		return c
	}
	return skip(name, "not run")
}

func isSocket(p string) bool {
	st, err := os.Stat(p)
	return p != "" && err == nil && st.Mode()&os.ModeSocket != 0
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// containerdLive asks the running containerd once.
func (e *env) containerdLive() ([]registered, string, error) {
	if !e.liveDone {
		e.live, e.liveSocket, e.liveErr = liveContainerdRuntimes(e.opts.CRISocket, e.opts.CRISockets, &e.liveDirs)
		e.liveDone = true
	}
	return e.live, e.liveSocket, e.liveErr
}

// kubeState asks the kubelet and its plugins once.
func (e *env) kubeState() *kubeState {
	if e.kube == nil {
		e.kube = newKubeState(e.opts)
	}
	return e.kube
}

// only returns the checks named, in AllChecks' order.
func only(names ...string) []CheckDef {
	var out []CheckDef
	for _, d := range AllChecks() {
		for _, n := range names {
			if d.Name == n {
				out = append(out, d)
			}
		}
	}
	return out
}

// checkKubernetes runs the node checks when this host runs a kubelet, and
// the pod check when a pod was named.
func checkKubernetes(opts Options) []Check {
	return newEnv(opts).run(only(CheckDevicePlugin, CheckPluginHealth, CheckAllocatable, CheckCheckpoint, CheckNode, CheckPod))
}

// newKubeState asks the node's kubelet and its device plugins.
func newKubeState(opts Options) *kubeState {
	s := &kubeState{hints: hintsFor(opts), dir: filepath.Join(opts.KubeletDir, "device-plugins")}
	var sockets []string
	sockets, s.kubelet, s.socketsErr = pluginSockets(s.dir)
	s.endpoints = probePlugins(s.dir, sockets)
	s.checkpoint, s.checkpointErr = readCheckpoint(s.dir)

	s.podResources = filepath.Join(opts.KubeletDir, "pod-resources", "kubelet.sock")
	client, closeConn, err := dialPodResources(s.podResources)
	if err != nil {
		s.prErr = err
		return s
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.list, s.listErr = client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if s.listErr != nil {
		s.listErr = fmt.Errorf("pod-resources %s: List: %v", s.podResources, status.Convert(s.listErr).Message())
	}
	s.alloc, s.allocErr = client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	return s
}

// The run functions of Checks, one per check, in order.

func one(c Check) []Check { return []Check{c} }

func (e *env) kernel() []Check {
	c, version := checkKernel(e.opts)
	e.version = version
	return one(c)
}

func (e *env) deviceNodes() []Check { return one(checkDeviceNodes(e.opts)) }

func (e *env) nvml() []Check {
	cfg := e.opts.Config
	if c := after(CheckNVML, e.result(CheckKernel), e.result(CheckDeviceNodes)); c != nil && !isSim(cfg) {
		return one(*c)
	}
	c, sys := checkNVML(cfg)
	e.sys = sys
	return one(c)
}

func (e *env) gpuNodes() []Check { return one(checkGPUNodes(e.opts, e.sys)) }

func (e *env) persistence() []Check {
	return one(checkPersistence(e.opts.Config, e.result(CheckNVML)))
}

func (e *env) versions() []Check {
	return one(checkVersions(e.opts, e.version, e.sys, e.result(CheckNVML)))
}

// afterVersions skips a check that looks for the kernel module's version
// of the driver's files while the libraries are another version: its
// fix would be to install the module's version, a downgrade where the
// libraries were upgraded (the versions check has the fix).
func (e *env) afterVersions(name string) *Check {
	if v := e.result(CheckVersions); v.Status == Fail {
		return after(name, v)
	}
	return nil
}

func (e *env) driverFiles() []Check {
	if c := e.afterVersions(CheckDriverFiles); c != nil {
		return one(*c)
	}
	return one(checkDriverFiles(e.opts.Config))
}

func (e *env) loaderCache() []Check {
	if c := e.afterVersions(CheckLoaderCache); c != nil {
		return one(*c)
	}
	return one(checkLoaderCache(e.opts.Config))
}

func (e *env) inventoryCache() []Check {
	return one(checkInventoryCache(e.opts.Config, e.version))
}

func (e *env) cdiSpecs() []Check {
	if c := e.afterVersions(CheckCDISpecs); c != nil {
		return one(*c)
	}
	return one(checkCDISpecs(e.opts, e.version))
}

// docker: Docker has two GPU paths, --runtime nvidia (daemon.json) and
// --gpus (the hook): each is a failure only when the other does not work.
func (e *env) docker() []Check { return one(checkDocker(e.opts, true, hookUsable(e.opts))) }

func (e *env) containerd() []Check {
	live, socket, err := e.containerdLive()
	if c := criSocketProblem(e.opts, socket, err); c != nil {
		return one(*c)
	}
	return one(checkContainerd(e.opts, live, socket, err))
}

func (e *env) crio() []Check { return one(checkCRIO(e.opts)) }

func (e *env) hook() []Check {
	return one(checkHook(e.opts, dockerInstalled(e.opts), e.result(CheckDocker).Status == Pass))
}

func (e *env) createServer() []Check { return one(checkCreateServer(e.opts)) }

// container examines --container; its device access, found with it, is
// the next check's.
func (e *env) container() []Check {
	var out []Check
	for _, c := range checkContainer(e.opts) {
		if c.Name == CheckContainerDevice {
			e.device = append(e.device, c)
		} else {
			out = append(out, c)
		}
	}
	return out
}

func (e *env) containerDevice() []Check { return e.device }

func (e *env) devicePlugin() []Check { return one(checkDevicePlugin(e.kubeState())) }

func (e *env) pluginHealth() []Check {
	return one(checkPluginHealth(e.kubeState(), e.result(CheckDevicePlugin)))
}

func (e *env) allocatable() []Check { return one(checkAllocatable(e.kubeState())) }

func (e *env) checkpoint() []Check { return one(checkCheckpoint(e.kubeState())) }

func (e *env) node() []Check { return one(checkNode(e.opts, e.kubeState())) }

func (e *env) pod() []Check {
	o := e.opts
	if !isDir(o.KubeletDir) {
		return one(fail(CheckPod, fix(fixWrongNode), "pod %s: no kubelet directory %s, so no pod runs here", o.Pod, o.KubeletDir))
	}
	s := e.kubeState()
	if s.prErr != nil {
		return one(*after(CheckPod, e.result(CheckAllocatable)))
	}
	return one(checkPod(o.Pod, s.list, s.listErr))
}

func (e *env) podContainers() []Check { return checkPodContainers(e.opts) }
