package deviceplugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	gconfig "github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/labels"
	"github.com/gantry-gpu/gantry/internal/mps"
)

// ErrConfig is matched (errors.Is) by every error about a bad configuration
// value, whichever source (file, environment, flag) it came from.
var ErrConfig = errors.New("invalid device plugin configuration")

// MIGStrategy says how GPUs in MIG mode become Kubernetes resources. It is
// the labeller's type (the nvidia.com/mig.strategy label says which one is
// in use), so the plugin and its labels cannot disagree on the values.
type MIGStrategy = labels.MIGStrategy

// The MIG strategies of NVIDIA's device plugin (see labels.MIGNone).
const (
	MIGNone   = labels.MIGNone
	MIGSingle = labels.MIGSingle
	MIGMixed  = labels.MIGMixed
)

var migStrategies = []MIGStrategy{MIGNone, MIGSingle, MIGMixed}

// DeviceListStrategy is one way Allocate tells the container runtime which
// devices a container gets.
type DeviceListStrategy string

// The device list strategies of NVIDIA's device plugin.
const (
	// ListEnvVar sets NVIDIA_VISIBLE_DEVICES to the device IDs.
	ListEnvVar DeviceListStrategy = "envvar"
	// ListVolumeMounts mounts /dev/null at /var/run/nvidia-container-devices/<id>
	// for each device and points NVIDIA_VISIBLE_DEVICES at that directory.
	ListVolumeMounts DeviceListStrategy = "volume-mounts"
	// ListCDIAnnotations adds a cdi.k8s.io/ annotation with CDI device names.
	ListCDIAnnotations DeviceListStrategy = "cdi-annotations"
	// ListCDICRI fills the CDIDevices field of the response (the CRI's own
	// CDI support, Kubernetes 1.28+ with containerd 1.7+ or CRI-O 1.23+).
	ListCDICRI DeviceListStrategy = "cdi-cri"
)

var listStrategies = []DeviceListStrategy{ListEnvVar, ListVolumeMounts, ListCDIAnnotations, ListCDICRI}

func (s DeviceListStrategy) isCDI() bool { return strings.HasPrefix(string(s), "cdi-") }

// DeviceIDStrategy says how a device is named to the container runtime.
type DeviceIDStrategy string

// The device ID strategies of NVIDIA's device plugin.
const (
	// IDUUID names devices by UUID: GPU-... or MIG-....
	IDUUID DeviceIDStrategy = "uuid"
	// IDIndex names devices by index: "0", or "0:1" for MIG device 1 of GPU 0.
	IDIndex DeviceIDStrategy = "index"
)

var idStrategies = []DeviceIDStrategy{IDUUID, IDIndex}

// AllocationPolicy orders the replicas of shared GPUs in GetPreferredAllocation.
type AllocationPolicy string

// The allocation policies of NVIDIA's device plugin.
const (
	// PolicyDistributed spreads replicas over distinct, least-used GPUs.
	PolicyDistributed AllocationPolicy = "distributed"
	// PolicyPacked fills the most-used GPUs first.
	PolicyPacked AllocationPolicy = "packed"
)

var allocationPolicies = []AllocationPolicy{PolicyDistributed, PolicyPacked}

// Defaults of the settings that have one.
const (
	// DefaultKubeletDir is where the kubelet's registration socket and the
	// device plugins' sockets live.
	DefaultKubeletDir = "/var/lib/kubelet/device-plugins"
	// KubeletSocketName is the kubelet's registration socket in that directory.
	KubeletSocketName = "kubelet.sock"
	// DefaultCDIAnnotationPrefix is the key prefix of CDI annotations.
	DefaultCDIAnnotationPrefix = "cdi.k8s.io/"
	// ResourcePrefix is the domain of every resource this plugin advertises.
	ResourcePrefix = "nvidia.com/"
	// SharedSuffix is appended to a shared resource's name when renaming by default.
	SharedSuffix = ".shared"
	// MaxReplicas bounds sharing.timeSlicing.resources[].replicas: the
	// kubelet holds every replica as a device, and a node runs a few hundred
	// pods at most.
	MaxReplicas = 1024
	// maxResourceNameLength bounds a fully qualified resource name, as NVIDIA does.
	maxResourceNameLength = 63
)

