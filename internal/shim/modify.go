package shim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/containerhook"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/ocibundle"
	"github.com/gantry-gpu/gantry/internal/request"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// Result says what Modify did to a bundle.
type Result struct {
	// Changed is false when the container asked for nothing: config.json
	// was not written and the root filesystem not touched.
	Changed bool
	// Source is where the request came from (env, annotations, mounts).
	Source request.Source
	// Devices are the selected devices' canonical names ("0", "1:0"), and
	// CDI the names injected from other CDI specs.
	Devices, CDI []string
	// Inventory and GPUs say whether the driver inventory and the GPU
	// list came from the cache ("cache") or were discovered ("discovery").
	Inventory, GPUs string
	// Notes are warnings and decisions worth a log line (ignored
	// capabilities, forward compatibility in use).
	Notes []string
	// Phases is where the time went, in milliseconds, for the log line.
	Phases map[string]float64
	// Edits is what was injected, named item by item in the log line at
	// log-level debug.
	Edits *edits.Edits
}

// phase records the time since *t under name and restarts the clock.
func (r *Result) phase(name string, t *time.Time) {
	now := time.Now()
	if r.Phases == nil {
		r.Phases = map[string]float64{}
	}
	r.Phases[name] += float64(now.Sub(*t).Microseconds()) / 1000
	*t = now
}

// Modify decides what the container in bundle asks for and, if anything,
// applies it: SONAME links and ld.so.cache entries inside the root
// filesystem (through root-confined paths, before runc mounts anything, so
// the loader in the container finds libcuda.so.1 by its normal rules), then
// device nodes, cgroup rules, mounts and env in config.json, rewritten
// atomically. A container that asks for nothing is not touched at all.
//
// Any error leaves config.json as it was: the caller must then not start
// the container.
func Modify(bundle string, cfg config.Config) (*Result, error) {
	clock := time.Now()
	specPath := ocibundle.SpecPath(bundle)
	raw, err := ocibundle.ReadSpec(bundle)
	if err != nil {
		return nil, err
	}
	// The request needs four fields; decoding only them keeps the common
	// case, a container without GPUs, cheap.
	var peek requestFields
	if err := json.Unmarshal(raw, &peek); err != nil {
		return nil, fmt.Errorf("%s: not an OCI runtime spec: %w", specPath, err)
	}
	if v, done := peek.Annotations[edits.InjectedAnnotation]; done {
		// Injected already (a retried create of the same bundle, or a
		// runtime chain with Gantry twice in it).
		return &Result{Notes: []string{"GPUs " + v + " already injected (annotation " + edits.InjectedAnnotation + "): left as is"}}, nil
	}
	req, err := request.Parse(request.InputFromSpec(peek.spec()), discover.RequestOptions(cfg))
	if err != nil {
		return nil, err
	}
	res := &Result{Notes: req.Warnings}
	res.phase("request", &clock)
	if !req.Wants() {
		return res, nil
	}
	res.Changed, res.Source = true, req.Source

	// The whole spec. A spec with fields this build does not know (a newer
	// runtime-spec) is merged back field by field when written, so nothing
	// of it is lost; the usual spec is simply re-encoded.
	var spec ocispecs.Spec
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	known := dec.Decode(&spec) == nil
	if !known {
		spec = ocispecs.Spec{}
		if err := json.Unmarshal(raw, &spec); err != nil {
			return nil, fmt.Errorf("%s: not an OCI runtime spec: %w", specPath, err)
		}
	}

	// Names of our own kind are device IDs; other kinds go to the CDI registry.
	others, err := ownCDINames(req, cfg.CDI.Kind)
	if err != nil {
		return nil, err
	}

	var e *edits.Edits
	var inv *driver.Inventory
	if req.Devices.Mode != request.Void {
		sys, hostInv, gpuSrc, invSrc, err := loadHost(cfg)
		if err != nil {
			return nil, err
		}
		inv = hostInv
		res.phase("host", &clock)
		res.Inventory, res.GPUs = string(invSrc), string(gpuSrc)
		if len(inv.Missing) > 0 {
			return nil, fmt.Errorf("the driver under %s is incomplete (missing %s): fix the installation or set driver-root in the Gantry configuration (%s, or the file in $%s)", inv.Root, strings.Join(inv.Missing, ", "), config.DefaultPath, config.EnvPath)
		}
		sel, err := edits.Resolve(sys, req.Devices)
		if err != nil {
			return nil, err
		}
		for _, s := range sel {
			res.Devices = append(res.Devices, s.Name())
		}
		if e, err = edits.Build(sys, inv, req, edits.Options{DevRoot: cfg.EffectiveDevRoot()}); err != nil {
			return nil, err
		}
		res.Edits = e
		res.phase("edits", &clock)
	}

	if err := modifyRootfs(bundle, &spec, e, inv, res); err != nil {
		return nil, err
	}
	res.phase("rootfs", &clock)
	if err := e.ApplyToSpecWith(&spec, edits.SpecOptions{NoCgroups: cfg.Runtime.NoCgroups}); err != nil {
		return nil, err
	}
	if e != nil || len(others) > 0 {
		if spec.Annotations == nil {
			spec.Annotations = map[string]string{}
		}
		injected := append(append([]string{}, res.Devices...), others...)
		if len(injected) == 0 {
			injected = []string{req.Devices.Mode.String()}
		}
		spec.Annotations[edits.InjectedAnnotation] = strings.Join(injected, ",")
	}
	if len(others) > 0 {
		if err := injectCDI(&spec, cfg.CDI.SpecDirs, others); err != nil {
			return nil, err
		}
		res.CDI = others
	}
	var out []byte
	if known {
		out, err = json.Marshal(&spec)
	} else {
		out, err = mergeJSON(raw, &spec)
	}
	if err != nil {
		return nil, err
	}
	if err := writeAtomic(specPath, out); err != nil {
		return nil, fmt.Errorf("writing %s: %w", specPath, err)
	}
	res.phase("spec", &clock)
	return res, nil
}

