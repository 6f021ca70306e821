package health

import "errors"

// errLost marks a probe failure where NVML reports the GPU lost.
var errLost = errors.New("NVML reports the GPU lost")

// NVML event type bits as nvml.h defines them (nvmlEventType*); they are
// spelled out here so that the translation below builds and is tested without
// cgo. nvml_test.go checks them against go-nvml.
const (
	nvmlEventSingleBitECC uint64 = 0x1
	nvmlEventDoubleBitECC uint64 = 0x2
	nvmlEventXIDCritical  uint64 = 0x8

	// watchedEvents is the mask registered on every GPU, as NVIDIA's plugin
	// does; single-bit errors are registered and then ignored.
	watchedEvents = nvmlEventXIDCritical | nvmlEventDoubleBitECC | nvmlEventSingleBitECC

	// noInstance is NVML's GPU/compute instance id for "the whole GPU".
	noInstance uint32 = 0xFFFFFFFF
)

// placement is a watched device on its parent GPU: the GPU itself (gi and ci
// noInstance) or a MIG device (its GPU and compute instance).
type placement struct {
	uuid   string
	gi, ci uint32
}

// nvmlEvent is what the watch loop reads from one nvmlEventData.
type nvmlEvent struct {
	gpuUUID   string // of the GPU the event came from (the MIG parent)
	eventType uint64
	data      uint64 // the XID for nvmlEventTypeXidCriticalError
	gi, ci    uint32
}

// translate turns one NVML event into observations on the watched devices,
// byParent listing them per parent GPU UUID. A whole GPU is affected by every
// event on it; a MIG device by events for the whole GPU and by those that
// name its own GPU and compute instance.
func translate(e nvmlEvent, byParent map[string][]placement) []observation {
	var o observation
	switch e.eventType {
	case nvmlEventXIDCritical:
		o.kind, o.xid = kindXID, e.data
	case nvmlEventDoubleBitECC:
		o.kind = kindDBE
	case nvmlEventSingleBitECC:
		o.kind = kindSBE
	default:
		return nil
	}
	wholeGPU := e.gi == noInstance || e.ci == noInstance
	var out []observation
	for _, p := range byParent[e.gpuUUID] {
		if p.gi == noInstance || wholeGPU || (p.gi == e.gi && p.ci == e.ci) {
			o.uuid = p.uuid
			out = append(out, o)
		}
	}
	return out
}
