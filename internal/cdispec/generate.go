package cdispec

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/request"
)

// DefaultKind is the CDI kind NVIDIA's tools use for GPUs.
const DefaultKind = request.DefaultKind

// ErrInvalidSpec is wrapped by Generate when the CDI library rejects the
// generated spec.
var ErrInvalidSpec = errors.New("invalid CDI spec")

// ErrNoDevices is wrapped by Generate when the host has no GPU: a CDI spec
// must name at least one device.
var ErrNoDevices = errors.New("no GPU devices to put in a CDI spec")

// Options tune Generate.
type Options struct {
	// Kind is vendor.com/class; "" means DefaultKind.
	Kind string
	// HookPath is the absolute path of the binary the createContainer hooks
	// run (gantry-cdi-hook, nvidia-cdi-hook, or for the old form the gantry
	// CLI); "" leaves the hooks out. Every hook gets edits.HookEnv.
	HookPath string
	// Capabilities narrows the driver files in the spec; nil means all.
	Capabilities []driver.Capability
	// DevRoot is where the host's /dev is found ("" or "/" for the host's own).
	DevRoot string
}

// Generate builds the CDI spec for sys and inv and validates it with the CDI
// library. See the package doc for what it contains.
func Generate(sys *gpu.System, inv *driver.Inventory, opts Options) (*specs.Spec, error) {
	kind := opts.Kind
	if kind == "" {
		kind = DefaultKind
	}
	if _, _, err := parseKind(kind); err != nil {
		return nil, err
	}
	if sys == nil || len(sys.Devices) == 0 {
		return nil, fmt.Errorf("%w: the host reports none (is the driver loaded? try `gantry info`)", ErrNoDevices)
	}
	caps := opts.Capabilities
	if caps == nil {
		caps = driver.AllCapabilities
	}

	spec := &specs.Spec{Kind: kind}
	all := &edits.Edits{}
	addDevice := func(names []string, id string) error {
		_, e, err := deviceEdits(sys, id, caps, opts.DevRoot)
		if err != nil {
			return err
		}
		all.Merge(e)
		ce := e.CDI(opts.HookPath)
		for _, n := range names {
			spec.Devices = append(spec.Devices, specs.Device{Name: n, ContainerEdits: copyEdits(ce)})
		}
		return nil
	}
	for _, d := range sys.Devices {
		if d.MIGEnabled {
			continue
		}
		id := strconv.Itoa(d.Index)
		if err := addDevice([]string{id, d.UUID}, id); err != nil {
			return nil, err
		}
	}
	for _, d := range sys.Devices {
		for _, m := range d.MIGDevices {
			if err := addDevice([]string{m.Name(), m.UUID}, m.Name()); err != nil {
				return nil, err
			}
		}
	}
	if len(spec.Devices) == 0 {
		return nil, fmt.Errorf("%w: every GPU is in MIG mode without MIG devices (create instances with nvidia-smi mig)", ErrNoDevices)
	}
	spec.Devices = append(spec.Devices, specs.Device{Name: "all", ContainerEdits: all.CDI(opts.HookPath)})

	spec.ContainerEdits = CommonEdits(inv, opts)

	v, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("finding the CDI version for kind %s: %w", kind, err)
	}
	spec.Version = v
	if err := Validate(spec); err != nil {
		return nil, err
	}
	return spec, nil
}

// CommonEdits returns the spec-wide container edits Generate writes: the
// driver files of opts.Capabilities (all when nil), the control device
// nodes, the createContainer hooks (when opts.HookPath is set, with CUDA
// forward compatibility for inv's driver version) and
// NVIDIA_VISIBLE_DEVICES=void. Other spec writers (the DRA plugin's
// per-claim specs) use it so that every CDI spec Gantry writes gives a
// container the same driver files.
func CommonEdits(inv *driver.Inventory, opts Options) specs.ContainerEdits {
	caps := opts.Capabilities
	if caps == nil {
		caps = driver.AllCapabilities
	}
	common := edits.Common(inv, caps)
	common.Merge(&edits.Edits{Env: []string{edits.VisibleDevicesVoid}})
	ce := common.CDI(opts.HookPath)
	if inv != nil {
		addForwardCompat(&ce, opts.HookPath, inv.Version)
	}
	return ce
}

// DeviceEdits returns the container edits of one device of sys, named by
// GPU index ("0") or MIG name ("1:0"), as Generate writes them for that
// device: its device nodes stat'ed under opts.DevRoot (and its DRI nodes
// when graphics or display is among opts.Capabilities).
func DeviceEdits(sys *gpu.System, id string, opts Options) (specs.ContainerEdits, error) {
	caps := opts.Capabilities
	if caps == nil {
		caps = driver.AllCapabilities
	}
	_, e, err := deviceEdits(sys, id, caps, opts.DevRoot)
	if err != nil {
		return specs.ContainerEdits{}, err
	}
	return e.CDI(opts.HookPath), nil
}

func deviceEdits(sys *gpu.System, id string, caps []driver.Capability, devRoot string) ([]edits.Selected, *edits.Edits, error) {
	selected, e, err := edits.ForDevices(sys, request.Selection{Mode: request.List, IDs: []string{id}}, devRoot)
	if err != nil {
		return nil, nil, err
	}
	if slices.Contains(caps, driver.Graphics) || slices.Contains(caps, driver.Display) {
		dri, err := edits.DRINodes(selected, devRoot)
		if err != nil {
			return nil, nil, err
		}
		e.Merge(dri)
	}
	return selected, e, nil
}

