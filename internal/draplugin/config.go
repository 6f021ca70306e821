package draplugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The opaque per-claim configuration NVIDIA's DRA driver defines (its API
// group, version and kinds), which claims written for it carry.
const (
	ConfigAPIVersion    = "resource.nvidia.com/v1beta1"
	KindGpuConfig       = "GpuConfig"
	KindMigDeviceConfig = "MigDeviceConfig"
)

// Sharing strategies and time-slice intervals of that configuration.
const (
	StrategyTimeSlicing = "TimeSlicing"
	StrategyMPS         = "MPS"
	IntervalDefault     = "Default"
	IntervalShort       = "Short"
	IntervalMedium      = "Medium"
	IntervalLong        = "Long"
)

// Intervals maps each time-slice interval name to the value of
// `nvidia-smi compute-policy --set-timeslice` (NVIDIA's mapping).
var Intervals = map[string]int{IntervalDefault: 0, IntervalShort: 1, IntervalMedium: 2, IntervalLong: 3}

// deviceConfig is GpuConfig and MigDeviceConfig: only sharing.
type deviceConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Sharing    *struct {
		Strategy          string `json:"strategy"`
		TimeSlicingConfig *struct {
			Interval *string `json:"interval,omitempty"`
		} `json:"timeSlicingConfig,omitempty"`
		MPSConfig *mpsConfig `json:"mpsConfig,omitempty"`
	} `json:"sharing,omitempty"`
}

// mpsConfig is NVIDIA's MpsConfig: the MPS daemon's per-client defaults.
type mpsConfig struct {
	DefaultActiveThreadPercentage *int `json:"defaultActiveThreadPercentage,omitempty"`
	// DefaultPinnedDeviceMemoryLimit applies to every device of the
	// daemon; DefaultPerDevicePinnedMemoryLimit overrides it for devices
	// named by UUID or by index among the daemon's devices (UUID order).
	DefaultPinnedDeviceMemoryLimit    *resource.Quantity           `json:"defaultPinnedDeviceMemoryLimit,omitempty"`
	DefaultPerDevicePinnedMemoryLimit map[string]resource.Quantity `json:"defaultPerDevicePinnedMemoryLimit,omitempty"`
}

// opaqueConfig is one decoded configuration of this driver and the
// requests it names (none: all).
type opaqueConfig struct {
	where    string
	requests []string
	cfg      deviceConfig
}

// sharingPlan is what one configuration asks of the devices it applies to.
type sharingPlan struct {
	where    string
	strategy string
	// interval is the time-slice interval (TimeSlicing).
	interval string
	// devices are the claim's devices it applies to, by name.
	devices []string
	// gpus are the UUIDs of the whole GPUs among them, sorted: time-slices
	// and compute modes are set on these (a MIG device has neither).
	gpus []string
	// uuids are the UUIDs of all of them, sorted: the MPS daemon's
	// CUDA_VISIBLE_DEVICES, in this order.
	uuids []string
	// threads (-1: not set) and memLimits (by ordinal in uuids) are the
	// MPS daemon's per-client defaults.
	threads   int
	memLimits map[int]string
}