// Config is the device plugin's configuration: NVIDIA's device plugin config
// file (version v1) plus a "gantry" section for what only Gantry has. The
// json tags are the file's keys (YAML files use the same keys).
type Config struct {
	Version   string    `json:"version"`
	Flags     Flags     `json:"flags"`
	Resources Resources `json:"resources"`
	Sharing   Sharing   `json:"sharing"`
	// Imex names the IMEX channels given to every container that gets a
	// device (imex.go).
	Imex *Imex `json:"imex,omitempty"`
	// Gantry holds Gantry's own settings. NVIDIA's plugin ignores unknown
	// top-level keys, so one file can serve both.
	Gantry Gantry `json:"gantry"`

	// origin names where each set key came from (file path, env var, flag),
	// for error messages; keys are the file keys ("flags.migStrategy").
	origin map[string]string
	// warnings are what loading ignored (unknown keys, IMEX channels that
	// are not required): logged and posted as Events on the Node.
	warnings []string
}

// Warnings are what loading and validating the configuration ignored.
func (c *Config) Warnings() []string { return c.warnings }

// Flags are NVIDIA's "flags" section: the settings that also have a
// command-line flag and an environment variable.
type Flags struct {
	MigStrategy     MIGStrategy `json:"migStrategy"`
	FailOnInitError bool        `json:"failOnInitError"`
	// NvidiaDriverRoot is where the driver is installed on the host; empty
	// means the driver-root of Gantry's config file (default /).
	NvidiaDriverRoot string `json:"nvidiaDriverRoot"`
	// NvidiaDevRoot is where the device nodes are on the host; empty means
	// NvidiaDriverRoot.
	NvidiaDevRoot string `json:"nvidiaDevRoot"`
	// MpsRoot is the host directory of the MPS control daemons' pipe and
	// log directories and their /dev/shm (sharing.mps); empty means
	// DefaultMPSRoot.
	MpsRoot        string `json:"mpsRoot,omitempty"`
	GDRCopyEnabled bool   `json:"gdrcopyEnabled"`
	GDSEnabled     bool   `json:"gdsEnabled"`
	MOFEDEnabled   bool   `json:"mofedEnabled"`
	// UseNodeFeatureAPI is a GPU Feature Discovery setting, read and ignored here.
	UseNodeFeatureAPI *bool `json:"useNodeFeatureAPI,omitempty"`
	// DeviceDiscoveryStrategy is auto or nvml (tegra is not supported).
	DeviceDiscoveryStrategy string      `json:"deviceDiscoveryStrategy"`
	Plugin                  PluginFlags `json:"plugin"`
	GFD                     *GFDFlags   `json:"gfd,omitempty"`
}

// PluginFlags are NVIDIA's "flags.plugin" section.
type PluginFlags struct {
	PassDeviceSpecs     bool             `json:"passDeviceSpecs"`
	DeviceListStrategy  StrategyList     `json:"deviceListStrategy"`
	DeviceIDStrategy    DeviceIDStrategy `json:"deviceIDStrategy"`
	CDIAnnotationPrefix string           `json:"cdiAnnotationPrefix"`
	NvidiaCTKPath       string           `json:"nvidiaCTKPath,omitempty"`
	ContainerDriverRoot string           `json:"containerDriverRoot,omitempty"`
	AllocationPolicy    AllocationPolicy `json:"sharedDevicesAllocationPolicy"`
}

// GFDFlags are GPU Feature Discovery's settings; they share NVIDIA's file.
type GFDFlags struct {
	Oneshot         *bool   `json:"oneshot,omitempty"`
	NoTimestamp     *bool   `json:"noTimestamp,omitempty"`
	SleepInterval   *string `json:"sleepInterval,omitempty"`
	OutputFile      *string `json:"outputFile,omitempty"`
	MachineTypeFile *string `json:"machineTypeFile,omitempty"`
}

// Imex is NVIDIA's "imex" section: the IMEX channels
// (/dev/nvidia-caps-imex-channels/channelN) every container that gets a
// device of this plugin also gets.
type Imex struct {
	ChannelIDs []int `json:"channelIDs,omitempty"`
	// Required makes a missing channel an error at start (the plugin
	// exits, as NVIDIA's does); otherwise a missing channel is skipped
	// with a warning and the GPUs are served without it.
	Required bool `json:"required,omitempty"`
}