// copyEdits gives each named alias of a device its own edits, so that a
// consumer modifying one device entry cannot change another.
func copyEdits(c specs.ContainerEdits) specs.ContainerEdits {
	out := c
	out.Env = append([]string(nil), c.Env...)
	out.DeviceNodes = nil
	for _, n := range c.DeviceNodes {
		nn := *n
		out.DeviceNodes = append(out.DeviceNodes, &nn)
	}
	out.Mounts = nil
	for _, m := range c.Mounts {
		mm := *m
		mm.Options = append([]string(nil), m.Options...)
		out.Mounts = append(out.Mounts, &mm)
	}
	out.Hooks = nil
	for _, h := range c.Hooks {
		hh := *h
		hh.Args = append([]string(nil), h.Args...)
		hh.Env = append([]string(nil), h.Env...)
		out.Hooks = append(out.Hooks, &hh)
	}
	return out
}

// Validate runs the CDI library's checks on spec, the same ones a runtime
// runs when it loads the file: version and features, vendor and class,
// spec-wide edits, device names, non-empty and valid device edits, unique
// names; and (Gantry's own) hook paths that are absolute. Errors wrap
// ErrInvalidSpec.
func Validate(spec *specs.Spec) error {
	if spec == nil {
		return fmt.Errorf("%w: nil spec", ErrInvalidSpec)
	}
	if err := specs.ValidateVersion(spec); err != nil {
		return fmt.Errorf("%w: cdiVersion %q: %w", ErrInvalidSpec, spec.Version, err)
	}
	if _, _, err := parseKind(spec.Kind); err != nil {
		return err
	}
	if err := (&cdi.ContainerEdits{ContainerEdits: &spec.ContainerEdits}).Validate(); err != nil {
		return fmt.Errorf("%w: spec-wide edits: %w", ErrInvalidSpec, err)
	}
	if len(spec.Devices) == 0 {
		return fmt.Errorf("%w: kind %s has no devices", ErrInvalidSpec, spec.Kind)
	}
	seen := make(map[string]bool, len(spec.Devices))
	for i := range spec.Devices {
		d := &spec.Devices[i]
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return fmt.Errorf("%w: device %q: %w", ErrInvalidSpec, d.Name, err)
		}
		if seen[d.Name] {
			return fmt.Errorf("%w: device %q defined twice", ErrInvalidSpec, d.Name)
		}
		seen[d.Name] = true
		ce := d.ContainerEdits
		if len(ce.Env) == 0 && len(ce.DeviceNodes) == 0 && len(ce.Mounts) == 0 && len(ce.Hooks) == 0 &&
			len(ce.NetDevices) == 0 && len(ce.AdditionalGIDs) == 0 && ce.IntelRdt == nil {
			return fmt.Errorf("%w: device %q has no container edits", ErrInvalidSpec, d.Name)
		}
		if err := (&cdi.ContainerEdits{ContainerEdits: &d.ContainerEdits}).Validate(); err != nil {
			return fmt.Errorf("%w: device %q: %w", ErrInvalidSpec, d.Name, err)
		}
	}
	return ValidateHookPaths(spec)
}

func parseKind(kind string) (vendor, class string, err error) {
	vendor, class = parser.ParseQualifier(kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return "", "", fmt.Errorf("%w: kind %q: %w (want vendor.com/class, e.g. nvidia.com/gpu)", ErrInvalidSpec, kind, err)
	}
	if err := parser.ValidateClassName(class); err != nil {
		return "", "", fmt.Errorf("%w: kind %q: %w (want vendor.com/class, e.g. nvidia.com/gpu)", ErrInvalidSpec, kind, err)
	}
	return vendor, class, nil
}

// Names returns the fully qualified device names of spec ("nvidia.com/gpu=0"),
// in spec order.
func Names(spec *specs.Spec) []string {
	if spec == nil {
		return nil
	}
	vendor, class := parser.ParseQualifier(spec.Kind)
	out := make([]string, 0, len(spec.Devices))
	for _, d := range spec.Devices {
		out = append(out, parser.QualifiedName(vendor, class, d.Name))
	}
	return out
}

// addForwardCompat makes the ld.so.cache hook of edits apply CUDA forward
// compatibility for a host on driver version: gantry's update-ldcache takes
// --host-driver-version; for NVIDIA's nvidia-cdi-hook, whose update-ldcache
// does not, an enable-cuda-compat hook runs first, as NVIDIA's specs do.
func addForwardCompat(e *specs.ContainerEdits, hookPath, version string) {
	if version == "" {
		return
	}
	for i, h := range e.Hooks {
		if len(h.Args) == 0 || !slices.Contains(h.Args, edits.HookUpdateLDCache) {
			continue
		}
		if filepath.Base(hookPath) == "nvidia-cdi-hook" {
			compat := &specs.Hook{HookName: h.HookName, Path: h.Path, Args: []string{h.Args[0], edits.HookEnableCUDACompat, "--host-driver-version=" + version}, Env: edits.HookEnv()}
			e.Hooks = append(e.Hooks[:i], append([]*specs.Hook{compat}, e.Hooks[i:]...)...)
			return
		}
		h.Args = append(h.Args, "--host-driver-version", version)
		return
	}
}
