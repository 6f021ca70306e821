package labels

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// Prefix is the namespace of every label this package writes.
const Prefix = "nvidia.com/"

// Set maps label keys to values.
type Set map[string]string

// Keys returns the keys in sorted order.
func (s Set) Keys() []string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// MIGStrategy says how GPUs in MIG mode are advertised as Kubernetes
// resources (and so labelled); the device plugin uses this type too.
type MIGStrategy string

// The MIG strategies of NVIDIA's device plugin.
const (
	// MIGNone advertises every GPU whole as nvidia.com/gpu, MIG mode or not.
	MIGNone MIGStrategy = "none"
	// MIGSingle advertises the MIG devices as nvidia.com/gpu; every GPU must
	// be in MIG mode with MIG devices of one profile (or none in MIG mode).
	MIGSingle MIGStrategy = "single"
	// MIGMixed advertises each MIG profile as nvidia.com/mig-<profile> and the
	// GPUs not in MIG mode as nvidia.com/gpu.
	MIGMixed MIGStrategy = "mixed"
)

// SharingStrategy says how one GPU is shared between containers.
type SharingStrategy string

// The sharing strategies of NVIDIA's device plugin.
const (
	SharingNone        SharingStrategy = "none"
	SharingTimeSlicing SharingStrategy = "time-slicing"
	SharingMPS         SharingStrategy = "mps"
)

// ErrInvalidConfig is wrapped by the errors of Config.Validate.
var ErrInvalidConfig = errors.New("invalid label configuration")

// Config is the part of the device plugin's configuration that shows in
// the labels.
type Config struct {
	// MIGStrategy is none (the default when empty), single or mixed.
	MIGStrategy MIGStrategy
	// SharingStrategy is none (the default when empty), time-slicing or mps.
	SharingStrategy SharingStrategy
	// Replicas is the number of replicas each shared device is advertised
	// as; 0 or 1 means no sharing.
	Replicas int
	// SharedResources names the resources Replicas applies to
	// ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb"); empty means all of them.
	SharedResources []string
	// Renamed says shared resources are advertised under a new name, in
	// which case their product label does not get the "-SHARED" suffix.
	Renamed bool
	// Machine is the machine type (MachineType reads it from DMI); empty
	// gives "unknown", as GFD does when it cannot read it.
	Machine string
	// Timestamp, when set, adds nvidia.com/gfd.timestamp (Unix seconds).
	// Leave it zero for Node labels: it would change the Node every time.
	Timestamp time.Time
}

// Validate checks the strategies and the replica count, filling in the
// defaults. Its errors name the setting and the allowed values.
func (c *Config) Validate() error {
	switch c.MIGStrategy {
	case "":
		c.MIGStrategy = MIGNone
	case MIGNone, MIGSingle, MIGMixed:
	default:
		return fmt.Errorf("%w: migStrategy %q: use none, single or mixed", ErrInvalidConfig, c.MIGStrategy)
	}
	switch c.SharingStrategy {
	case "":
		c.SharingStrategy = SharingNone
	case SharingNone, SharingTimeSlicing, SharingMPS:
	default:
		return fmt.Errorf("%w: sharing strategy %q: use none, time-slicing or mps", ErrInvalidConfig, c.SharingStrategy)
	}
	if c.Replicas < 0 {
		return fmt.Errorf("%w: replicas %d: use a number of at least 1", ErrInvalidConfig, c.Replicas)
	}
	if c.Replicas > 1 && c.SharingStrategy == SharingNone {
		return fmt.Errorf("%w: replicas %d with sharing strategy none: choose time-slicing or mps, or 1 replica", ErrInvalidConfig, c.Replicas)
	}
	return nil
}

// sharingOf returns what the config says about one resource: its replica
// count and the strategy label. GFD reports 1 replica and strategy "none"
// for a resource that is not replicated.
func (c *Config) sharingOf(resource string) (replicas int, strategy SharingStrategy) {
	replicas = 1
	if c.SharingStrategy != SharingNone && c.Replicas > 0 &&
		(len(c.SharedResources) == 0 || slices.Contains(c.SharedResources, resource)) {
		replicas = c.Replicas
	}
	if replicas > 1 {
		return replicas, c.SharingStrategy
	}
	return replicas, SharingNone
}

