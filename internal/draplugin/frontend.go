package draplugin

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	sigsyaml "sigs.k8s.io/yaml"

	gconfig "github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpuowner"
	"github.com/gantry-gpu/gantry/internal/health"
	"github.com/gantry-gpu/gantry/internal/mps"
)

// DefaultHookPath is where the node installer (`make install`) puts the
// CDI hook binary on the host; the runtime runs it from there, outside the
// plugin's container.
const DefaultHookPath = "/usr/bin/gantry-cdi-hook"

// DefaultSimHealthSocket is where the simulated health source listens for
// injected faults; not the device plugin's, so both can run on one host.
const DefaultSimHealthSocket = "/run/gantry/dra-sim-health.sock"

// Default kubelet directories for DRA plugins.
const (
	DefaultPluginsDir  = "/var/lib/kubelet/plugins"
	DefaultRegistryDir = kubeletplugin.KubeletRegistryDir
)

// flags are the command line, each with an environment variable the
// DaemonSet can set instead.
type flags struct {
	driverName, nodeName, gpus, driverRoot, devRoot, hostRoot, cdiRoot, hookPath, pluginDir, registryDir string
	healthDisable, healthEnable, simHealthSocket, devices, mpsShmSize                                    string
	ownersDir                                                                                            string
	dryRun                                                                                               bool
}

