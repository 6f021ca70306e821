package deviceplugin

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
	"strconv"
	"strings"
	"syscall"
	"time"

	gconfig "github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/gpu/nvml"
	"github.com/gantry-gpu/gantry/internal/gpuowner"
	"github.com/gantry-gpu/gantry/internal/health"
)

// DefaultSimHealthSocket is where the simulated health source listens for
// injected faults when gantry.health.simSocket is not set.
const DefaultSimHealthSocket = "/run/gantry/sim-health.sock"

// setting is one configuration key that an environment variable and a flag
// can also set (flag over variable over file over default), as NVIDIA's
// plugin has them.
type setting struct {
	key    string   // the file key
	env    []string // variables, first match wins
	flags  []string // flag names; the first is documented
	isBool bool
	usage  string
	apply  func(c *Config, v string) error
}

func boolSetter(dst func(c *Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("not a boolean; use true or false")
		}
		*dst(c) = b
		return nil
	}
}

func stringSetter(dst func(c *Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *dst(c) = v; return nil }
}

var settings = []setting{
	{key: "flags.migStrategy", env: []string{"MIG_STRATEGY"}, flags: []string{"mig-strategy"},
		usage: "how MIG devices become resources: none, single, mixed (default none)",
		apply: func(c *Config, v string) error { c.Flags.MigStrategy = MIGStrategy(v); return nil }},
	{key: "flags.failOnInitError", env: []string{"FAIL_ON_INIT_ERROR"}, flags: []string{"fail-on-init-error"}, isBool: true,
		usage: "exit when GPUs cannot be discovered; false waits idle instead (default true)",
		apply: boolSetter(func(c *Config) *bool { return &c.Flags.FailOnInitError })},
	{key: "flags.nvidiaDriverRoot", env: []string{"NVIDIA_DRIVER_ROOT"}, flags: []string{"driver-root", "nvidia-driver-root"},
		usage: "where the driver is installed on the host: / or /run/nvidia/driver (default: Gantry's driver-root, /)",
		apply: stringSetter(func(c *Config) *string { return &c.Flags.NvidiaDriverRoot })},
	{key: "flags.nvidiaDevRoot", env: []string{"NVIDIA_DEV_ROOT"}, flags: []string{"dev-root", "nvidia-dev-root"},
		usage: "where the device nodes are on the host (default: the driver root)",
		apply: stringSetter(func(c *Config) *string { return &c.Flags.NvidiaDevRoot })},
	{key: "flags.plugin.passDeviceSpecs", env: []string{"PASS_DEVICE_SPECS"}, flags: []string{"pass-device-specs"}, isBool: true,
		usage: "also list the device nodes in Allocate answers (default false)",
		apply: boolSetter(func(c *Config) *bool { return &c.Flags.Plugin.PassDeviceSpecs })},
	{key: "flags.plugin.deviceListStrategy", env: []string{"DEVICE_LIST_STRATEGY"}, flags: []string{"device-list-strategy"},
		usage: "comma list of envvar, volume-mounts, cdi-annotations, cdi-cri (default envvar)",
		apply: func(c *Config, v string) error {
			c.Flags.Plugin.DeviceListStrategy = nil
			for s := range strings.SplitSeq(v, ",") {
				if s = strings.TrimSpace(s); s != "" {
					c.Flags.Plugin.DeviceListStrategy = append(c.Flags.Plugin.DeviceListStrategy, DeviceListStrategy(s))
				}
			}
			return nil
		}},
	{key: "flags.plugin.deviceIDStrategy", env: []string{"DEVICE_ID_STRATEGY"}, flags: []string{"device-id-strategy"},
		usage: "name devices by uuid or index (default uuid)",
		apply: func(c *Config, v string) error { c.Flags.Plugin.DeviceIDStrategy = DeviceIDStrategy(v); return nil }},
	{key: "flags.plugin.cdiAnnotationPrefix", env: []string{"CDI_ANNOTATION_PREFIX"}, flags: []string{"cdi-annotation-prefix"},
		usage: "key prefix of CDI annotations (default cdi.k8s.io/)",
		apply: stringSetter(func(c *Config) *string { return &c.Flags.Plugin.CDIAnnotationPrefix })},
	{key: "flags.plugin.sharedDevicesAllocationPolicy", env: []string{"SHARED_DEVICES_ALLOCATION_POLICY"}, flags: []string{"shared-devices-allocation-policy"},
		usage: "how replicas are preferred: distributed or packed (default distributed)",
		apply: func(c *Config, v string) error { c.Flags.Plugin.AllocationPolicy = AllocationPolicy(v); return nil }},
	{key: "flags.deviceDiscoveryStrategy", env: []string{"DEVICE_DISCOVERY_STRATEGY"}, flags: []string{"device-discovery-strategy"},
		usage: "auto or nvml (default auto)",
		apply: stringSetter(func(c *Config) *string { return &c.Flags.DeviceDiscoveryStrategy })},
	{key: "flags.gdrcopyEnabled", env: []string{"GDRCOPY_ENABLED"}, flags: []string{"gdrcopy-enabled"}, isBool: true,
		usage: "set NVIDIA_GDRCOPY=enabled in containers with GPUs",
		apply: boolSetter(func(c *Config) *bool { return &c.Flags.GDRCopyEnabled })},
	{key: "flags.gdsEnabled", env: []string{"GDS_ENABLED"}, flags: []string{"gds-enabled"}, isBool: true,
		usage: "set NVIDIA_GDS=enabled in containers with GPUs",
		apply: boolSetter(func(c *Config) *bool { return &c.Flags.GDSEnabled })},
	{key: "flags.mofedEnabled", env: []string{"MOFED_ENABLED"}, flags: []string{"mofed-enabled"}, isBool: true,
		usage: "set NVIDIA_MOFED=enabled in containers with GPUs",
		apply: boolSetter(func(c *Config) *bool { return &c.Flags.MOFEDEnabled })},
	{key: "flags.mpsRoot", env: []string{"MPS_ROOT"}, flags: []string{"mps-root"},
		usage: "with sharing.mps: host directory of the MPS daemons' pipe, log and shm directories (default " + DefaultMPSRoot + ")",
		apply: stringSetter(func(c *Config) *string { return &c.Flags.MpsRoot })},
	{key: "gantry.mpsShmSize", env: []string{"GANTRY_MPS_SHM_SIZE"}, flags: []string{"mps-shm-size"},
		usage: "with sharing.mps: size of each MPS daemon's shm, a tmpfs its clients get as /dev/shm (default 1Gi)",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.MPSShmSize })},
	{key: "gantry.gpus", env: []string{"GANTRY_GPUS"}, flags: []string{"gpus"},
		usage: "GPU backend: nvml, sim:PROFILE (e.g. sim:h100x8) or sim:FILE (default: Gantry's gpus, nvml)",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.GPUs })},
	{key: "gantry.devices", env: []string{"GANTRY_DEVICES"}, flags: []string{"devices"},
		usage: "comma list of GPUs (index, UUID, bus ID) to offer, for a node shared with the DRA plugin (default all)",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.Devices })},
	{key: "gantry.ownersDir", env: []string{"GANTRY_OWNERS_DIR"}, flags: []string{"owners-dir"},
		usage: "host directory where the node's GPU plugins record the GPUs each offers, to refuse an overlap (default " + gpuowner.DefaultDir + ")",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.OwnersDir })},
	{key: "gantry.kubeletDir", env: []string{"GANTRY_KUBELET_DIR"}, flags: []string{"kubelet-dir"},
		usage: "directory of kubelet.sock and the plugin sockets (default " + DefaultKubeletDir + ")",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.KubeletDir })},
	{key: "gantry.kubeletDir", env: []string{"KUBELET_SOCKET"}, flags: []string{"kubelet-socket"},
		usage: "the kubelet's registration socket; its directory becomes the kubelet directory",
		apply: func(c *Config, v string) error {
			if filepath.Base(v) != KubeletSocketName {
				return fmt.Errorf("the kubelet's socket is named %s; give its path or use --kubelet-dir", KubeletSocketName)
			}
			c.Gantry.KubeletDir = filepath.Dir(v)
			return nil
		}},
	{key: "gantry.cdiKind", env: []string{"GANTRY_CDI_KIND"}, flags: []string{"cdi-kind"},
		usage: "vendor/class of CDI names in Allocate answers (default: Gantry's cdi.kind, nvidia.com/gpu)",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.CDIKind })},
	{key: "gantry.cdiSpecDir", env: []string{"GANTRY_CDI_SPEC_DIR"}, flags: []string{"cdi-spec-dir"},
		usage: "with a cdi-* strategy and no --cdi-kind: where the plugin writes its own CDI spec (default " + DefaultCDISpecDir + ")",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.CDISpecDir })},
	{key: "gantry.cdiHookPath", env: []string{"GANTRY_CDI_HOOK_PATH"}, flags: []string{"cdi-hook-path"},
		usage: "host path of gantry-cdi-hook that the plugin's CDI spec runs (default: Gantry's cdi.hook-path, else " + DefaultCDIHookPath + ")",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.CDIHookPath })},
	{key: "gantry.hostRoot", env: []string{"HOST_ROOT"}, flags: []string{"host-root"},
		usage: "where the host's / is mounted in the plugin's container, for the plugin's CDI spec (default /)",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.HostRoot })},
	{key: "gantry.health.recoveryQuietPeriod", env: []string{"GANTRY_HEALTH_RECOVERY_QUIET"}, flags: []string{"health-recovery-quiet"},
		usage: "an unhealthy GPU is healthy again after this long without a critical event; 0s never (default 10m)",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.Health.RecoveryQuietPeriod })},
	{key: "gantry.health.disable", env: []string{health.EnvDisableHealthChecks}, flags: []string{"disable-healthchecks"},
		usage: "all (or xids) turns health checks off; a comma list of XIDs ignores them too",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.Health.Disable })},
	{key: "gantry.health.enable", env: []string{health.EnvEnableHealthChecks}, flags: []string{"enable-healthchecks"},
		usage: "comma list of XIDs to treat as critical even though ignored by default",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.Health.Enable })},
	{key: "gantry.health.simSocket", env: []string{"GANTRY_SIM_HEALTH_SOCKET"}, flags: []string{"sim-health-socket"},
		usage: "with simulated GPUs: the socket that accepts injected faults (default " + DefaultSimHealthSocket + ")",
		apply: stringSetter(func(c *Config) *string { return &c.Gantry.Health.SimSocket })},
}

