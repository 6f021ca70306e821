package metrics

import "github.com/gantry-gpu/gantry/internal/gpu/readings"

// The readings the exporter publishes come from package readings; these
// names keep the exporter's API in one place.
type (
	Sample = readings.Sample
	Reader = readings.Reader
)

var (
	Unknown = readings.Unknown
	NewSim  = readings.NewSim
	NewNVML = readings.NewNVML
)

// HealthFunc reports what the device plugin knows of a GPU: whether it is
// healthy and how many XID errors it has seen since the plugin started.
type HealthFunc func(uuid string) (healthy bool, xids uint64)
