package inject

import (
	"fmt"
	"strings"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/cdiindex"
	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/request"
)

// Options are what a front end decides about the pipeline; everything else
// comes from the configuration and the request.
type Options struct {
	// CDI resolves the request's CDI names: those of the configured kind
	// (cdi.kind, nvidia.com/gpu=1) become device IDs, the others are
	// injected from the CDI spec directories by ApplyToSpec. Only a front
	// end that writes config.json can do that; a hook runs after the
	// engine resolved the names.
	CDI bool
	// FullGPUs asks for the full GPU discovery (brand and architecture,
	// which NVIDIA_REQUIRE_* expressions judge): never cached.
	FullGPUs bool
	// ForwardCompat puts the image's CUDA forward-compatibility libraries
	// first in its ld.so.cache when they are newer than the host driver.
	ForwardCompat bool
	// DeviceFlag, when set, names where the device request came from in a
	// resolve error ("--device=1,2"); the request's own source otherwise.
	DeviceFlag string
	// Inventory, when set, trims the driver inventory before the edits are
	// computed (nvidia-container-cli --no-persistenced).
	Inventory func(*driver.Inventory)
	// SpecMounts are the container paths of the container's own mounts
	// (config.json's, MountPaths): one at or below runtime.driver-tree-path
	// keeps the per-file layout, as the tree's mount would hide it.
	SpecMounts []string
}

// MountPaths are the container paths of spec's mounts, for
// Options.SpecMounts.
func MountPaths(spec *ocispecs.Spec) []string {
	out := make([]string, 0, len(spec.Mounts))
	for _, m := range spec.Mounts {
		out = append(out, m.Destination)
	}
	return out
}

// Plan is what one container gets: the request as resolved, the host it was
// resolved on, and the edits. A front end applies Edits its own way (the
// runtime to config.json with ApplyToSpec, the hooks through the mount
// namespace), then calls FinishRootfs.
type Plan struct {
	Request   *request.Request
	System    *gpu.System
	Inventory *driver.Inventory
	// Selected are the devices the request resolved to.
	Selected []edits.Selected
	// Edits are nil when the request names no device of ours (Void): only
	// other vendors' CDI names, if any.
	Edits *edits.Edits
	// CDI are the CDI names of other kinds, for ApplyToSpec.
	CDI []string
	// Record is the front end's log record, filled in as the plan is made
	// and applied.
	Record *Record

	// cdi finds other vendors' CDI devices (spec-dirs, the index in
	// runtime.cache-dir).
	cdi  cdiindex.Options
	opts Options
	// inTree are the driver files the driver tree's mount provides
	// (runtime.driver-layout = "tree").
	inTree []edits.Provided
	// noCgroups leaves the device cgroup rules out of the spec
	// (runtime.no-cgroups, rootless engines).
	noCgroups bool
}

// Already returns the devices named in spec's InjectedAnnotation, if
// gantry-runtime injected GPUs into it before (a retried create, a hook
// after the runtime): such a spec is left alone.
func Already(annotations map[string]string) (string, bool) {
	v, ok := annotations[edits.InjectedAnnotation]
	return v, ok
}

// AlreadyNote is the record's note for a spec Already finds injected.
func AlreadyNote(devices string) string {
	return "GPUs " + devices + " already injected (annotation " + edits.InjectedAnnotation + "): left as is"
}

// ReadRequest reads the GPU request from spec (env, annotations, mounts),
// by the host's rules in cfg, and adds its warnings to the record.
func ReadRequest(spec *ocispecs.Spec, cfg config.Config, rec *Record) (*request.Request, error) {
	req, err := request.Parse(request.InputFromSpec(spec), discover.RequestOptions(cfg))
	if err != nil {
		return nil, err
	}
	rec.Notes = append(rec.Notes, req.Warnings...)
	if req.KubeletPlugin != "" {
		// Which rule let a pod's own variable through, on the record.
		rec.Notes = append(rec.Notes, req.KubeletPlugin)
	}
	return req, nil
}

// Prepare makes the plan for req on this host: the CDI names split by kind
// (Options.CDI), the GPUs and the driver inventory (from the inventory
// cache in runtime.cache-dir when it is current), the "driver incomplete"
// refusal, the devices resolved once, and the edits (which check
// NVIDIA_REQUIRE_* first). A request that names no device of ours gets a
// plan without edits. req may be changed (CDI names of our kind move into
// its devices).
func Prepare(cfg config.Config, req *request.Request, opts Options, rec *Record) (*Plan, error) {
	p := &Plan{Request: req, Record: rec, opts: opts, noCgroups: cfg.Runtime.NoCgroups,
		cdi: cdiindex.Options{Dirs: cfg.CDI.SpecDirs, CacheDir: cfg.Runtime.CacheDir}}
	p.cdi.Warn = func(s string) { rec.Notes = append(rec.Notes, s) }
	rec.Changed, rec.Source = true, req.Source
	if opts.CDI {
		// Names of our own kind are device IDs; other kinds go to the CDI registry.
		others, err := ownCDINames(req, cfg.CDI.Kind)
		if err != nil {
			return nil, err
		}
		p.CDI = others
	}
	if req.Devices.Mode == request.Void {
		return p, nil
	}
	sys, inv, gpuSrc, invSrc, err := loadHost(cfg, opts.FullGPUs)
	if err != nil {
		return nil, err
	}
	rec.Phase("host")
	rec.Inventory, rec.GPUs = string(invSrc), string(gpuSrc)
	if len(inv.Missing) > 0 {
		return nil, fmt.Errorf("the driver under %s is incomplete (missing %s): fix the installation or set driver-root in the Gantry configuration (%s, or the file in $%s)", inv.Root, strings.Join(inv.Missing, ", "), config.DefaultPath, config.EnvPath)
	}
	if opts.Inventory != nil {
		opts.Inventory(inv)
	}
	p.System, p.Inventory = sys, inv
	if p.Selected, err = edits.Resolve(sys, req.Devices); err != nil {
		if opts.DeviceFlag != "" {
			return nil, fmt.Errorf("%s: %w", opts.DeviceFlag, err)
		}
		return nil, err
	}
	if err := checkHolders(cfg, req, sys, p.Selected); err != nil {
		return nil, err
	}
	for _, s := range p.Selected {
		rec.Devices = append(rec.Devices, s.Name())
	}
	if p.Edits, err = edits.BuildSelected(sys, inv, req, p.Selected, edits.Options{DevRoot: cfg.EffectiveDevRoot()}); err != nil {
		return nil, err
	}
	if req.VisibleDevices != "" {
		// The container reads what it was given, not the image's "all".
		p.Edits.Env = append(p.Edits.Env, request.EnvVisibleDevices+"="+req.VisibleDevices)
	}
	rec.Edits = p.Edits
	rec.Phase("edits")
	if cfg.Runtime.DriverLayout == config.DriverLayoutTree {
		p.useTree(cfg)
		rec.Phase("tree")
	}
	return p, nil
}