// configs decodes the claim's (and its classes') opaque configuration for
// this driver, in order of precedence, lowest first: the classes' in their
// order, then the claim's.
func (d *Driver) configs(c *resourceapi.ResourceClaim) ([]opaqueConfig, error) {
	var class, claim []opaqueConfig
	for i, cfg := range c.Status.Allocation.Devices.Config {
		if cfg.Opaque == nil || cfg.Opaque.Driver != d.name {
			continue
		}
		where := fmt.Sprintf("claim %s/%s: configuration %d (from the %s)", c.Namespace, c.Name, i, cfg.Source)
		dec := json.NewDecoder(bytes.NewReader(cfg.Opaque.Parameters.Raw))
		dec.DisallowUnknownFields()
		var dc deviceConfig
		if err := dec.Decode(&dc); err != nil {
			return nil, fmt.Errorf("%s: parameters: %w (want apiVersion %s, kind %s or %s, sharing)", where, err, ConfigAPIVersion, KindGpuConfig, KindMigDeviceConfig)
		}
		if dc.APIVersion != ConfigAPIVersion {
			return nil, fmt.Errorf("%s: apiVersion %q: want %s", where, dc.APIVersion, ConfigAPIVersion)
		}
		if dc.Kind != KindGpuConfig && dc.Kind != KindMigDeviceConfig {
			return nil, fmt.Errorf("%s: kind %q is not supported by gantry-dra-plugin (it takes %s and %s)", where, dc.Kind, KindGpuConfig, KindMigDeviceConfig)
		}
		if err := validSharing(dc); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		oc := opaqueConfig{where: where, requests: cfg.Requests, cfg: dc}
		if cfg.Source == resourceapi.AllocationConfigSourceClass {
			class = append(class, oc)
		} else {
			claim = append(claim, oc)
		}
	}
	return append(class, claim...), nil
}

// validSharing checks what can be checked without the devices.
func validSharing(dc deviceConfig) error {
	s := dc.Sharing
	if s == nil {
		return nil
	}
	switch s.Strategy {
	case StrategyTimeSlicing:
		if s.MPSConfig != nil {
			return fmt.Errorf("sharing.mpsConfig is set with strategy %s: use strategy %s, or remove mpsConfig", StrategyTimeSlicing, StrategyMPS)
		}
		if s.TimeSlicingConfig != nil && dc.Kind == KindMigDeviceConfig {
			return fmt.Errorf("sharing.timeSlicingConfig: a MIG device has no time-slice of its own; remove timeSlicingConfig from the %s", KindMigDeviceConfig)
		}
		if s.TimeSlicingConfig != nil && s.TimeSlicingConfig.Interval != nil {
			if _, ok := Intervals[*s.TimeSlicingConfig.Interval]; !ok {
				return fmt.Errorf("time-slice interval %q: use %s, %s, %s or %s", *s.TimeSlicingConfig.Interval, IntervalDefault, IntervalShort, IntervalMedium, IntervalLong)
			}
		}
	case StrategyMPS:
		if s.TimeSlicingConfig != nil {
			return fmt.Errorf("sharing.timeSlicingConfig is set with strategy %s: use strategy %s, or remove timeSlicingConfig", StrategyMPS, StrategyTimeSlicing)
		}
		if m := s.MPSConfig; m != nil && m.DefaultActiveThreadPercentage != nil {
			if p := *m.DefaultActiveThreadPercentage; p < 0 || p > 100 {
				return fmt.Errorf("sharing.mpsConfig.defaultActiveThreadPercentage %d: use 0 to 100", p)
			}
		}
	default:
		return fmt.Errorf("sharing strategy %q: use %s or %s", s.Strategy, StrategyTimeSlicing, StrategyMPS)
	}
	return nil
}