// StrategyList is flags.plugin.deviceListStrategy: one strategy or a list.
type StrategyList []DeviceListStrategy

// UnmarshalJSON takes a string or a list of strings.
func (l *StrategyList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = StrategyList{DeviceListStrategy(one)}
		return nil
	}
	var many []DeviceListStrategy
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("deviceListStrategy: want a strategy or a list of them, got %s", b)
	}
	*l = many
	return nil
}

// Has reports whether s is in the list.
func (l StrategyList) Has(s DeviceListStrategy) bool { return slices.Contains(l, s) }

// allCDI reports whether every strategy of the list is a CDI one.
func (l StrategyList) allCDI() bool {
	for _, s := range l {
		if !s.isCDI() {
			return false
		}
	}
	return true
}

func (l StrategyList) anyCDI() bool { return slices.ContainsFunc(l, DeviceListStrategy.isCDI) }

// Resources are NVIDIA's "resources" section: which resource name a GPU
// (matched by product name) or a MIG device (matched by profile) gets.
// NVIDIA's current plugin reads this section but ignores it; Gantry honours it.
type Resources struct {
	GPUs []ResourcePattern `json:"gpus,omitempty"`
	MIGs []ResourcePattern `json:"mig,omitempty"`
}

// ResourcePattern maps a wildcard pattern ("*" matches any run of
// characters) to a resource name ("gpu" or "nvidia.com/gpu").
type ResourcePattern struct {
	Pattern string `json:"pattern"`
	Name    string `json:"name"`
}

// Sharing is NVIDIA's "sharing" section.
type Sharing struct {
	TimeSlicing *ReplicatedResources `json:"timeSlicing,omitempty"`
	// MPS shares GPUs through an MPS control daemon per resource (run by
	// gantry-device-plugin mps-control-daemon), each replica with a fixed
	// share of memory and compute threads (mps.go).
	MPS *ReplicatedResources `json:"mps,omitempty"`
}

// ReplicatedResources is the list of resources a sharing mode replicates.
type ReplicatedResources struct {
	// RenameByDefault names every shared resource <name>.shared unless it
	// has a rename of its own.
	RenameByDefault bool `json:"renameByDefault,omitempty"`
	// FailRequestsGreaterThanOne refuses a container asking for more than
	// one replica (a replica is not a bigger share of a GPU).
	FailRequestsGreaterThanOne *bool                `json:"failRequestsGreaterThanOne,omitempty"`
	Resources                  []ReplicatedResource `json:"resources,omitempty"`
}

// ReplicatedResource says how many replicas each device of one resource becomes.
type ReplicatedResource struct {
	Name     string            `json:"name"`
	Rename   string            `json:"rename,omitempty"`
	Devices  ReplicatedDevices `json:"devices"`
	Replicas int               `json:"replicas"`
}

// ReplicatedDevices is "all" (the default), a count of devices (the first
// ones by index), or a list of GPU indices, MIG "GPU:MIG" indices and UUIDs.
type ReplicatedDevices struct {
	All   bool
	Count int
	List  []string
}

