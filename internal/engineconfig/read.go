package engineconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// CRIOMainConfig is CRI-O's own configuration file, which configure never
// edits (it writes the drop-in DefaultPath(CRIO) in CRIODropinDir); CRI-O
// reads it first, then every drop-in in name order.
const CRIOMainConfig = "/etc/crio/crio.conf"

// CRIODropinDir is the directory of CRI-O's drop-ins, the one holding
// DefaultPath(CRIO).
func CRIODropinDir() string { return filepath.Dir(DefaultPath(CRIO)) }

// Runtime is one runtime an engine's configuration registers.
type Runtime struct {
	Name string
	// Program is what the engine runs for it: Docker's "path",
	// containerd's options.BinaryName (runc when unset, the runc shim's
	// default), CRI-O's runtime_path (the runtime's name, which CRI-O looks
	// up on PATH, when unset).
	Program string
}

// Registered is what an engine's configuration registers, read as the
// engine reads it. Read, ReadCRIO and Parse fill it; Plan's result is
// checked against it, so what configure writes and what doctor reads are
// judged by the same reader.
type Registered struct {
	// Runtimes are sorted by name.
	Runtimes []Runtime
	// DefaultRuntime is Docker's default-runtime, containerd's CRI
	// default_runtime_name, CRI-O's crio.runtime.default_runtime; "" when
	// unset (the engine's built-in default, runc or crun).
	DefaultRuntime string
	// CDI says the engine reads CDI specs: Docker's features.cdi,
	// containerd's CRI enable_cdi (as set in the file), always for CRI-O.
	CDI bool
	// CRIDisabled is the disabled_plugins entry (quoted) that turns
	// containerd's CRI plugin off, as Docker CE's config.toml does; "" when
	// it is on. Always "" for the other engines.
	CRIDisabled string
	// Root is containerd's root directory (its top-level `root`; an
	// import's replaces the main file's), "" when unset (containerd's
	// default, /var/lib/containerd). Always "" for the other engines.
	Root string
}

// Runtime returns the registered runtime named name.
func (r Registered) Runtime(name string) (Runtime, bool) {
	for _, rt := range r.Runtimes {
		if rt.Name == name {
			return rt, true
		}
	}
	return Runtime{}, false
}

// Read reads the configuration of engine e at path (Definition.Read:
// containerd's with its imports). A missing file is an error wrapping fs.ErrNotExist; one that does
// not parse wraps ErrMalformed. Errors name the file. CRI-O's
// configuration is several files: use ReadCRIO.
func Read(e Engine, path string) (Registered, error) {
	if e == CRIO {
		return Registered{}, fmt.Errorf("%w: CRI-O's configuration is a main file and drop-ins: use ReadCRIO", ErrInvalidOptions)
	}
	r, _, err := ReadEngine(e, path)
	return r, err
}

// ImportError is a file that a containerd configuration's `imports` names
// and that cannot be read or does not parse (containerd will not start
// with it), or an import pattern that does not expand.
type ImportError struct {
	// File is the imported file (or the pattern).
	File string
	// ImportedBy is the configuration whose imports name it.
	ImportedBy string
	Err        error
}

func (e *ImportError) Error() string {
	return fmt.Sprintf("%s (imported by %s): %v", e.File, e.ImportedBy, e.Err)
}

func (e *ImportError) Unwrap() error { return e.Err }

// ReadContainerd reads containerd's config.toml at path and the files its
// `imports` name, as containerd resolves them: a relative path against
// path's directory, a pattern expanded by filepath.Glob (in name order),
// a missing file skipped. NVIDIA's toolkit (1.17 and later) and
// ApplyContainerdDropIn put the runtime in such a drop-in. An imported
// file's runtime of the same name wins, as does a default runtime it
// sets; CDI is on when any file turns it on. Imports of imported files
// are not followed. It returns the files read, path first. A missing path
// is an error wrapping fs.ErrNotExist; a path that does not parse wraps
// ErrMalformed (or ErrUnsupportedVersion); an import that cannot be read
// or does not parse is an *ImportError.
func ReadContainerd(path string) (Registered, []string, error) {
	return readContainerd(path, nil)
}