// sharingPlans maps the claim's configuration onto its devices of this
// driver (the last configuration naming a device's request wins; one
// naming no request applies to the devices of its kind: GpuConfig to whole
// GPUs, MigDeviceConfig to MIG devices) and returns what each sharing
// configuration asks of its devices. A device no sharing configuration
// applies to is shared the GPU's way: time-slicing at the interval it has.
func (d *Driver) sharingPlans(c *resourceapi.ResourceClaim) ([]sharingPlan, error) {
	cfgs, err := d.configs(c)
	if err != nil {
		return nil, err
	}
	if len(cfgs) == 0 {
		return nil, nil
	}
	groups := map[int]*sharingPlan{}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.name || r.Pool != d.pool {
			continue
		}
		dev, ok := d.byName[r.Device]
		if !ok || len(dev.Nodes) > 0 {
			continue // prepare names it; IMEX channels and vfio GPUs share nothing
		}
		mig := isMIG(dev)
		for i := len(cfgs) - 1; i >= 0; i-- {
			oc := cfgs[i]
			fits := (oc.cfg.Kind == KindMigDeviceConfig) == mig
			if len(oc.requests) > 0 {
				if !slices.Contains(oc.requests, r.Request) {
					continue
				}
				if !fits {
					what := "a whole GPU"
					if mig {
						what = "a MIG device"
					}
					return nil, fmt.Errorf("%s: kind %s names request %q, whose device %s is %s: use %s for GPUs, %s for MIG devices",
						oc.where, oc.cfg.Kind, r.Request, r.Device, what, KindGpuConfig, KindMigDeviceConfig)
				}
			} else if !fits {
				continue
			}
			if oc.cfg.Sharing == nil {
				break
			}
			p := groups[i]
			if p == nil {
				p = &sharingPlan{where: oc.where, strategy: oc.cfg.Sharing.Strategy, interval: IntervalDefault, threads: -1}
				if ts := oc.cfg.Sharing.TimeSlicingConfig; ts != nil && ts.Interval != nil {
					p.interval = *ts.Interval
				}
				groups[i] = p
			}
			if !slices.Contains(p.devices, r.Device) {
				p.devices = append(p.devices, r.Device)
				p.uuids = append(p.uuids, dev.UUID)
				if !mig {
					p.gpus = append(p.gpus, dev.UUID)
				}
			}
			break
		}
	}
	var out []sharingPlan
	for _, i := range slices.Sorted(maps.Keys(groups)) {
		p := groups[i]
		slices.Sort(p.uuids)
		slices.Sort(p.gpus)
		if p.strategy == StrategyMPS {
			if err := p.mpsDefaults(cfgs[i].cfg.Sharing.MPSConfig); err != nil {
				return nil, fmt.Errorf("%s: %w", p.where, err)
			}
		}
		out = append(out, *p)
	}
	return out, nil
}

// mpsDefaults turns NVIDIA's MpsConfig into the daemon's defaults. Memory
// limits are whole MiB ("1024M", the control program's form), at least one.
func (p *sharingPlan) mpsDefaults(m *mpsConfig) error {
	if m == nil {
		return nil
	}
	if m.DefaultActiveThreadPercentage != nil {
		p.threads = *m.DefaultActiveThreadPercentage
	}
	p.memLimits = map[int]string{}
	mib := func(key string, q resource.Quantity) (string, error) {
		v := q.Value() / (1 << 20)
		if v <= 0 {
			return "", fmt.Errorf("sharing.mpsConfig.%s %s: less than 1Mi; give at least 1Mi (e.g. 10Gi)", key, q.String())
		}
		return strconv.FormatInt(v, 10) + "M", nil
	}
	if q := m.DefaultPinnedDeviceMemoryLimit; q != nil {
		l, err := mib("defaultPinnedDeviceMemoryLimit", *q)
		if err != nil {
			return err
		}
		for i := range p.uuids {
			p.memLimits[i] = l
		}
	}
	for _, k := range slices.Sorted(maps.Keys(m.DefaultPerDevicePinnedMemoryLimit)) {
		i := slices.Index(p.uuids, k)
		if i < 0 {
			n, err := strconv.Atoi(k)
			if err != nil || n < 0 || n >= len(p.uuids) {
				return fmt.Errorf("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: key %q is neither the UUID of one of the %d devices it applies to (%s) nor an index below %d",
					k, len(p.uuids), strings.Join(p.uuids, ", "), len(p.uuids))
			}
			i = n
		}
		l, err := mib("defaultPerDevicePinnedMemoryLimit["+k+"]", m.DefaultPerDevicePinnedMemoryLimit[k])
		if err != nil {
			return err
		}
		p.memLimits[i] = l
	}
	return nil
}

// isMIG reports whether dev is a MIG device ("GPU:MIG" ID).
func isMIG(dev Device) bool { return strings.Contains(dev.ID, ":") }