// requestFields are the parts of config.json a request is read from.
type requestFields struct {
	Process *struct {
		Env          []string `json:"env"`
		Capabilities *struct {
			Bounding []string `json:"bounding"`
		} `json:"capabilities"`
	} `json:"process"`
	Mounts      []ocispecs.Mount  `json:"mounts"`
	Annotations map[string]string `json:"annotations"`
}

func (f *requestFields) spec() *ocispecs.Spec {
	s := &ocispecs.Spec{Mounts: f.Mounts, Annotations: f.Annotations}
	if f.Process != nil {
		s.Process = &ocispecs.Process{Env: f.Process.Env}
		if f.Process.Capabilities != nil {
			s.Process.Capabilities = &ocispecs.LinuxCapabilities{Bounding: f.Process.Capabilities.Bounding}
		}
	}
	return s
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

// modifyRootfs makes the changes that must land in the image's root
// filesystem: the SONAME links beside the libraries runc will mount, and
// ld.so.cache entries for them (the image's CUDA forward-compatibility
// libraries first when they are newer than the host driver).
func modifyRootfs(bundle string, spec *ocispecs.Spec, e *edits.Edits, inv *driver.Inventory, res *Result) error {
	if e == nil || (len(e.Symlinks) == 0 && len(e.LibraryDirs) == 0) {
		return nil
	}
	if spec.Root == nil || spec.Root.Path == "" {
		return errors.New("config.json has no root.path: cannot add the driver libraries to the container's loader cache")
	}
	rootPath := spec.Root.Path
	if !filepath.IsAbs(rootPath) {
		rootPath = filepath.Join(bundle, rootPath)
	}
	root, err := rootfs.Open(rootPath)
	if err != nil {
		return fmt.Errorf("opening the container's root filesystem: %w", err)
	}
	defer root.Close()
	root.SkipSync()
	return containerhook.ApplyEdits(root, e, inv, true, func(s string) { res.Notes = append(res.Notes, s) })
}

// injectCDI resolves CDI names of other vendors through the CDI registry.
//
// A hook of those specs that has no env of its own gets edits.HookEnv
// before it is injected: runc and crun run a createContainer hook whose env
// is empty with the container's process.env, so a spec written without one
// (by another vendor's tool, or by an older gantry) would hand the image's
// LD_PRELOAD to a root process that still sees the host. A hook that has an
// env keeps it: the spec's author chose it.
func injectCDI(spec *ocispecs.Spec, dirs []string, names []string) error {
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	for _, n := range names {
		// The cache is this call's own: its devices can be edited in place.
		if d := cache.GetDevice(n); d != nil {
			setHookEnv(d.ContainerEdits.Hooks)
			setHookEnv(d.GetSpec().ContainerEdits.Hooks)
		}
	}
	if unresolved, err := cache.InjectDevices(spec, names...); err != nil {
		if len(unresolved) > 0 {
			return fmt.Errorf("CDI devices %s are not in any spec under %s: generate one (gantry cdi generate) or fix the names", strings.Join(unresolved, ", "), strings.Join(dirs, ", "))
		}
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

// mergeJSON serialises spec over the original config.json so that fields
// this build's runtime-spec types do not know (a newer spec version's) are
// kept: objects are merged key by key, spec's values winning.
func mergeJSON(orig []byte, spec *ocispecs.Spec) ([]byte, error) {
	typed, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	// Numbers stay json.Number: uids, device numbers and memory limits do
	// not survive a trip through float64.
	o, err := decodeNumbers(orig)
	if err != nil {
		return nil, err
	}
	t, err := decodeNumbers(typed)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(merge(o, t)); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func decodeNumbers(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

func merge(orig, typed any) any {
	om, ok1 := orig.(map[string]any)
	tm, ok2 := typed.(map[string]any)
	if !ok1 || !ok2 {
		return typed
	}
	for k, v := range tm {
		om[k] = merge(om[k], v)
	}
	return om
}

// writeAtomic replaces p with data through a temporary file in the same
// directory, keeping p's permissions.
func writeAtomic(p string, data []byte) error {
	mode := os.FileMode(0o644)
	if st, err := os.Stat(p); err == nil {
		mode = st.Mode().Perm()
	}
	// No fsync: the bundle is rewritten on every create, in the hot path.
	return atomicfile.Write(p, data, atomicfile.Options{Mode: mode})
}