// Generate computes the labels for sys under cfg. A system without GPUs gets
// no GPU labels at all. hw may be nil, meaning Catalog{}.
func Generate(sys *gpu.System, cfg Config, hw Hardware) (Set, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if hw == nil {
		hw = Catalog{}
	}
	out := Set{Prefix + "vgpu.present": "false"}
	if !cfg.Timestamp.IsZero() {
		out[Prefix+"gfd.timestamp"] = strconv.FormatInt(cfg.Timestamp.Unix(), 10)
	}
	if sys == nil || len(sys.Devices) == 0 {
		return out, nil
	}
	out[Prefix+"gpu.present"] = "true"
	machine := cfg.Machine
	if machine == "" {
		machine = "unknown"
	}
	out[Prefix+"gpu.machine"] = sanitise(machine)

	if err := versionLabels(out, sys); err != nil {
		return nil, err
	}

	capable := false
	for _, d := range sys.Devices {
		c, err := hw.MIGCapable(d)
		if err != nil {
			return nil, fmt.Errorf("GPU %d (%s): MIG capability: %w", d.Index, d.UUID, err)
		}
		capable = capable || c
	}
	out[Prefix+"mig.capable"] = strconv.FormatBool(capable)

	_, strategy := cfg.sharingOf("nvidia.com/gpu")
	if strategy == SharingMPS {
		for _, d := range sys.Devices {
			if d.MIGEnabled {
				return nil, fmt.Errorf("sharing strategy mps: GPU %d (%s) has MIG enabled, and MPS cannot share MIG devices; disable MIG or use time-slicing", d.Index, d.UUID)
			}
		}
		out[Prefix+"mps.capable"] = "true"
	} else {
		out[Prefix+"mps.capable"] = "false"
	}

	fullGPULabels(out, sys, &cfg)

	switch cfg.MIGStrategy {
	case MIGSingle:
		out[Prefix+"mig.strategy"] = string(MIGSingle)
		if err := singleLabels(out, sys, &cfg, hw); err != nil {
			return nil, err
		}
	case MIGMixed:
		out[Prefix+"mig.strategy"] = string(MIGMixed)
		if err := mixedLabels(out, sys, &cfg, hw); err != nil {
			return nil, err
		}
	}

	out[Prefix+"gpu.mode"] = gpuMode(sys, hw)
	return out, nil
}

// versionLabels writes the driver and CUDA versions under both GFD's
// deprecated names and their successors.
func versionLabels(out Set, sys *gpu.System) error {
	parts := strings.Split(sys.DriverVersion, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return fmt.Errorf("driver version %q is not of the form X.Y[.Z]", sys.DriverVersion)
	}
	rev := ""
	if len(parts) == 3 {
		rev = parts[2]
	}
	cmaj, cmin, err := gpu.ParseComputeCapability(sys.CUDADriverVersion) // same "major.minor" form
	if err != nil {
		return fmt.Errorf("CUDA driver version %q is not of the form major.minor", sys.CUDADriverVersion)
	}
	major, minor := strconv.Itoa(cmaj), strconv.Itoa(cmin)
	for k, v := range map[string]string{
		"cuda.driver.major":            parts[0],
		"cuda.driver.minor":            parts[1],
		"cuda.driver.rev":              rev,
		"cuda.runtime.major":           major,
		"cuda.runtime.minor":           minor,
		"cuda.driver-version.major":    parts[0],
		"cuda.driver-version.minor":    parts[1],
		"cuda.driver-version.revision": rev,
		"cuda.driver-version.full":     sys.DriverVersion,
		"cuda.runtime-version.major":   major,
		"cuda.runtime-version.minor":   minor,
		"cuda.runtime-version.full":    major + "." + minor,
	} {
		out[Prefix+k] = v
	}
	return nil
}