// readContainerd is ReadContainerd with planned contents: a file in
// planned is read from there (and found by an import pattern even when it
// does not exist yet) instead of from disk.
func readContainerd(path string, planned map[string][]byte) (Registered, []string, error) {
	read := func(p string) ([]byte, error) {
		if b, ok := planned[p]; ok {
			return b, nil
		}
		return os.ReadFile(p)
	}
	b, err := read(path)
	if err != nil {
		return Registered{}, nil, err
	}
	out, err := parseContainerd(b)
	if err != nil {
		return Registered{}, nil, fmt.Errorf("%s: %w", path, err)
	}
	files := []string{path}
	doc, _ := decodeTOML(b) // parsed above
	list, _ := doc["imports"].([]any)
	if len(list) == 0 {
		return out, files, nil
	}
	byName := map[string]string{}
	for _, rt := range out.Runtimes {
		byName[rt.Name] = rt.Program
	}
	for _, v := range list {
		p, _ := v.(string)
		if p == "" {
			continue
		}
		if !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(path), p)
		}
		paths := []string{p}
		if strings.ContainsAny(p, "*?[") {
			m, err := filepath.Glob(p)
			if err != nil {
				return Registered{}, files, &ImportError{File: p, ImportedBy: path, Err: fmt.Errorf("%w: not a valid pattern: %v", ErrMalformed, err)}
			}
			for f := range planned {
				if ok, _ := filepath.Match(p, f); ok && !slices.Contains(m, f) {
					m = append(m, f)
				}
			}
			sort.Strings(m)
			paths = m
		}
		for _, ip := range paths {
			b, err := read(ip)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return Registered{}, files, &ImportError{File: ip, ImportedBy: path, Err: err}
			}
			im, err := parseContainerd(b)
			if err != nil {
				return Registered{}, files, &ImportError{File: ip, ImportedBy: path, Err: err}
			}
			files = append(files, ip)
			for _, rt := range im.Runtimes {
				byName[rt.Name] = rt.Program
			}
			if im.DefaultRuntime != "" {
				out.DefaultRuntime = im.DefaultRuntime
			}
			out.CDI = out.CDI || im.CDI
			if im.Root != "" {
				out.Root = im.Root
			}
			if out.CRIDisabled == "" {
				out.CRIDisabled = im.CRIDisabled
			}
		}
	}
	out.Runtimes = sortedRuntimes(byName)
	return out, files, nil
}

// ReadCRIO reads CRI-O's main file and every file in its drop-in
// directory, in name order, as CRI-O merges them (a later file's runtime
// entry or default replaces an earlier one). It returns the files read.
// When neither exists the error wraps fs.ErrNotExist.
func ReadCRIO(mainFile, dropinDir string) (Registered, []string, error) {
	var files []string
	if _, err := os.Stat(mainFile); err == nil {
		files = append(files, mainFile)
	}
	entries, _ := os.ReadDir(dropinDir)
	for _, e := range entries {
		if !e.IsDir() {
			files = append(files, filepath.Join(dropinDir, e.Name()))
		}
	}
	if len(files) == 0 {
		return Registered{}, nil, fmt.Errorf("neither %s nor %s exist: %w", mainFile, dropinDir, fs.ErrNotExist)
	}
	byName := map[string]string{}
	out := Registered{CDI: true}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return Registered{}, files, err
		}
		doc, err := decodeTOML(b)
		if err != nil {
			return Registered{}, files, fmt.Errorf("%s: %w", f, err)
		}
		for name, v := range table(doc, "crio", "runtime", "runtimes") {
			rt, _ := v.(map[string]any)
			p, _ := rt["runtime_path"].(string)
			if p == "" {
				p = name // CRI-O looks the runtime's name up in PATH
			}
			byName[name] = p
		}
		if d, ok := table(doc, "crio", "runtime")["default_runtime"].(string); ok {
			out.DefaultRuntime = d
		}
	}
	out.Runtimes = sortedRuntimes(byName)
	return out, files, nil
}

// Parse reads one configuration file's content. Empty content is an
// empty configuration. For CRI-O it reads one file (a drop-in); ReadCRIO
// merges them all.
func Parse(e Engine, data []byte) (Registered, error) {
	d, err := definition(e)
	if err != nil {
		return Registered{}, err
	}
	return d.Parse(data)
}

// parseCRIO reads one CRI-O file (a drop-in); ReadCRIO merges them all.
func parseCRIO(data []byte) (Registered, error) {
	doc, err := decodeTOML(data)
	if err != nil {
		return Registered{}, err
	}
	byName := map[string]string{}
	for name, v := range table(doc, "crio", "runtime", "runtimes") {
		rt, _ := v.(map[string]any)
		p, _ := rt["runtime_path"].(string)
		if p == "" {
			p = name
		}
		byName[name] = p
	}
	d, _ := table(doc, "crio", "runtime")["default_runtime"].(string)
	return Registered{Runtimes: sortedRuntimes(byName), DefaultRuntime: d, CDI: true}, nil
}

func parseDocker(data []byte) (Registered, error) {
	var doc struct {
		Runtimes       map[string]struct{ Path string } `json:"runtimes"`
		DefaultRuntime string                           `json:"default-runtime"`
		Features       map[string]bool                  `json:"features"`
	}
	if len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, &doc); err != nil {
			return Registered{}, jsonSyntaxError(data, err)
		}
	}
	byName := map[string]string{}
	for name, r := range doc.Runtimes {
		byName[name] = r.Path
	}
	return Registered{Runtimes: sortedRuntimes(byName), DefaultRuntime: doc.DefaultRuntime, CDI: doc.Features["cdi"]}, nil
}