func (f *flags) register(fs *flag.FlagSet, getenv func(string) string) {
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	fs.StringVar(&f.driverName, "driver-name", env("DRIVER_NAME", DefaultDriverName), "DRA driver name the DeviceClasses select (env DRIVER_NAME)")
	fs.StringVar(&f.nodeName, "node-name", env("NODE_NAME", ""), "this node's name, the pool of its ResourceSlices (env NODE_NAME)")
	fs.StringVar(&f.gpus, "gpus", env("GANTRY_GPUS", ""), "GPU backend: nvml, sim:PROFILE (e.g. sim:h100x8) or sim:FILE (env GANTRY_GPUS; default: Gantry's gpus, nvml)")
	fs.StringVar(&f.driverRoot, "driver-root", env("NVIDIA_DRIVER_ROOT", ""), "where the driver is installed on the host (env NVIDIA_DRIVER_ROOT; default: Gantry's driver-root, /)")
	fs.StringVar(&f.devRoot, "dev-root", env("NVIDIA_DEV_ROOT", ""), "where the device nodes are on the host (env NVIDIA_DEV_ROOT; default: the driver root)")
	fs.StringVar(&f.hostRoot, "host-root", env("HOST_ROOT", "/"), "where the host's / is mounted in the plugin's container; --driver-root and --dev-root are host paths under it (env HOST_ROOT)")
	fs.StringVar(&f.cdiRoot, "cdi-root", env("CDI_ROOT", DefaultCDIRoot), "directory of the per-claim CDI specs, one the container runtime reads (env CDI_ROOT)")
	fs.StringVar(&f.hookPath, "hook-path", env("GANTRY_CDI_HOOK_PATH", ""), "host path of gantry-cdi-hook that the specs' hooks run (env GANTRY_CDI_HOOK_PATH; default: Gantry's cdi.hook-path, else "+DefaultHookPath+")")
	fs.StringVar(&f.pluginDir, "plugin-dir", env("PLUGIN_DIR", ""), "directory of the DRA socket, the checkpoint and the MPS daemons' directories; a host path, the same in the plugin's container (env PLUGIN_DIR; default "+DefaultPluginsDir+"/DRIVER-NAME)")
	fs.StringVar(&f.registryDir, "registry-dir", env("REGISTRY_DIR", DefaultRegistryDir), "the kubelet's plugin registration directory (env REGISTRY_DIR)")
	fs.StringVar(&f.healthDisable, "disable-healthchecks", env(health.EnvDisableHealthChecks, ""), "all (or xids) turns device health reports off; a comma list of XIDs ignores them too (env "+health.EnvDisableHealthChecks+")")
	fs.StringVar(&f.healthEnable, "enable-healthchecks", env(health.EnvEnableHealthChecks, ""), "comma list of XIDs to treat as critical even though ignored by default (env "+health.EnvEnableHealthChecks+")")
	fs.StringVar(&f.simHealthSocket, "sim-health-socket", env("GANTRY_SIM_HEALTH_SOCKET", DefaultSimHealthSocket), "with simulated GPUs: the socket that accepts injected faults (`gantry sim` docs; env GANTRY_SIM_HEALTH_SOCKET)")
	fs.StringVar(&f.devices, "devices", env("GANTRY_DRA_DEVICES", ""), "comma list of GPUs (index, UUID, bus ID) or MIG devices (GPU:MIG, UUID) to publish, for a node shared with the device plugin (env GANTRY_DRA_DEVICES; default all)")
	fs.StringVar(&f.ownersDir, "owners-dir", env("GANTRY_OWNERS_DIR", ""), "host directory where the node's GPU plugins record the GPUs each offers, to refuse an overlap (env GANTRY_OWNERS_DIR; default gantry-gpu-owners beside --registry-dir, "+gpuowner.DefaultDir+")")
	fs.StringVar(&f.mpsShmSize, "mps-shm-size", env("GANTRY_MPS_SHM_SIZE", ""), "size of each MPS daemon's shm, a tmpfs the claim's containers get as /dev/shm: bytes, or Ki, Mi, Gi (env GANTRY_MPS_SHM_SIZE; default 1Gi)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "print the ResourceSlice devices this node would publish, as YAML, and exit")
}

const usage = `Usage: gantry-dra-plugin [flags]

Gantry's Kubernetes DRA (resource.k8s.io/v1) kubelet plugin: publishes the
node's GPUs and MIG devices as ResourceSlices of driver gpu.nvidia.com (the
DeviceClasses gpu.nvidia.com and mig.nvidia.com select them) and prepares
claims by writing one CDI spec per claim. NVIDIA's per-claim sharing
configuration (resource.nvidia.com/v1beta1 GpuConfig, MigDeviceConfig) is
applied at prepare: TimeSlicing sets the GPUs' time-slice interval, MPS
starts one MPS control daemon per claim (under --plugin-dir/mps), both with
the driver's own nvidia-smi and nvidia-cuda-mps-control run in the host's
root. Runs as a DaemonSet; see the guide's "Dynamic Resource Allocation"
section.

Flags:
`

// Main is gantry-dra-plugin: it serves the kubelet until SIGTERM or
// SIGINT and returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return run(ctx, args, os.Getenv, stdout, stderr)
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gantry-dra-plugin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	var f flags
	f.register(fs, getenv)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gantry-dra-plugin: unexpected argument %q (it takes flags only; see --help)\n", fs.Arg(0))
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if err := serve(ctx, f, stdout, log); err != nil {
		fmt.Fprintf(stderr, "gantry-dra-plugin: %v\n", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, f flags, stdout io.Writer, log *slog.Logger) error {
	gcfg, _, err := gconfig.Load("")
	if err != nil {
		return err
	}
	if f.gpus != "" {
		gcfg.GPUs = f.gpus
	}
	if f.driverRoot != "" {
		gcfg.DriverRoot = f.driverRoot
	}
	if f.devRoot != "" {
		gcfg.DevRoot = f.devRoot
	}
	if !filepath.IsAbs(f.hostRoot) {
		return fmt.Errorf("--host-root %q: want an absolute path", f.hostRoot)
	}
	shmSize, err := mps.ParseShmSize("--mps-shm-size", f.mpsShmSize)
	if err != nil {
		return err
	}
	hostDriverRoot, hostDevRoot := gcfg.DriverRoot, gcfg.EffectiveDevRoot()
	gcfg.DriverRoot = filepath.Join(f.hostRoot, hostDriverRoot)
	gcfg.DevRoot = filepath.Join(f.hostRoot, hostDevRoot)
	if err := gconfig.ValidateGPUs(gcfg.GPUs); err != nil {
		return fmt.Errorf("--gpus %q: %w", gcfg.GPUs, err)
	}
	sys, err := discover.GPUs(gcfg, false)
	if err != nil {
		return fmt.Errorf("discovering GPUs (%s): %w", gcfg.GPUs, err)
	}
	if f.dryRun {
		devs, err := Devices(sys)
		if err != nil {
			return err
		}
		if devs, err = Only(sys, devs, f.devices); err != nil {
			return err
		}
		node := f.nodeName
		if node == "" {
			node = "NODE"
		}
		var out []byte
		for _, sl := range SliceObjects(f.driverName, node, devs) {
			b, err := sigsyaml.Marshal(sl)
			if err != nil {
				return err
			}
			out = append(append(out, "---\n"...), b...)
		}
		_, err = stdout.Write(out)
		return err
	}
	inv, err := discover.Driver(gcfg)
	if err != nil {
		if !strings.HasPrefix(gcfg.GPUs, "sim:") {
			return fmt.Errorf("finding the driver's files under %q: %w (set --driver-root)", gcfg.DriverRoot, err)
		}
		log.Warn("no driver files found; the simulated GPUs' claims get device nodes only", "driverRoot", gcfg.DriverRoot, "err", err)
		inv = &driver.Inventory{}
	}
	hook := f.hookPath
	if hook == "" {
		hook = gcfg.CDI.HookPath
	}
	if hook == "" {
		hook = DefaultHookPath
	}
	if !filepath.IsAbs(hook) {
		return fmt.Errorf("--hook-path %q: want an absolute host path", hook)
	}
	if f.pluginDir == "" {
		f.pluginDir = filepath.Join(DefaultPluginsDir, f.driverName)
	}
	if err := os.MkdirAll(f.pluginDir, 0o750); err != nil {
		return fmt.Errorf("plugin directory: %w", err)
	}
	policy, disabled, err := health.PolicyFromEnv(f.healthDisable, f.healthEnable)
	if err != nil {
		return err
	}
	var src health.Source
	switch {
	case disabled:
		log.Warn("device health checks disabled: the kubelet gets no health reports")
	case strings.HasPrefix(gcfg.GPUs, "sim:"):
		policy.Log = log
		if err := os.MkdirAll(filepath.Dir(f.simHealthSocket), 0o755); err != nil {
			return fmt.Errorf("simulated health socket: %w", err)
		}
		src = health.NewSim(f.simHealthSocket, policy)
	default:
		policy.Log = log
		src = health.NewNVML(gcfg.DriverRoot, policy)
	}
	d, err := New(Options{
		DriverName: f.driverName, NodeName: f.nodeName, System: sys, Inventory: inv,
		CDIRoot: f.cdiRoot, Checkpoint: filepath.Join(f.pluginDir, CheckpointFile),
		HookPath: hook, DevRoot: gcfg.DevRoot, HostRoot: f.hostRoot, Devices: f.devices, Health: src, Log: log,
		MPSShmSize: shmSize,
	})
	if err != nil {
		return err
	}
	restCfg, err := rest.InClusterConfig()
	if err != nil {
		return fmt.Errorf("API server client: %w (the plugin runs in a pod with a service account)", err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("API server client: %w", err)
	}
	owner, err := claimGPUs(ctx, f, d, client, log)
	if err != nil {
		return err
	}
	defer owner.Release()
	srv, err := Start(ctx, d, client, f.pluginDir, f.registryDir)
	if err != nil {
		return err
	}
	defer srv.Stop()
	log.Info("serving", "driver", f.driverName, "node", f.nodeName, "gpus", gcfg.GPUs, "devices", len(d.Devices()),
		"prepared", len(d.Prepared()), "cdiRoot", f.cdiRoot, "pluginDir", f.pluginDir)
	<-ctx.Done()
	log.Info("stopping")
	return nil
}

// Server is a running plugin: the kubelet plugin helper and the health
// watch.
type Server struct {
	Helper *kubeletplugin.Helper
	cancel context.CancelFunc
	done   chan struct{}
	drv    *Driver
}

// Stop stops the helper (sockets, ResourceSlice controller) and the health
// watch, and waits for them.
func (s *Server) Stop() {
	s.cancel()
	if s.Helper != nil {
		s.Helper.Stop()
	}
	<-s.done
	// The MPS daemons' supervision ends; the daemons run on, for the
	// next run of the plugin to adopt.
	s.drv.mpsWG.Wait()
}

// Start starts the kubelet plugin helper for d (registration socket in
// registryDir, DRA socket in pluginDir), publishes d's devices and, with a
// health source, watches their health for the kubelet. Extra options come
// last.
func Start(ctx context.Context, d *Driver, client kubernetes.Interface, pluginDir, registryDir string, extra ...kubeletplugin.Option) (*Server, error) {
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(d.name),
		kubeletplugin.NodeName(d.pool),
		kubeletplugin.KubeClient(client),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		kubeletplugin.HealthService(d.healthSrc != nil),
	}
	d.lookup = func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
		return client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Server{cancel: cancel, done: make(chan struct{}), drv: d}
	d.runCtx = ctx
	d.resumeSharing()
	if d.healthSrc != nil {
		go func() {
			defer close(s.done)
			d.runHealth(ctx)
		}()
	} else {
		close(s.done)
	}
	helper, err := kubeletplugin.Start(ctx, d, append(opts, extra...)...)
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("starting the kubelet plugin: %w", err)
	}
	s.Helper = helper
	if err := helper.PublishResources(ctx, Resources(d.pool, d.devices)); err != nil {
		s.Stop()
		return nil, fmt.Errorf("publishing ResourceSlices: %w", err)
	}
	return s, nil
}
