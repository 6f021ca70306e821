package edits

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/request"
)

// Options tune Build.
type Options struct {
	// DevRoot is where the host's /dev is found ("" or "/" for the host's own);
	// per-GPU and MIG capability nodes are stat'ed under it.
	DevRoot string
}

// driverRoot is where host files of the driver's features (cufile.json)
// are looked up: the inventory's root, else the device root, else /.
func driverRoot(inv *driver.Inventory, opts Options) string {
	if inv != nil && inv.Root != "" {
		return inv.Root
	}
	if opts.DevRoot != "" {
		return opts.DevRoot
	}
	return "/"
}

// Build computes the edits for one container. It returns nil edits (and no
// error) when the request wants nothing (Void). Otherwise it first checks the
// request's NVIDIA_REQUIRE_* expressions against the host and the selected
// GPUs and refuses, with the failing requirement, before computing anything;
// then it merges the driver files for the requested capabilities, the device
// nodes of the selected devices (none for None), the MIG config/monitor
// capability nodes. The container's NVIDIA_VISIBLE_DEVICES is left as it was
// (see InjectedAnnotation).
//
// CDI names in req.CDIDevices are not resolved here: package inject injects
// them through the CDI registry, from the spec package cdispec writes.
func Build(sys *gpu.System, inv *driver.Inventory, req *request.Request, opts Options) (*Edits, error) {
	if req == nil || req.Devices.Mode == request.Void {
		return nil, nil
	}
	if sys == nil {
		sys = &gpu.System{}
	}
	selected, err := Resolve(sys, req.Devices)
	if err != nil {
		return nil, fmt.Errorf("device request from %s: %w", sourceName(req.Source), err)
	}
	return BuildSelected(sys, inv, req, selected, opts)
}

// BuildSelected is Build for a caller that has resolved req.Devices on sys
// already (Resolve), so that the devices are looked up once per container.
func BuildSelected(sys *gpu.System, inv *driver.Inventory, req *request.Request, selected []Selected, opts Options) (*Edits, error) {
	if req == nil || req.Devices.Mode == request.Void {
		return nil, nil
	}
	if sys == nil {
		sys = &gpu.System{}
	}
	if err := checkRequirements(sys, inv, req.Requirements, selected); err != nil {
		return nil, err
	}

	devs, err := deviceEdits(selected, opts.DevRoot)
	if err != nil {
		return nil, err
	}
	mig, err := migCapNodes(req, opts.DevRoot)
	if err != nil {
		return nil, err
	}
	feat, err := featureEdits(req, opts.DevRoot, driverRoot(inv, opts))
	if err != nil {
		return nil, err
	}
	e := Common(inv, req.Capabilities)
	e.Merge(devs)
	e.Merge(mig)
	e.Merge(feat)
	if slices.Contains(req.Capabilities, driver.Graphics) || slices.Contains(req.Capabilities, driver.Display) {
		dri, err := DRINodes(selected, opts.DevRoot)
		if err != nil {
			return nil, err
		}
		e.Merge(dri)
	}
	return e, nil
}

// checkRequirements evaluates the requirements against the host and each
// distinct physical GPU selected (a MIG device is judged by its parent).
func checkRequirements(sys *gpu.System, inv *driver.Inventory, reqs []request.Requirement, selected []Selected) error {
	if len(reqs) == 0 {
		return nil
	}
	host := request.Host{CUDA: sys.CUDADriverVersion, Driver: sys.DriverVersion}
	if host.Driver == "" && inv != nil {
		host.Driver = inv.Version
	}
	var gpus []request.GPU
	seen := map[string]bool{}
	for _, s := range selected {
		if seen[s.GPU.UUID] {
			continue
		}
		seen[s.GPU.UUID] = true
		gpus = append(gpus, request.GPU{ID: strconv.Itoa(s.GPU.Index) + " (" + s.GPU.UUID + ")", Arch: s.GPU.ComputeCapability, Brand: s.GPU.Brand})
	}
	if err := request.Check(reqs, host, gpus); err != nil {
		return fmt.Errorf("container requirements not met on this host: %w", err)
	}
	return nil
}

func sourceName(s request.Source) string {
	switch s {
	case request.SourceEnv:
		return "NVIDIA_VISIBLE_DEVICES"
	case request.SourceMounts:
		return "the /var/run/nvidia-container-devices mounts"
	case request.SourceCDIAnnotations:
		return "CDI annotations"
	}
	return "the container"
}