// containerdCRIPlugin is the plugin that holds the CRI runtimes in each
// config version: containerd reads no other.
func containerdCRIPlugin(doc tomlDoc) (string, error) {
	switch v := doc["version"].(type) {
	case nil:
		return "cri", nil // version 1, containerd 1.x's original format
	case int64:
		if v == 1 {
			return "cri", nil
		}
		return criPluginFor(v)
	default:
		return "", fmt.Errorf("%w: version must be an integer, found %v", ErrMalformed, v)
	}
}

func parseContainerd(data []byte) (Registered, error) {
	doc, err := decodeTOML(data)
	if err != nil {
		return Registered{}, err
	}
	plugin, err := containerdCRIPlugin(doc)
	if err != nil {
		return Registered{}, err
	}
	var out Registered
	byName := map[string]string{}
	cri := table(table(doc, "plugins"), plugin)
	for name, v := range table(cri, "containerd", "runtimes") {
		rt, _ := v.(map[string]any)
		bin, _ := table(rt, "options")["BinaryName"].(string)
		if bin == "" {
			bin = "runc"
		}
		byName[name] = bin
	}
	out.DefaultRuntime, _ = table(cri, "containerd")["default_runtime_name"].(string)
	out.CDI, _ = cri["enable_cdi"].(bool)
	out.Root, _ = doc["root"].(string)
	out.Runtimes = sortedRuntimes(byName)
	list, _ := doc["disabled_plugins"].([]any)
	for _, v := range list {
		if p, _ := v.(string); p == "cri" || p == "io.containerd.grpc.v1.cri" || p == "io.containerd.cri.v1.runtime" {
			out.CRIDisabled = fmt.Sprintf("%q", p)
			break
		}
	}
	return out, nil
}

// ParseContainerdStatus reads the running containerd's CRI configuration
// as its CRI service reports it (the "config" JSON of a verbose Status):
// the runtimes it registered, its default runtime, enable_cdi and
// containerd's root (containerdRootDir, its --root or config's root). An
// answer without containerd's configuration (CRI-O's, say) is an error.
func ParseContainerdStatus(config []byte) (Registered, error) {
	var cfg struct {
		EnableCDI  bool   `json:"enableCDI"`
		Root       string `json:"containerdRootDir"`
		Containerd *struct {
			DefaultRuntimeName string `json:"defaultRuntimeName"`
			Runtimes           map[string]struct {
				Options map[string]any `json:"options"`
			} `json:"runtimes"`
		} `json:"containerd"`
	}
	if err := json.Unmarshal(config, &cfg); err != nil || cfg.Containerd == nil {
		return Registered{}, errors.New("no containerd configuration in the CRI status")
	}
	byName := map[string]string{}
	for name, r := range cfg.Containerd.Runtimes {
		bin, _ := r.Options["BinaryName"].(string)
		if bin == "" {
			bin = "runc"
		}
		byName[name] = bin
	}
	return Registered{Runtimes: sortedRuntimes(byName), DefaultRuntime: cfg.Containerd.DefaultRuntimeName, CDI: cfg.EnableCDI, Root: cfg.Root}, nil
}

func sortedRuntimes(byName map[string]string) []Runtime {
	out := make([]Runtime, 0, len(byName))
	for n, p := range byName {
		out = append(out, Runtime{Name: n, Program: p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// table walks nested TOML tables; nil when one is missing.
func table(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return m
}

// verifyPlan reads the planned content back as the engine would and
// checks it registers what was asked: every name runs opts.RuntimePath,
// the default when SetAsDefault, CDI when EnableCDI.
func verifyPlan(e Engine, updated []byte, opts Options, names []string) error {
	got, err := Parse(e, updated)
	if err != nil {
		return fmt.Errorf("the planned %s configuration does not read back: %w", e, err)
	}
	return verifyRegistered(e, got, opts, names)
}

// verifyRegistered checks that got, a configuration read back, registers
// what was asked: every name runs opts.RuntimePath, the default when
// SetAsDefault, CDI when EnableCDI.
func verifyRegistered(e Engine, got Registered, opts Options, names []string) error {
	for _, n := range names {
		if rt, ok := got.Runtime(n); !ok || rt.Program != opts.RuntimePath {
			return fmt.Errorf("the planned %s configuration does not register runtime %q as %s (read back: %+v)", e, n, opts.RuntimePath, got.Runtimes)
		}
	}
	if opts.SetAsDefault && got.DefaultRuntime != opts.RuntimeName {
		return fmt.Errorf("the planned %s configuration's default runtime is %q, not %q", e, got.DefaultRuntime, opts.RuntimeName)
	}
	if opts.EnableCDI && !got.CDI {
		return fmt.Errorf("the planned %s configuration does not enable CDI", e)
	}
	return nil
}
