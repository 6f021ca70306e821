//go:build cgo

package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpunvml "github.com/gantry-gpu/gantry/internal/gpu/nvml"
)

// NewNVML returns the Source for the host's real GPUs: an NVML event set
// watching critical XIDs and ECC errors, with NVML loaded as package
// internal/gpu/nvml loads it (the dynamic loader, then the library
// directories under driverRoot).
func NewNVML(driverRoot string, p Policy) Source {
	return &nvmlSource{root: driverRoot, p: p, clk: realClock{}, log: p.logger()}
}

type nvmlSource struct {
	root string
	p    Policy
	clk  clock
	log  *slog.Logger
}

// waitMillis bounds each wait on the event set, and so how long Run takes to
// notice that ctx is done.
const waitMillis = 1000

func (s *nvmlSource) Run(ctx context.Context, uuids []string, out chan<- Event) error {
	lib, shutdown, err := gpunvml.Open(s.root)
	if err != nil {
		return fmt.Errorf("GPU health: %w", err)
	}
	defer shutdown()
	ws, err := register(lib, uuids)
	if err != nil {
		return err
	}
	defer ws.set.Free()
	for _, u := range uuids {
		if why, ok := ws.unknown[u]; ok {
			s.log.Warn("GPU health unknown, assumed healthy", "uuid", u, "reason", why)
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in := make(chan request)
	var wg sync.WaitGroup
	defer wg.Wait()
	probe := func(u string) error { return probeDevice(lib, u) }
	wg.Go(func() { watch(ctx, s.clk, newTracker(s.p, uuids, probe, s.log), in, out) })
	post := func(obs []observation) bool {
		for _, o := range obs {
			select {
			case in <- request{obs: o}:
			case <-ctx.Done():
				return false
			}
		}
		return true
	}
	if !post(ws.lost) {
		return nil
	}
	s.log.Info("GPU health: watching NVML events", "devices", len(uuids), "unknown", len(ws.unknown))
	for ctx.Err() == nil {
		e, ret := ws.set.Wait(waitMillis)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		case nvml.ERROR_UNINITIALIZED:
			return fmt.Errorf("GPU health: waiting for NVML events: %s", nvml.ErrorString(ret))
		default:
			// Often ERROR_GPU_IS_LOST, which does not say which GPU: ask
			// each one, then wait again after a pause so that a lasting
			// failure does not spin.
			s.log.Warn("GPU health: waiting for NVML events failed; checking every GPU", "error", nvml.ErrorString(ret))
			var lost []observation
			for _, u := range uuids {
				if err := probeDevice(lib, u); errors.Is(err, errLost) {
					lost = append(lost, observation{uuid: u, kind: kindLost})
				}
			}
			if !post(lost) {
				return nil
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		gpuUUID, ret := e.Device.GetUUID()
		if ret != nvml.SUCCESS {
			s.log.Warn("GPU health: event from a GPU whose UUID NVML cannot read; ignored", "type", e.EventType, "data", e.EventData, "error", nvml.ErrorString(ret))
			continue
		}
		if !post(translate(nvmlEvent{gpuUUID: gpuUUID, eventType: e.EventType, data: e.EventData, gi: e.GpuInstanceId, ci: e.ComputeInstanceId}, ws.byParent)) {
			return nil
		}
	}
	return nil
}

// watchSet is an NVML event set with the watched devices registered on it.
type watchSet struct {
	set      nvml.EventSet
	byParent map[string][]placement
	// unknown holds the devices whose events could not be registered, and
	// why; they are assumed healthy.
	unknown map[string]string
	// lost holds the devices NVML already reports lost.
	lost []observation
}

// register creates the event set and registers each device's parent GPU on
// it once. Only a failure to create the set is an error; a device that cannot
// be registered is recorded in unknown.
func register(lib nvml.Interface, uuids []string) (*watchSet, error) {
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GPU health: creating an NVML event set: %s; check the driver with nvidia-smi", nvml.ErrorString(ret))
	}
	ws := &watchSet{set: set, byParent: map[string][]placement{}, unknown: map[string]string{}}
	parents := map[string]nvml.Device{}
	var order []string
	for _, u := range uuids {
		h, ret := lib.DeviceGetHandleByUUID(u)
		if ret == nvml.ERROR_GPU_IS_LOST {
			ws.lost = append(ws.lost, observation{uuid: u, kind: kindLost})
			continue
		}
		if ret != nvml.SUCCESS {
			ws.unknown[u] = "getting its NVML handle: " + nvml.ErrorString(ret)
			continue
		}
		p := placement{uuid: u, gi: noInstance, ci: noInstance}
		parent, parentUUID := h, u
		if strings.HasPrefix(u, "MIG-") {
			var why string
			parent, parentUUID, p.gi, p.ci, why = migPlacement(h)
			if why != "" {
				ws.unknown[u] = why
				continue
			}
		}
		if _, seen := parents[parentUUID]; !seen {
			parents[parentUUID] = parent
			order = append(order, parentUUID)
		}
		ws.byParent[parentUUID] = append(ws.byParent[parentUUID], p)
	}
	for _, pu := range order {
		if why := registerGPU(parents[pu], set); why != "" {
			for _, p := range ws.byParent[pu] {
				ws.unknown[p.uuid] = why
			}
			delete(ws.byParent, pu)
		}
	}
	return ws, nil
}

// registerGPU registers the watched events that GPU h supports; it returns
// why it could not, or "".
func registerGPU(h nvml.Device, set nvml.EventSet) string {
	supported, ret := h.GetSupportedEventTypes()
	if ret != nvml.SUCCESS {
		return "reading its supported NVML events: " + nvml.ErrorString(ret)
	}
	mask := watchedEvents & supported
	if mask&(nvmlEventXIDCritical|nvmlEventDoubleBitECC) == 0 {
		return "it reports neither XID nor ECC events"
	}
	if ret := h.RegisterEvents(mask, set); ret != nvml.SUCCESS {
		return "registering NVML events: " + nvml.ErrorString(ret)
	}
	return ""
}

// migPlacement finds a MIG device's parent GPU and instances; why says what
// failed.
func migPlacement(h nvml.Device) (parent nvml.Device, parentUUID string, gi, ci uint32, why string) {
	parent, ret := h.GetDeviceHandleFromMigDeviceHandle()
	if ret != nvml.SUCCESS {
		return nil, "", 0, 0, "finding its parent GPU: " + nvml.ErrorString(ret)
	}
	if parentUUID, ret = parent.GetUUID(); ret != nvml.SUCCESS {
		return nil, "", 0, 0, "reading its parent GPU's UUID: " + nvml.ErrorString(ret)
	}
	g, ret := h.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return nil, "", 0, 0, "reading its GPU instance: " + nvml.ErrorString(ret)
	}
	c, ret := h.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		return nil, "", 0, 0, "reading its compute instance: " + nvml.ErrorString(ret)
	}
	return parent, parentUUID, uint32(g), uint32(c), ""
}

// probeDevice checks that NVML still answers for device uuid (for a MIG
// device, its parent GPU) with a query that reaches the driver.
func probeDevice(lib nvml.Interface, uuid string) error {
	h, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret == nvml.SUCCESS && strings.HasPrefix(uuid, "MIG-") {
		h, ret = h.GetDeviceHandleFromMigDeviceHandle()
	}
	if ret == nvml.SUCCESS {
		_, ret = h.GetMemoryInfo()
	}
	switch ret {
	case nvml.SUCCESS, nvml.ERROR_NOT_SUPPORTED:
		return nil
	case nvml.ERROR_GPU_IS_LOST:
		return errLost
	default:
		return fmt.Errorf("NVML: %s", nvml.ErrorString(ret))
	}
}