// fullGPULabels writes the nvidia.com/gpu.* labels of whole GPUs. As in
// GFD, MIG-enabled GPUs are counted without sharing (0 replicas) and GPUs
// without MIG override them; where models differ GFD's choice is arbitrary
// (map order), ours is the lowest-indexed GPU of the last group applied.
func fullGPULabels(out Set, sys *gpu.System, cfg *Config) {
	counts := map[string]int{}
	var migModels, fullModels []gpu.Device
	seen := map[string]bool{}
	for _, d := range sys.Devices {
		counts[d.Name]++
		if seen[d.Name+strconv.FormatBool(d.MIGEnabled)] {
			continue
		}
		seen[d.Name+strconv.FormatBool(d.MIGEnabled)] = true
		if d.MIGEnabled {
			migModels = append(migModels, d)
		} else {
			fullModels = append(fullModels, d)
		}
	}
	for _, d := range slices.Backward(migModels) {
		gpuResourceLabels(out, d, counts[d.Name], nil)
	}
	for _, d := range slices.Backward(fullModels) {
		gpuResourceLabels(out, d, counts[d.Name], cfg)
	}
}

// gpuResourceLabels labels nvidia.com/gpu as count GPUs like d; a nil cfg
// means sharing does not apply (0 replicas).
func gpuResourceLabels(out Set, d gpu.Device, count int, cfg *Config) {
	const res = "nvidia.com/gpu"
	baseLabels(out, res, count, cfg, d.Name)
	if d.MemoryMiB != 0 {
		out[res+".memory"] = strconv.FormatUint(d.MemoryMiB, 10)
	}
	major, minor, err := gpu.ParseComputeCapability(d.ComputeCapability)
	if err != nil || major == 0 {
		return
	}
	out[res+".family"] = Family(major, minor)
	out[res+".compute.major"] = strconv.Itoa(major)
	out[res+".compute.minor"] = strconv.Itoa(minor)
}

// baseLabels writes <res>.product, .count, .replicas and .sharing-strategy.
func baseLabels(out Set, res string, count int, cfg *Config, nameParts ...string) {
	replicas, strategy := 0, SharingNone
	if cfg != nil {
		replicas, strategy = cfg.sharingOf(res)
	}
	var parts []string
	for _, p := range nameParts {
		if s := sanitise(p); s != "" {
			parts = append(parts, s)
		}
	}
	if len(parts) > 0 && replicas > 1 && !cfg.Renamed {
		parts = append(parts, "SHARED")
	}
	out[res+".product"] = strings.Join(parts, "-")
	out[res+".count"] = strconv.Itoa(count)
	out[res+".replicas"] = strconv.Itoa(replicas)
	out[res+".sharing-strategy"] = string(strategy)
}

// migGroup is the MIG devices of one profile: the first one stands for all.
type migGroup struct {
	profile string
	parent  gpu.Device
	first   gpu.MIGDevice
	count   int
}

// migGroups groups the MIG devices of MIG-enabled GPUs by profile, in
// enumeration order.
func migGroups(sys *gpu.System) []*migGroup {
	var groups []*migGroup
	byProfile := map[string]*migGroup{}
	for _, d := range sys.Devices {
		if !d.MIGEnabled {
			continue
		}
		for _, m := range d.MIGDevices {
			name := migProfileName(m.Profile)
			g := byProfile[name]
			if g == nil {
				g = &migGroup{profile: name, parent: d, first: m}
				byProfile[name] = g
				groups = append(groups, g)
			}
			g.count++
		}
	}
	return groups
}

// migProfileName is the profile as it appears in resource and label names:
// NVIDIA writes "1g.10gb+me" as "1g.10gb.me".
func migProfileName(profile string) string {
	return strings.ReplaceAll(strings.TrimPrefix(profile, "MIG "), "+", ".")
}