// LoadEffective builds the configuration the way Main does: the file (if
// any), then the environment, then the flags that were set (flagValues,
// by flag name). It validates the result.
func LoadEffective(file string, getenv func(string) string, flagValues map[string]string) (Config, error) {
	c := DefaultConfig()
	if file != "" {
		var err error
		if c, err = LoadConfig(file); err != nil {
			return c, err
		}
	}
	for _, s := range settings {
		for _, e := range s.env {
			if v := getenv(e); v != "" {
				if err := s.apply(&c, v); err != nil {
					return c, fmt.Errorf("%w: %s=%s (%s): %v", ErrConfig, e, v, s.key, err)
				}
				c.setOrigin(s.key, e+"="+v)
				break
			}
		}
	}
	for _, s := range settings {
		for _, f := range s.flags {
			if v, ok := flagValues[f]; ok {
				if err := s.apply(&c, v); err != nil {
					return c, fmt.Errorf("%w: --%s=%s (%s): %v", ErrConfig, f, v, s.key, err)
				}
				c.setOrigin(s.key, "--"+f)
			}
		}
	}
	return c, c.Validate()
}

// boolFlag is a flag that may be given bare (--pass-device-specs) or with a value.
type boolFlag struct{ v *string }

func (b boolFlag) String() string {
	if b.v == nil {
		return ""
	}
	return *b.v
}
func (b boolFlag) Set(s string) error { *b.v = s; return nil }
func (b boolFlag) IsBoolFlag() bool   { return true }

