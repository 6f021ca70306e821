package draplugin

import (
	"bytes"
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
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
)

// deviceConfig is GpuConfig and MigDeviceConfig: only sharing.
type deviceConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Sharing    *struct {
		Strategy          string `json:"strategy"`
		TimeSlicingConfig *struct {
			Interval *string `json:"interval,omitempty"`
		} `json:"timeSlicingConfig,omitempty"`
		MPSConfig json.RawMessage `json:"mpsConfig,omitempty"`
	} `json:"sharing,omitempty"`
}

// checkConfig reads the claim's (and its classes') opaque configuration for
// this driver. What Gantry does (nothing to do: time-slicing at the
// driver's default interval is how a GPU runs several processes) passes;
// what it cannot do yet is an error naming the setting, so a claim never
// runs without what it asked for.
func (d *Driver) checkConfig(c *resourceapi.ResourceClaim) error {
	for i, cfg := range c.Status.Allocation.Devices.Config {
		if cfg.Opaque == nil || cfg.Opaque.Driver != d.name {
			continue
		}
		where := fmt.Sprintf("claim %s/%s: configuration %d (from the %s)", c.Namespace, c.Name, i, cfg.Source)
		dec := json.NewDecoder(bytes.NewReader(cfg.Opaque.Parameters.Raw))
		dec.DisallowUnknownFields()
		var dc deviceConfig
		if err := dec.Decode(&dc); err != nil {
			return fmt.Errorf("%s: parameters: %w (want apiVersion %s, kind %s or %s, sharing)", where, err, ConfigAPIVersion, KindGpuConfig, KindMigDeviceConfig)
		}
		if dc.APIVersion != ConfigAPIVersion {
			return fmt.Errorf("%s: apiVersion %q: want %s", where, dc.APIVersion, ConfigAPIVersion)
		}
		if dc.Kind != KindGpuConfig && dc.Kind != KindMigDeviceConfig {
			return fmt.Errorf("%s: kind %q is not supported by gantry-dra-plugin (it takes %s and %s)", where, dc.Kind, KindGpuConfig, KindMigDeviceConfig)
		}
		if dc.Sharing == nil {
			continue
		}
		switch s := dc.Sharing; s.Strategy {
		case StrategyTimeSlicing:
			if dc.Kind == KindMigDeviceConfig {
				return fmt.Errorf("%s: a MIG device cannot be time-sliced (use strategy %s, or none)", where, StrategyMPS)
			}
			if s.TimeSlicingConfig != nil && s.TimeSlicingConfig.Interval != nil && *s.TimeSlicingConfig.Interval != IntervalDefault {
				return fmt.Errorf("%s: time-slice interval %q: gantry-dra-plugin does not set intervals yet; use %s or leave it out", where, *s.TimeSlicingConfig.Interval, IntervalDefault)
			}
		case StrategyMPS:
			return fmt.Errorf("%s: sharing strategy %s is not supported by gantry-dra-plugin yet; leave sharing out to share by time-slicing", where, StrategyMPS)
		default:
			return fmt.Errorf("%s: sharing strategy %q: use %s or %s", where, s.Strategy, StrategyTimeSlicing, StrategyMPS)
		}
	}
	return nil
}