var (
	gpuIndexRE = regexp.MustCompile(`^[0-9]+$`)
	migIndexRE = regexp.MustCompile(`^[0-9]+:[0-9]+$`)
	uuidRE     = regexp.MustCompile(`^(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
)

// UnmarshalJSON takes "all", a positive count, or a list of device references.
func (d *ReplicatedDevices) UnmarshalJSON(b []byte) error {
	*d = ReplicatedDevices{}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		if s != "all" {
			return fmt.Errorf("devices: %q: want \"all\", a count, or a list of indices and UUIDs", s)
		}
		d.All = true
		return nil
	}
	var n int
	if err := json.Unmarshal(b, &n); err == nil {
		if n < 1 {
			return fmt.Errorf("devices: count %d: want 1 or more", n)
		}
		d.Count = n
		return nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(b, &items); err != nil {
		return fmt.Errorf("devices: %s: want \"all\", a count, or a list of indices and UUIDs", b)
	}
	for _, it := range items {
		var idx uint64
		if err := json.Unmarshal(it, &idx); err == nil {
			d.List = append(d.List, strconv.FormatUint(idx, 10))
			continue
		}
		var ref string
		if err := json.Unmarshal(it, &ref); err != nil ||
			!(gpuIndexRE.MatchString(ref) || migIndexRE.MatchString(ref) || uuidRE.MatchString(ref)) {
			return fmt.Errorf("devices: %s is not a GPU index (0), MIG index (0:1) or UUID (GPU-..., MIG-...)", it)
		}
		d.List = append(d.List, ref)
	}
	if len(d.List) == 0 {
		return fmt.Errorf("devices: empty list: leave the key out to share all devices")
	}
	return nil
}

// MarshalJSON writes the form UnmarshalJSON reads.
func (d ReplicatedDevices) MarshalJSON() ([]byte, error) {
	switch {
	case d.Count > 0:
		return json.Marshal(d.Count)
	case len(d.List) > 0:
		return json.Marshal(d.List)
	}
	return json.Marshal("all")
}

// Gantry is the "gantry" section: settings NVIDIA's plugin does not have.
type Gantry struct {
	// GPUs is the GPU backend: nvml, sim:PROFILE or sim:FILE. Empty means the
	// gpus key of Gantry's own config file (/etc/gantry/config.toml), else nvml.
	GPUs string `json:"gpus,omitempty"`
	// KubeletDir holds kubelet.sock and the plugin sockets.
	KubeletDir string `json:"kubeletDir,omitempty"`
	// CDIKind is the vendor/class of the CDI device names Allocate returns
	// with the cdi-* strategies; the spec must exist on the host (gantry cdi
	// generate writes it with the same kind). Empty means the cdi.kind of
	// Gantry's config file (default nvidia.com/gpu).
	CDIKind string `json:"cdiKind,omitempty"`
	// CDISpecDir is where the plugin writes its own CDI spec (cdiown.go)
	// when a cdi-* strategy is on and CDIKind is not set; empty means
	// /var/run/cdi.
	CDISpecDir string `json:"cdiSpecDir,omitempty"`
	// CDIHookPath is the host path of gantry-cdi-hook that the hooks of
	// that spec run; empty means Gantry's cdi.hook-path, else
	// /usr/bin/gantry-cdi-hook.
	CDIHookPath string `json:"cdiHookPath,omitempty"`
	// HostRoot is where the host's / is mounted in the plugin's container
	// ("/" or empty: the plugin sees the host's paths as they are); the
	// driver and device roots are looked for under it for that spec.
	HostRoot string `json:"hostRoot,omitempty"`
	Health   Health `json:"health"`
	// MPSShmSize is the size of each MPS daemon's shm, its clients'
	// /dev/shm (sharing.mps): bytes, or Ki, Mi, Gi ("1Gi"); empty means
	// mps.DefaultShmSize (1Gi).
	MPSShmSize string `json:"mpsShmSize,omitempty"`
	// Devices narrows the GPUs offered to these (indices, UUIDs, bus IDs;
	// owner.go), so that a DRA plugin can have the others; empty is all.
	Devices string `json:"devices,omitempty"`
	// OwnersDir is the node's GPU owners directory (package gpuowner);
	// empty means gantry-gpu-owners beside KubeletDir's parent's other
	// directories (/var/lib/kubelet/gantry-gpu-owners).
	OwnersDir string `json:"ownersDir,omitempty"`
}

// Health holds the health-check settings.
type Health struct {
	// RecoveryQuietPeriod returns a GPU to healthy when no critical event
	// came for this long ("10m"); "0s" keeps it unhealthy until it is reset.
	// Empty means the health package's default.
	RecoveryQuietPeriod string `json:"recoveryQuietPeriod,omitempty"`
	// Disable has the syntax of NVIDIA's DP_DISABLE_HEALTHCHECKS: "all",
	// "xids", or a comma list of XIDs to ignore besides the default ones.
	Disable string `json:"disable,omitempty"`
	// Enable has the syntax of DP_ENABLE_HEALTHCHECKS: XIDs to treat as
	// critical even if a default or Disable ignores them.
	Enable string `json:"enable,omitempty"`
	// SimSocket is the unix socket on which the simulated health source
	// (gpus sim:...) accepts injected faults; empty means
	// /run/gantry/sim-health.sock.
	SimSocket string `json:"simSocket,omitempty"`
}

// DefaultConfig is the configuration with no file, no environment and no flags.
func DefaultConfig() Config {
	return Config{
		Version: "v1",
		Flags: Flags{
			MigStrategy:             MIGNone,
			FailOnInitError:         true,
			DeviceDiscoveryStrategy: "auto",
			Plugin: PluginFlags{
				DeviceListStrategy:  StrategyList{ListEnvVar},
				DeviceIDStrategy:    IDUUID,
				CDIAnnotationPrefix: DefaultCDIAnnotationPrefix,
				AllocationPolicy:    PolicyDistributed,
			},
		},
		Gantry: Gantry{KubeletDir: DefaultKubeletDir},
	}
}

// ParseConfig reads a configuration file's content (YAML or JSON) over the
// defaults. Unknown keys are an error naming them; NVIDIA's keys that Gantry
// reads but does not act on load. source names the file in errors.
func ParseConfig(data []byte, source string) (Config, error) {
	c := DefaultConfig()
	if len(bytes.TrimSpace(data)) == 0 {
		return c, fmt.Errorf("%w: %s: empty file: write at least \"version: v1\"", ErrConfig, source)
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		// Keys Gantry does not know are ignored with a warning, as NVIDIA's
		// plugin ignores them: a file written for another release must not
		// take the node's GPUs away. Anything else wrong is an error.
		unknown, kerr := unknownKeys(data)
		c = DefaultConfig()
		if kerr != nil || len(unknown) == 0 || yaml.Unmarshal(data, &c) != nil {
			return c, fmt.Errorf("%w: %s: %v (see gantry-device-plugin --help for the keys)", ErrConfig, source, err)
		}
		c.warnings = append(c.warnings, fmt.Sprintf("%s: ignoring unknown keys %s (a typo, or a key of a newer NVIDIA release; see gantry-device-plugin --help for the keys)",
			source, strings.Join(unknown, ", ")))
	}
	if c.Version == "" {
		c.Version = "v1"
	}
	c.origin = map[string]string{"*": source}
	return c, nil
}

// LoadConfig reads the configuration file at path.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return DefaultConfig(), fmt.Errorf("%w: reading config file: %v (fix the path given by --config or CONFIG_FILE)", ErrConfig, err)
	}
	return ParseConfig(data, path)
}

// from says where key's value came from, for error messages.
func (c *Config) from(key string) string {
	if o, ok := c.origin[key]; ok {
		return o
	}
	if o, ok := c.origin["*"]; ok {
		return o
	}
	return "default"
}

// setOrigin records that key was set by src (an env var or a flag).
func (c *Config) setOrigin(key, src string) {
	if c.origin == nil {
		c.origin = map[string]string{}
	}
	c.origin[key] = src
}

func badValue(c *Config, key string, value any, allowed string) error {
	return fmt.Errorf("%w: %s (%s): %v: %s", ErrConfig, key, c.from(key), value, allowed)
}

func join[T ~string](vs []T) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
}

// Validate checks every value with a fixed set of choices or a shape, and
// normalises resource names to their nvidia.com/ form. Errors name the key,
// where the value came from, and the allowed values.
func (c *Config) Validate() error {
	if c.Version != "v1" {
		return badValue(c, "version", strconv.Quote(c.Version), "unknown version; use v1")
	}
	if !slices.Contains(migStrategies, c.Flags.MigStrategy) {
		return badValue(c, "flags.migStrategy", strconv.Quote(string(c.Flags.MigStrategy)),
			"unknown MIG strategy; allowed: "+join(migStrategies))
	}
	if len(c.Flags.Plugin.DeviceListStrategy) == 0 {
		return badValue(c, "flags.plugin.deviceListStrategy", "[]", "empty; allowed: "+join(listStrategies))
	}
	for _, s := range c.Flags.Plugin.DeviceListStrategy {
		if !slices.Contains(listStrategies, s) {
			return badValue(c, "flags.plugin.deviceListStrategy", strconv.Quote(string(s)),
				"unknown device list strategy; allowed (one or a list): "+join(listStrategies))
		}
	}
	if !slices.Contains(idStrategies, c.Flags.Plugin.DeviceIDStrategy) {
		return badValue(c, "flags.plugin.deviceIDStrategy", strconv.Quote(string(c.Flags.Plugin.DeviceIDStrategy)),
			"unknown device ID strategy; allowed: "+join(idStrategies))
	}
	if !slices.Contains(allocationPolicies, c.Flags.Plugin.AllocationPolicy) {
		return badValue(c, "flags.plugin.sharedDevicesAllocationPolicy", strconv.Quote(string(c.Flags.Plugin.AllocationPolicy)),
			"unknown allocation policy; allowed: "+join(allocationPolicies))
	}
	switch c.Flags.DeviceDiscoveryStrategy {
	case "auto", "nvml", "":
	default:
		return badValue(c, "flags.deviceDiscoveryStrategy", strconv.Quote(c.Flags.DeviceDiscoveryStrategy),
			"unsupported; allowed: auto, nvml (Gantry has no Tegra discovery)")
	}
	if p := c.Flags.Plugin.CDIAnnotationPrefix; !strings.HasSuffix(p, "/") || strings.Count(p, "/") != 1 || len(p) < 2 {
		return badValue(c, "flags.plugin.cdiAnnotationPrefix", strconv.Quote(p), "want a key prefix ending in \"/\", e.g. cdi.k8s.io/")
	}
	for _, k := range []struct{ key, path string }{
		{"flags.nvidiaDriverRoot", c.Flags.NvidiaDriverRoot},
		{"flags.nvidiaDevRoot", c.Flags.NvidiaDevRoot},
		{"gantry.kubeletDir", c.Gantry.KubeletDir},
		{"flags.mpsRoot", c.Flags.MpsRoot},
		{"gantry.cdiSpecDir", c.Gantry.CDISpecDir},
		{"gantry.cdiHookPath", c.Gantry.CDIHookPath},
		{"gantry.hostRoot", c.Gantry.HostRoot},
	} {
		if k.path != "" && !filepath.IsAbs(k.path) {
			return badValue(c, k.key, strconv.Quote(k.path), "not an absolute path")
		}
	}
	if c.Gantry.KubeletDir == "" {
		return badValue(c, "gantry.kubeletDir", `""`, "empty; use "+DefaultKubeletDir)
	}
	if c.Gantry.GPUs != "" {
		if err := gconfig.ValidateGPUs(c.Gantry.GPUs); err != nil {
			return badValue(c, "gantry.gpus", strconv.Quote(c.Gantry.GPUs), err.Error())
		}
	}
	if c.Gantry.CDIKind != "" && strings.Count(c.Gantry.CDIKind, "/") != 1 {
		return badValue(c, "gantry.cdiKind", strconv.Quote(c.Gantry.CDIKind), "want vendor.com/class, e.g. nvidia.com/gpu")
	}
	if v := c.Gantry.MPSShmSize; v != "" {
		if _, err := mps.ParseShmSize("gantry.mpsShmSize", v); err != nil {
			return badValue(c, "gantry.mpsShmSize", strconv.Quote(v), "want a size such as 1Gi or 512Mi, at least 1Mi")
		}
	}
	if q := c.Gantry.Health.RecoveryQuietPeriod; q != "" {
		d, err := time.ParseDuration(q)
		if err != nil || d < 0 {
			return badValue(c, "gantry.health.recoveryQuietPeriod", strconv.Quote(q), "want a duration such as 10m or 0s")
		}
	}
	if err := c.validateIMEX(); err != nil {
		return err
	}
	for i := range c.Resources.GPUs {
		if err := c.normalisePattern("resources.gpus", i, &c.Resources.GPUs[i]); err != nil {
			return err
		}
	}
	for i := range c.Resources.MIGs {
		if err := c.normalisePattern("resources.mig", i, &c.Resources.MIGs[i]); err != nil {
			return err
		}
	}
	if ts := c.Sharing.TimeSlicing; ts != nil {
		if err := c.validateReplicated("sharing.timeSlicing", ts); err != nil {
			return err
		}
	}
	if err := c.validateMPS(); err != nil {
		return err
	}
	return nil
}

// validateReplicated checks and normalises one sharing section (key is
// sharing.timeSlicing or sharing.mps): names, replicas, renames, devices.
func (c *Config) validateReplicated(section string, ts *ReplicatedResources) error {
	seen := map[string]bool{}
	for i := range ts.Resources {
		r := &ts.Resources[i]
		key := fmt.Sprintf("%s.resources[%d]", section, i)
		if r.Name == "" {
			return badValue(c, key+".name", `""`, "missing; name the resource to share, e.g. nvidia.com/gpu")
		}
		n, err := resourceName(r.Name)
		if err != nil {
			return badValue(c, key+".name", strconv.Quote(r.Name), err.Error())
		}
		r.Name = n
		if seen[n] {
			return badValue(c, key+".name", strconv.Quote(n), "listed twice; give each resource one entry")
		}
		seen[n] = true
		if r.Replicas < 2 {
			return badValue(c, key+".replicas", r.Replicas,
				"must be 2 or more (each device is offered that many times; 1 would not share, so remove the entry)")
		}
		if r.Replicas > MaxReplicas {
			return badValue(c, key+".replicas", r.Replicas,
				fmt.Sprintf("must be at most %d (a node runs far fewer pods than that)", MaxReplicas))
		}
		if r.Rename == "" && ts.RenameByDefault {
			r.Rename = n + SharedSuffix
		}
		if r.Rename != "" {
			rn, err := resourceName(r.Rename)
			if err != nil {
				return badValue(c, key+".rename", strconv.Quote(r.Rename), err.Error())
			}
			r.Rename = rn
		}
		if !r.Devices.All && r.Devices.Count == 0 && len(r.Devices.List) == 0 {
			r.Devices.All = true
		}
	}
	return nil
}

func (c *Config) normalisePattern(section string, i int, p *ResourcePattern) error {
	key := fmt.Sprintf("%s[%d]", section, i)
	if p.Pattern == "" {
		return badValue(c, key+".pattern", `""`, "missing; use a product name or MIG profile with * wildcards")
	}
	n, err := resourceName(p.Name)
	if err != nil {
		return badValue(c, key+".name", strconv.Quote(p.Name), err.Error())
	}
	p.Name = n
	return nil
}

var dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// resourceName returns n in its nvidia.com/ form, checking that the part
// after the prefix is a DNS subdomain and the whole fits in 63 characters.
func resourceName(n string) (string, error) {
	if !strings.HasPrefix(n, ResourcePrefix) {
		n = ResourcePrefix + n
	}
	if len(n) > maxResourceNameLength {
		return "", fmt.Errorf("resource name %s is longer than %d characters", n, maxResourceNameLength)
	}
	name := strings.TrimPrefix(n, ResourcePrefix)
	if name == "" {
		return "", fmt.Errorf("empty resource name; use e.g. gpu or nvidia.com/gpu")
	}
	for _, label := range strings.Split(name, ".") {
		if !dnsLabelRE.MatchString(label) {
			return "", fmt.Errorf("resource name %s: %q must be lower-case letters, digits, '-' and '.' (a DNS subdomain after %s)", n, name, ResourcePrefix)
		}
	}
	return n, nil
}

// matchPattern reports whether s matches pattern, where * matches any run
// of characters and everything else is literal.
func matchPattern(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == s
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, last) && len(s) >= len(last)
}

// DevRoot is flags.nvidiaDevRoot, or the driver root when it is empty.
func (c *Config) DevRoot() string {
	if c.Flags.NvidiaDevRoot != "" {
		return c.Flags.NvidiaDevRoot
	}
	if c.Flags.NvidiaDriverRoot != "" {
		return c.Flags.NvidiaDriverRoot
	}
	return "/"
}

// cdiKind is gantry.cdiKind or nvidia.com/gpu.
func (c *Config) cdiKind() string {
	if c.Gantry.CDIKind != "" {
		return c.Gantry.CDIKind
	}
	return "nvidia.com/gpu"
}

// KubeletSocket is the kubelet's registration socket.
func (c *Config) KubeletSocket() string {
	return filepath.Join(c.Gantry.KubeletDir, KubeletSocketName)
}

// failRequestsGreaterThanOne is the setting of the sharing section in use:
// false when unset for time-slicing, true when unset for MPS (NVIDIA's
// defaults: an MPS replica carries a fixed memory and thread share).
func (c *Config) failRequestsGreaterThanOne() bool {
	rr, _ := c.replicated()
	if rr == nil || rr.FailRequestsGreaterThanOne == nil {
		return rr != nil && rr == c.Sharing.MPS
	}
	return *rr.FailRequestsGreaterThanOne
}