// Main is gantry-device-plugin: it serves the node's GPUs to the kubelet
// until SIGTERM or SIGINT. It returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return run(ctx, args, os.Getenv, stdout, stderr)
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	allArgs := args
	mpsMode := len(args) > 0 && args[0] == "mps-control-daemon"
	if mpsMode {
		args = args[1:]
	}
	fs := flag.NewFlagSet("gantry-device-plugin", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	values := map[string]*string{}
	for _, s := range settings {
		for _, f := range s.flags {
			v := new(string)
			values[f] = v
			if s.isBool {
				fs.Var(boolFlag{v}, f, s.usage)
			} else {
				fs.StringVar(v, f, "", s.usage)
			}
		}
	}
	configFile := fs.String("config", "", "")
	fs.StringVar(configFile, "config-file", "", "")
	logLevel := fs.String("log-level", "info", "")
	dryRun := fs.Bool("dry-run", false, "")
	help := fs.Bool("help", false, "")
	fs.BoolVar(help, "h", false, "")
	mpsControl := fs.String("mps-control", "", "")
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(stderr, "gantry-device-plugin: %v (see --help)\n", err)
		return 2
	}
	if *help {
		writeHelp(stdout)
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gantry-device-plugin: unexpected argument %q; it takes flags only (see --help)\n", fs.Arg(0))
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "gantry-device-plugin: --log-level=%s: use debug, info, warn or error\n", *logLevel)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	set := map[string]string{}
	fs.Visit(func(f *flag.Flag) {
		if v, ok := values[f.Name]; ok {
			set[f.Name] = *v
		}
	})
	if pn, err := perNodeFromEnv(getenv, log); err != nil {
		fmt.Fprintf(stderr, "gantry-device-plugin: %v\n", err)
		return 1
	} else if pn != nil {
		if *configFile != "" {
			fmt.Fprintf(stderr, "gantry-device-plugin: --config %s and CONFIG_FILE_SRCDIR=%s: give one (the directory picks a file per node)\n", *configFile, pn.dir)
			return 2
		}
		return runPerNode(ctx, pn, allArgs, getenv, stdout, stderr)
	}
	file := *configFile
	if file == "" {
		file = getenv("CONFIG_FILE")
	}
	cfg, err := LoadEffective(file, getenv, set)
	if err != nil {
		fmt.Fprintf(stderr, "gantry-device-plugin: %v\n", err)
		return 1
	}
	obs, err := observabilityFromEnv(getenv)
	if err != nil {
		fmt.Fprintf(stderr, "gantry-device-plugin: %v\n", err)
		return 1
	}

	// Gantry's own config file gives the defaults the device plugin config
	// leaves open (backend, driver root, CDI kind).
	gcfg, _, err := gconfig.Load("")
	if err != nil {
		fmt.Fprintf(stderr, "gantry-device-plugin: %v\n", err)
		return 1
	}
	if cfg.Gantry.GPUs != "" {
		gcfg.GPUs = cfg.Gantry.GPUs
	}
	if cfg.Flags.NvidiaDriverRoot != "" {
		gcfg.DriverRoot = cfg.Flags.NvidiaDriverRoot
	}
	if cfg.Flags.NvidiaDevRoot != "" {
		gcfg.DevRoot = cfg.Flags.NvidiaDevRoot
	}
	cfg.Flags.NvidiaDriverRoot, cfg.Flags.NvidiaDevRoot = gcfg.DriverRoot, gcfg.EffectiveDevRoot()
	ownSpec := ownsCDISpec(&cfg)
	switch {
	case ownSpec:
		// The plugin writes the spec of the names it answers (cdiown.go).
		cfg.Gantry.CDIKind = OwnCDIVendor + "/gpu"
	case cfg.Gantry.CDIKind == "":
		cfg.Gantry.CDIKind = gcfg.CDI.Kind
	}
	cfg.Gantry.GPUs = gcfg.GPUs

	policy, disabled, err := health.PolicyFromEnv(cfg.Gantry.Health.Disable, cfg.Gantry.Health.Enable)
	if err != nil {
		fmt.Fprintf(stderr, "gantry-device-plugin: %v\n", err)
		return 1
	}
	if q := cfg.Gantry.Health.RecoveryQuietPeriod; q != "" {
		policy.RecoveryQuiet, _ = time.ParseDuration(q) // checked by Validate
	}

	for _, w := range cfg.Warnings() {
		log.Warn(w)
	}
	p, err := initPlugin(&cfg, log)
	if err != nil {
		// A required IMEX channel that is missing stops the plugin
		// whatever failOnInitError says, as NVIDIA's does.
		if cfg.Flags.FailOnInitError || *dryRun || errors.Is(err, ErrIMEXRequired) {
			fmt.Fprintf(stderr, "gantry-device-plugin: %v\n", err)
			return 1
		}
		log.Error("initialisation failed; waiting idle because failOnInitError is false", "err", err)
		<-ctx.Done()
		return 0
	}
	if *dryRun {
		printResources(stdout, p)
		return 0
	}
	if ownSpec && !mpsMode {
		specCtx, stopSpec := context.WithCancel(ctx)
		removeSpec, err := startOwnSpec(specCtx, &cfg, gcfg, p, log)
		defer func() { stopSpec(); removeSpec() }()
		if err != nil {
			fmt.Fprintf(stderr, "gantry-device-plugin: %v\n", err)
			return 1
		}
	}
	if mpsMode {
		return runMPSManager(ctx, cfg, p, *mpsControl, getenv, log, stderr)
	}
	if !disabled {
		policy.Log = log
		p.source = healthSource(&cfg, policy, log)
	} else {
		log.Warn("health checks disabled", "by", cfg.from("gantry.health.disable"))
	}
	stopObs, err := startObservability(ctx, obs, cfg, p.sys, p, log)
	defer stopObs()
	if err != nil {
		fmt.Fprintf(stderr, "gantry-device-plugin: %v\n", err)
		return 1
	}
	owner, err := claimGPUs(ctx, cfg, p, getenv, log)
	if err != nil {
		fmt.Fprintf(stderr, "gantry-device-plugin: %v\n", err)
		return 1
	}
	defer owner.Release()
	log.Info("starting", "gpus", cfg.Gantry.GPUs, "migStrategy", cfg.Flags.MigStrategy,
		"deviceListStrategy", fmt.Sprint(cfg.Flags.Plugin.DeviceListStrategy), "deviceIDStrategy", cfg.Flags.Plugin.DeviceIDStrategy,
		"kubeletDir", cfg.Gantry.KubeletDir, "resources", len(p.servers))
	if err := p.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "gantry-device-plugin: %v\n", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// initPlugin discovers the GPUs (full NVML discovery: NUMA nodes, NVLinks,
