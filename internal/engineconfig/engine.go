package engineconfig

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// Engine names a container engine whose configuration this package edits.
type Engine string

// The engines built in (docker.go, containerd.go, crio.go); Engines()
// lists every registered one.
const (
	Docker     Engine = "docker"
	Containerd Engine = "containerd"
	CRIO       Engine = "crio"
)

// Defaults used when Options leaves a field empty.
const (
	// DefaultRuntimeName is the runtime name NVIDIA's tooling registers, so
	// existing `--runtime=nvidia` and RuntimeClass handlers keep working.
	DefaultRuntimeName = "nvidia"
	// DefaultRuntimePath is where packages install the gantry runtime shim.
	DefaultRuntimePath = "/usr/bin/gantry-runtime"
)

// Sentinel errors callers can test with errors.Is.
var (
	// ErrUnknownEngine: the engine name is not one of Engines().
	ErrUnknownEngine = errors.New("unknown container engine")
	// ErrMalformed: the existing configuration file does not parse, or has a
	// shape the engine itself would reject (for example a list where a table
	// belongs). The file is never modified in this case.
	ErrMalformed = errors.New("malformed engine configuration")
	// ErrUnsupportedVersion: the containerd configuration uses a format
	// version this package does not edit (version 1, or newer than 3).
	ErrUnsupportedVersion = errors.New("unsupported containerd configuration version")
	// ErrInvalidOptions: Options is unusable (relative path, bad name).
	ErrInvalidOptions = errors.New("invalid runtime options")
)

// Options says which runtime entries to register and where they point.
type Options struct {
	// RuntimeName is the main runtime name, "nvidia" when empty; SetAsDefault
	// makes this name the engine's default.
	RuntimeName string
	// ExtraNames are registered too, with identical settings (for example
	// "gantry" beside "nvidia").
	ExtraNames []string
	// RuntimePath is the absolute path of gantry-runtime; DefaultRuntimePath
	// when empty.
	RuntimePath string
	// SetAsDefault makes RuntimeName the engine's default runtime. When false
	// the existing default is left as it is, even if it already names
	// RuntimeName: configure only adds, it never takes a choice away.
	SetAsDefault bool
	// EnableCDI turns on the engine's CDI support, so that containers can
	// ask for devices by CDI name (nvidia.com/gpu=0): Docker's
	// "features": {"cdi": true}, containerd's enable_cdi in its CRI
	// plugin. CRI-O always reads CDI specs: nothing to change there.
	EnableCDI bool
	// NVIDIAForm writes Docker's entry the way NVIDIA's `nvidia-ctk runtime
	// configure` does, for the command under that name: {"path":
	// RuntimePath, "args": []}, where RuntimePath may be a bare program
	// name that dockerd looks up on its PATH (NVIDIA's default is
	// "nvidia-container-runtime"). Other engines ignore it.
	NVIDIAForm bool

	// The fields below are Apply's and ApplyContainerdDropIn's; Plan,
	// which does no I/O, ignores them.

	// Source is where the configuration to edit is read; SourceFile when
	// empty.
	Source ConfigSource
	// EngineBinary is the engine's program (containerd, dockerd, crio)
	// whose own parser reads the result before it replaces the file, and
	// that SourceCommand runs; empty: the engine's name on PATH. When it
	// is not found, the result is checked by Gantry's reader only and the
	// change list says so (SourceCommand then fails).
	EngineBinary string
	// SkipEngineCheck leaves the engine's program out of the check; Gantry's
	// reader still reads the result back.
	SkipEngineCheck bool
}

// runtimeNamePattern keeps names usable as TOML bare keys, Docker runtime
// names and Kubernetes RuntimeClass handlers alike.
var runtimeNamePattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*$`) })

// normalize fills defaults, validates, and returns the names to register
// (main name first, duplicates dropped).
func (o Options) normalize(e Engine) (Options, []string, error) {
	if o.RuntimeName == "" {
		o.RuntimeName = DefaultRuntimeName
	}
	if o.RuntimePath == "" {
		o.RuntimePath = DefaultRuntimePath
	}
	// Under NVIDIA's form dockerd looks a bare name up on its PATH, as
	// NVIDIA's default "nvidia-container-runtime" is meant.
	bare := o.NVIDIAForm && e == Docker && !strings.Contains(o.RuntimePath, "/")
	if !bare && !filepath.IsAbs(o.RuntimePath) {
		return o, nil, fmt.Errorf("%w: runtime path %q is not absolute: pass the full path of gantry-runtime", ErrInvalidOptions, o.RuntimePath)
	}
	var names []string
	seen := map[string]bool{}
	for _, n := range append([]string{o.RuntimeName}, o.ExtraNames...) {
		if !runtimeNamePattern().MatchString(n) {
			return o, nil, fmt.Errorf("%w: runtime name %q: use letters, digits, '-' and '_' only", ErrInvalidOptions, n)
		}
		// dockerd refuses to start when daemon.json redefines its built-in runc.
		if e == Docker && n == "runc" {
			return o, nil, fmt.Errorf("%w: runtime name %q is reserved by Docker: choose another name", ErrInvalidOptions, n)
		}
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	return o, names, nil
}

// result is what every engine planner produces.
type result struct {
	updated []byte
	changes []string
	// lossy is set when the file had to be re-encoded in full, dropping
	// comments and layout; Apply then keeps a backup of the original.
	lossy bool
}

// Plan computes the new content of an engine configuration file. current is
// the existing content, nil when the file does not exist. It returns the
// updated content and one human-readable line per change; when nothing needs
// to change, updated is current itself (byte for byte) and changes is empty,
// so Plan applied to its own output is always a no-op. Plan does no I/O.
func Plan(engine Engine, current []byte, opts Options) (updated []byte, changes []string, err error) {
	r, err := plan(engine, current, opts)
	if err != nil {
		return nil, nil, err
	}
	return r.updated, r.changes, nil
}

func plan(engine Engine, current []byte, opts Options) (result, error) {
	opts, names, err := opts.normalize(engine)
	if err != nil {
		return result{}, err
	}
	d, err := definition(engine)
	if err != nil {
		return result{}, err
	}
	p, err := d.Plan(current, opts, names)
	if err != nil {
		return result{}, err
	}
	r := result{updated: p.Updated, changes: p.Changes, lossy: p.Lossy}
	if len(r.changes) == 0 {
		r.updated = current
		r.lossy = false
		return r, nil
	}
	// What was planned, read back by the one reader doctor uses too, must
	// register what was asked: a planner bug is refused, never written.
	if err := verifyPlan(engine, r.updated, opts, names); err != nil {
		return result{}, err
	}
	return r, nil
}