// singleLabels overrides nvidia.com/gpu.* with the MIG devices when every
// GPU has MIG enabled and is split into devices of one profile, and marks
// the product MIG-INVALID when that is not so.
func singleLabels(out Set, sys *gpu.System, cfg *Config, hw Hardware) error {
	var enabled []gpu.Device
	anyDisabled, anyEmpty := false, false
	for _, d := range sys.Devices {
		if !d.MIGEnabled {
			anyDisabled = true
			continue
		}
		enabled = append(enabled, d)
		anyEmpty = anyEmpty || len(d.MIGDevices) == 0
	}
	if len(enabled) == 0 {
		return nil // the same as strategy none
	}
	groups := migGroups(sys)
	if anyEmpty || anyDisabled || len(groups) != 1 {
		const res = "nvidia.com/gpu"
		out[res+".product"] = strings.Join([]string{sanitise(enabled[0].Name), "MIG", "INVALID"}, "-")
		out[res+".count"] = "0"
		out[res+".replicas"] = "0"
		out[res+".sharing-strategy"] = ""
		out[res+".memory"] = "0"
		return nil
	}
	return migResourceLabels(out, "nvidia.com/gpu", groups[0], cfg, hw)
}

// mixedLabels writes nvidia.com/mig-<profile>.* for each MIG profile present.
func mixedLabels(out Set, sys *gpu.System, cfg *Config, hw Hardware) error {
	for _, g := range migGroups(sys) {
		if err := migResourceLabels(out, "nvidia.com/mig-"+g.profile, g, cfg, hw); err != nil {
			return err
		}
	}
	return nil
}

func migResourceLabels(out Set, res string, g *migGroup, cfg *Config, hw Hardware) error {
	attrs, err := hw.MIGAttributes(g.parent, g.first)
	if err != nil {
		return fmt.Errorf("MIG device %s (%s) on GPU %d: %w", g.first.Name(), g.first.Profile, g.parent.Index, err)
	}
	baseLabels(out, res, g.count, cfg, g.parent.Name, "MIG", g.profile)
	for suffix, v := range map[string]int{
		"multiprocessors": attrs.Multiprocessors,
		"slices.gi":       attrs.GISlices,
		"slices.ci":       attrs.CISlices,
		"engines.copy":    attrs.CopyEngines,
		"engines.decoder": attrs.Decoders,
		"engines.encoder": attrs.Encoders,
		"engines.jpeg":    attrs.JPEGs,
		"engines.ofa":     attrs.OFAs,
	} {
		if v >= 0 {
			out[res+"."+suffix] = strconv.Itoa(v)
		}
	}
	out[res+".memory"] = strconv.FormatUint(attrs.MemoryMB, 10)
	return nil
}

// gpuMode is "compute" or "graphics" when every GPU has the same PCI class
// (3D controller or VGA controller), else "unknown", as in GFD.
func gpuMode(sys *gpu.System, hw Hardware) string {
	var class uint32
	for i, d := range sys.Devices {
		c, err := hw.PCIClass(d)
		if err != nil || (i > 0 && c != class) {
			return "unknown"
		}
		class = c
	}
	switch class >> 8 {
	case 0x0302:
		return "compute"
	case 0x0300:
		return "graphics"
	}
	return "unknown"
}

// Family is GFD's architecture family for a compute capability.
func Family(major, minor int) string {
	switch major {
	case 1:
		return "tesla"
	case 2:
		return "fermi"
	case 3:
		return "kepler"
	case 5:
		return "maxwell"
	case 6:
		return "pascal"
	case 7:
		if minor < 5 {
			return "volta"
		}
		return "turing"
	case 8:
		if minor < 9 {
			return "ampere"
		}
		return "ada-lovelace"
	case 9:
		return "hopper"
	case 10, 12:
		return "blackwell"
	case 13:
		return "rubin"
	}
	return "undefined"
}

var unlabelable = regexp.MustCompile(`[^A-Za-z0-9_. -]`)

// sanitise makes a label value of a free-form name the way GFD does: drop
// characters other than letters, digits, '-', '_', '.' and space, then join
// the space-separated words with '-'.
func sanitise(s string) string {
	return strings.Join(strings.Fields(unlabelable.ReplaceAllString(s, "")), "-")
}