// Injected is the value of the spec's InjectedAnnotation: the devices, the
// other CDI names, or the request's mode ("none") for driver files only.
func (p *Plan) Injected() string {
	injected := append(append([]string{}, p.Record.Devices...), p.CDI...)
	if len(injected) == 0 {
		injected = []string{p.Request.Devices.Mode.String()}
	}
	return strings.Join(injected, ",")
}

// ApplyToSpec applies the plan to an OCI spec: the edits (device nodes,
// cgroup rules, mounts, env), the InjectedAnnotation, and the CDI devices
// of other kinds from the spec directories.
func (p *Plan) ApplyToSpec(spec *ocispecs.Spec) error {
	if err := p.Edits.ApplyToSpecWith(spec, edits.SpecOptions{NoCgroups: p.noCgroups}); err != nil {
		return err
	}
	if p.Edits != nil || len(p.CDI) > 0 {
		if spec.Annotations == nil {
			spec.Annotations = map[string]string{}
		}
		spec.Annotations[edits.InjectedAnnotation] = p.Injected()
	}
	if len(p.CDI) > 0 {
		if err := injectCDI(spec, p.cdi, p.CDI); err != nil {
			return err
		}
		p.Record.CDI = p.CDI
	}
	return nil
}

// ownCDINames moves the request's CDI names of kind into its device
// selection (nvidia.com/gpu=1 is device 1) and returns the other names.
func ownCDINames(req *request.Request, kind string) ([]string, error) {
	var ids, others []string
	for _, n := range req.CDIDevices {
		if id, ok := strings.CutPrefix(n, kind+"="); ok {
			ids = append(ids, id)
		} else {
			others = append(others, n)
		}
	}
	req.CDIDevices = others
	if len(ids) == 0 {
		return others, nil
	}
	sel, _, err := request.ParseSelection("CDI device "+kind, strings.Join(ids, ","))
	if err != nil {
		return nil, err
	}
	switch {
	case req.Devices.Mode == request.All || sel.Mode == request.All:
		req.Devices = request.Selection{Mode: request.All}
	case sel.Mode == request.List:
		if req.Devices.Mode == request.List {
			sel.IDs = append(append([]string(nil), req.Devices.IDs...), sel.IDs...)
		}
		req.Devices = sel
	case req.Devices.Mode == request.Void:
		req.Devices = sel
	}
	return others, nil
}

// injectCDI resolves CDI names of other vendors through the spec
// directories (package cdiindex: bounded, and indexed in runtime.cache-dir so
// that a create parses only the specs that define its devices) and applies
// their edits as the CDI library's Cache.InjectDevices does: each spec's
// own edits once, then each device's.
//
// A hook of those specs that has no env of its own gets edits.HookEnv
// before it is injected: runc and crun run a createContainer hook whose env
// is empty with the container's process.env, so a spec written without one
// (by another vendor's tool, or by an older gantry) would hand the image's
// LD_PRELOAD to a root process that still sees the host. A hook that has an
// env keeps it: the spec's author chose it.
//
// A hook named by a relative path is refused (cdiindex.Devices): runc and
// crun run hooks with the container's root filesystem as their working
// directory, so the image's file of that name would run as root on the host.
func injectCDI(spec *ocispecs.Spec, o cdiindex.Options, names []string) error {
	devs, err := cdiindex.Devices(o, names)
	if err != nil {
		return err
	}
	// The devices are this call's own copies: they can be edited in place.
	all := &cdi.ContainerEdits{ContainerEdits: &cdispecs.ContainerEdits{}}
	seen := map[*cdi.Spec]bool{}
	for _, d := range devs {
		if s := d.GetSpec(); !seen[s] {
			seen[s] = true
			setHookEnv(s.ContainerEdits.Hooks)
			all.Append(&cdi.ContainerEdits{ContainerEdits: &s.ContainerEdits})
		}
		setHookEnv(d.ContainerEdits.Hooks)
		all.Append(&cdi.ContainerEdits{ContainerEdits: &d.ContainerEdits})
	}
	if err := all.Apply(spec); err != nil {
		return fmt.Errorf("injecting CDI devices %s: %w", strings.Join(names, ", "), err)
	}
	return nil
}

// setHookEnv gives every hook without an env the fixed hook environment.
func setHookEnv(hooks []*cdispecs.Hook) {
	for _, h := range hooks {
		if h != nil && len(h.Env) == 0 {
			h.Env = edits.HookEnv()
		}
	}
}