// MIG devices) and builds the plugin.
//
// Where no runtime injected the driver into the plugin's container (NVIDIA's
// static DaemonSets name no runtimeClassName, and work only where nvidia is
// the engine's default runtime), NVML is looked for under the driver roots
// a plugin pod usually mounts (DriverRootCandidates); the one found becomes
// cfg's driver root, for health checks too.
func initPlugin(cfg *Config, log *slog.Logger) (*Plugin, error) {
	gcfg := gconfig.Default()
	gcfg.GPUs, gcfg.DriverRoot, gcfg.DevRoot = cfg.Gantry.GPUs, cfg.Flags.NvidiaDriverRoot, cfg.Flags.NvidiaDevRoot
	sys, err := discover.GPUs(gcfg, false)
	if err != nil && errors.Is(err, nvml.ErrNoNVML) && !strings.HasPrefix(cfg.Gantry.GPUs, "sim:") &&
		(cfg.Flags.NvidiaDriverRoot == "" || cfg.Flags.NvidiaDriverRoot == "/") {
		for _, root := range DriverRootCandidates {
			if _, serr := os.Stat(root); serr != nil {
				continue
			}
			g := gcfg
			g.DriverRoot = root
			if found, ferr := discover.GPUs(g, false); ferr == nil {
				log.Info("no runtime injected the NVIDIA driver into this container: using the driver under "+root, "gpus", len(found.Devices))
				cfg.Flags.NvidiaDriverRoot = root
				sys, err = found, nil
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("discovering GPUs (%s): %w; no runtime injected the driver into this container and none was found under %s: "+
				"run the plugin with runtimeClassName: nvidia (or make nvidia the engine's default runtime: gantry runtime configure --set-as-default), "+
				"or mount the host's driver root into the pod and name it with --nvidia-driver-root (NVIDIA_DRIVER_ROOT)",
				cfg.Gantry.GPUs, err, strings.Join(DriverRootCandidates, ", "))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("discovering GPUs (%s): %w", cfg.Gantry.GPUs, err)
	}
	if sys, err = onlyDevices(sys, cfg.Gantry.Devices, cfg.from("gantry.devices")); err != nil {
		return nil, err
	}
	return New(Options{Config: *cfg, System: sys, Log: log})
}

// DriverRootCandidates are where a plugin pod that no runtime gave the
// driver may have the host's driver mounted: a driver container's root
// (GPU Operator), NVIDIA's chart's /driver-root, and the host's / at /host.
var DriverRootCandidates = []string{"/run/nvidia/driver", "/driver-root", "/host"}

// healthSource is the health Source for the configured backend.
func healthSource(cfg *Config, policy health.Policy, log *slog.Logger) health.Source {
	if strings.HasPrefix(cfg.Gantry.GPUs, "sim:") {
		sock := cfg.Gantry.Health.SimSocket
		if sock == "" {
			sock = DefaultSimHealthSocket
		}
		if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
			log.Warn("cannot create the directory of the simulated health socket", "socket", sock, "err", err)
		}
		return health.NewSim(sock, policy)
	}
	return health.NewNVML(cfg.Flags.NvidiaDriverRoot, policy)
}

func printResources(w io.Writer, p *Plugin) {
	for _, r := range p.Resources() {
		shared := ""
		if r.Replicas > 0 {
			shared = fmt.Sprintf(", %d replicas each", r.Replicas)
			if r.MPS {
				shared += " through MPS"
			}
		}
		fmt.Fprintf(w, "%s (%d devices%s, socket %s)\n", r.Name, len(r.Devices), shared, r.SocketName())
		for _, d := range r.Devices {
			numa := "numa ?"
			if d.NUMANode >= 0 {
				numa = fmt.Sprintf("numa %d", d.NUMANode)
			}
			fmt.Fprintf(w, "  %-45s index %-5s %s\n", d.ID, d.Index, numa)
		}
	}
}

func writeHelp(w io.Writer) {
	fmt.Fprint(w, `gantry-device-plugin: the node's NVIDIA GPUs as Kubernetes resources

It registers each resource (nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...) with
the kubelet through kubelet.sock, serves the kubelet's device plugin API
(v1beta1) on one socket per resource (nvidia-gpu.sock, ...), re-registers by
itself when the kubelet restarts or a socket is deleted, marks GPUs unhealthy
on critical XID and double-bit ECC events (and healthy again after a quiet
period), and prefers the best-connected GPUs (NVLink/NVSwitch, PCIe switch,
NUMA) when a pod asks for several. It is a drop-in for NVIDIA's
k8s-device-plugin: the same config file, variables and resource names.

Usage: gantry-device-plugin [flags]
       gantry-device-plugin mps-control-daemon [flags]

The mps-control-daemon mode reads the same settings and runs an MPS control
daemon (nvidia-cuda-mps-control -d) for each resource of sharing.mps: it
sets each client's memory and thread share, restarts the daemon when it
stops answering, and quits it on SIGTERM; the plugin offers the replicas
only while their daemon is ready (<mpsRoot>/<resource>/.ready).
  --mps-control PATH  (MPS_CONTROL)
      the control program (default nvidia-cuda-mps-control in PATH)

Settings come from, lowest to highest: defaults, the config file, the
environment, flags.

  --config, --config-file FILE  (CONFIG_FILE)
      NVIDIA's config file format (version v1), YAML or JSON; see below
  CONFIG_FILE_SRCDIR DIR, DEFAULT_CONFIG NAME, NODE_LABEL, FALLBACK_STRATEGIES
      per-node configs, as NVIDIA's config-manager: DIR holds named config
      files (a ConfigMap's keys); each node runs the one its label
      (default nvidia.com/device-plugin.config) names, else DEFAULT_CONFIG
      (else the fallbacks: named = "default", single = the only one, empty
      = no file; default named,single), and restarts with the new one when
      the label changes; needs NODE_NAME and RBAC to get the Node
  --log-level LEVEL
      debug, info, warn, error (default info)
  --dry-run
      discover, print the resources and their devices, and exit
`)
	for _, s := range settings {
		names := "--" + strings.Join(s.flags, ", --")
		if !s.isBool {
			names += " VALUE"
		}
		fmt.Fprintf(w, "  %s  (%s)\n      %s\n", names, strings.Join(s.env, ", "), s.usage)
	}
	fmt.Fprint(w, `
Labels, metrics and events (environment; the DaemonSet in deployments/ sets them):
  GANTRY_LABELS off|node|file   GPU Feature Discovery's nvidia.com/* labels: patched onto
                                this Node (needs NODE_NAME and RBAC), or written as a
                                node-feature-discovery feature file (default off)
  GANTRY_FEATURE_FILE FILE      default /etc/kubernetes/node-feature-discovery/features.d/gantry
  GANTRY_METRICS_ADDR HOST:PORT Prometheus /metrics (utilisation, memory, temperature, power,
                                health, XIDs; pod/namespace/container per GPU); default off
  GANTRY_POD_RESOURCES_SOCKET   default /var/lib/kubelet/pod-resources/kubelet.sock
  NODE_NAME                     with GANTRY_LABELS=node, health changes are also posted as
                                Events on the Node (kubectl describe node)
  KUBECONFIG FILE[:FILE...]     reach the API server through this kubeconfig (token or client
                                certificate) instead of the pod's service account

Config file (keys as NVIDIA's version v1; gantry: holds Gantry's own):

  version: v1
  flags:
    migStrategy: mixed               # none | single | mixed
    failOnInitError: true
    plugin:
      deviceListStrategy: [volume-mounts]   # envvar | volume-mounts | cdi-annotations | cdi-cri
      deviceIDStrategy: uuid         # uuid | index
      passDeviceSpecs: false
  sharing:
    # mps: {resources: [{name: nvidia.com/gpu, replicas: 4}]} shares through an MPS
    # daemon instead (same keys; failRequestsGreaterThanOne defaults to true)
    timeSlicing:
      renameByDefault: false         # true: shared resources are named <name>.shared
      failRequestsGreaterThanOne: false
      resources:
      - name: nvidia.com/gpu
        replicas: 4                  # each GPU offered 4 times (IDs GPU-...::0..3)
        # rename: gpu.shared         # devices: all | COUNT | [0, "1:0", GPU-...]
  resources:                         # optional: resource names by product / MIG profile
    gpus: [{pattern: "*H100*", name: h100}]
  gantry:
    gpus: nvml                       # or sim:h100x8, sim:a100x2-mig, sim:FILE
    kubeletDir: /var/lib/kubelet/device-plugins
    cdiKind: nvidia.com/gpu
    health:
      recoveryQuietPeriod: 10m       # 0s: unhealthy until the plugin restarts
      disable: ""                    # as DP_DISABLE_HEALTHCHECKS
      enable: ""                     # as DP_ENABLE_HEALTHCHECKS
      simSocket: /run/gantry/sim-health.sock

Deny by default: with deviceListStrategy volume-mounts the device list travels
as mounts under /var/run/nvidia-container-devices, which only the device plugin
can add. Configure gantry-runtime with runtime.accept-env-unprivileged = false
and runtime.accept-volume-mounts = true (/etc/gantry/config.toml): then an
image's NVIDIA_VISIBLE_DEVICES=all gives an unprivileged container no GPU
unless the pod requested one.

Simulated GPUs: with --gpus sim:PROFILE, inject faults into the health
checks through the simulated health socket, one command a line:
  xid GPU-UUID 79 | ecc GPU-UUID dbe | reset GPU-UUID
`)
}
