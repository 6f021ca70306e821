package engineconfig

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
)

// Definition is one container engine: everything `runtime configure`,
// its help text and gantry doctor know about it. Docker, containerd and
// CRI-O are defined in docker.go, containerd.go and crio.go and registered
// by this file's init; an engine is added with one such file (and its name
// in that list), or by any package calling Register.
type Definition struct {
	// Name is the engine's --runtime value ("docker").
	Name Engine
	// Aliases are other spellings ParseEngine accepts ("cri-o").
	Aliases []string
	// Title is how people write the engine's name ("CRI-O").
	Title string
	// DefaultPath is the file configure edits when the user names none.
	DefaultPath string
	// Writes says, for `gantry runtime configure --help`, what configure
	// writes there: the text after the default path, its further lines
	// indented to line up under the first.
	Writes string
	// Program is the engine's own program (dockerd): Check runs it, and
	// doctor judges runtime programs with its PATH.
	Program string
	// CheckHelp says, for the help text, how Check has the engine read a
	// result ("crio config"); "" for none.
	CheckHelp string
	// Restart is the command that makes the engine read the file again.
	Restart string
	// Plan computes the file's new content (see the package function
	// Plan, which calls it after Options are checked and the names
	// resolved); it does no I/O. Required.
	Plan func(current []byte, opts Options, names []string) (Planned, error)
	// Parse reads what one file's content registers. Required: Plan's
	// result is read back through it.
	Parse func(data []byte) (Registered, error)
	// Read reads what the configuration at path registers as the engine
	// reads it, with the files it read (the file and its imports); nil:
	// Parse of the file alone. Doctor judges the engine with it.
	Read func(path string) (Registered, []string, error)
	// Check has the engine's program read the planned content of path
	// before it is written and returns the line saying what checked it;
	// bin is "" when the program was not found (or the check is off). A
	// result the engine would not load is an error wrapping
	// ErrEngineRejects. nil: the result is read back by Parse only.
	Check func(bin, path string, planned []byte, opts Options, names []string) (string, error)
	// Source is --config-source=command: the engine's own view of path,
	// and the note that says where it came from; bin is its program, ""
	// when not found (why says so). nil: the engine has no such command
	// and the file is read.
	Source func(bin, why, path string, current []byte) ([]byte, string, error)
}

// Planned is what an engine's Plan returns.
type Planned struct {
	Updated []byte
	// Changes has one human-readable line per change.
	Changes []string
	// Lossy is set when the file had to be re-encoded in full, dropping
	// comments and layout; Apply then keeps a backup of the original.
	Lossy bool
}

// ConfigureCommand is the command that registers Gantry's runtime with
// the engine, then its restart, as doctor's fixes print it.
func (d Definition) ConfigureCommand() string {
	return fmt.Sprintf("`gantry runtime configure --runtime %s`, then `%s`", d.Name, d.Restart)
}

var registry struct {
	sync.RWMutex
	defs []Definition
}

// Register adds an engine. It refuses a definition without a name, Plan or
// Parse, or whose name or aliases are taken.
func Register(d Definition) error {
	if d.Name == "" || d.Plan == nil || d.Parse == nil {
		return fmt.Errorf("%w: engine definition %q needs a name, Plan and Parse", ErrInvalidOptions, d.Name)
	}
	if d.Title == "" {
		d.Title = string(d.Name)
	}
	if d.Program == "" {
		d.Program = string(d.Name)
	}
	if d.Restart == "" {
		d.Restart = "systemctl restart " + string(d.Name)
	}
	registry.Lock()
	defer registry.Unlock()
	for _, s := range append([]string{string(d.Name)}, d.Aliases...) {
		if _, ok := lookupLocked(s); ok {
			return fmt.Errorf("%w: engine name %q is taken", ErrInvalidOptions, s)
		}
	}
	registry.defs = append(registry.defs, d)
	return nil
}

// Unregister removes an engine Register added: for tests that define an
// engine of their own.
func Unregister(e Engine) {
	registry.Lock()
	defer registry.Unlock()
	registry.defs = slices.DeleteFunc(registry.defs, func(d Definition) bool { return d.Name == e })
}

// The engines built in, in the order help text shows them.
func init() {
	for _, d := range []Definition{dockerDefinition, containerdDefinition, crioDefinition} {
		if err := Register(d); err != nil {
			panic(err)
		}
	}
}

// Engines lists every registered engine, in the order help text shows
// them (the order they were registered).
func Engines() []Engine {
	registry.RLock()
	defer registry.RUnlock()
	out := make([]Engine, len(registry.defs))
	for i, d := range registry.defs {
		out[i] = d.Name
	}
	return out
}

// Definitions returns every registered engine's definition, in Engines'
// order.
func Definitions() []Definition {
	registry.RLock()
	defer registry.RUnlock()
	return slices.Clone(registry.defs)
}

// Lookup returns the definition of engine e.
func Lookup(e Engine) (Definition, bool) {
	registry.RLock()
	defer registry.RUnlock()
	for _, d := range registry.defs {
		if d.Name == e {
			return d, true
		}
	}
	return Definition{}, false
}

// lookupLocked finds an engine by its name or an alias, case-insensitively.
func lookupLocked(s string) (Definition, bool) {
	s = strings.TrimSpace(s)
	for _, d := range registry.defs {
		if strings.EqualFold(s, string(d.Name)) {
			return d, true
		}
		for _, a := range d.Aliases {
			if strings.EqualFold(s, a) {
				return d, true
			}
		}
	}
	return Definition{}, false
}

// ParseEngine turns a user-supplied engine name (or an alias, such as
// "cri-o") into an Engine.
func ParseEngine(s string) (Engine, error) {
	registry.RLock()
	d, ok := lookupLocked(s)
	registry.RUnlock()
	if !ok {
		return "", unknownEngine(s)
	}
	return d.Name, nil
}

// EngineList is the registered engines' names for help text: "docker,
// containerd or crio".
func EngineList() string {
	names := Engines()
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = string(n)
	}
	return orList(s)
}

// EngineTitles is EngineList with the names people write ("Docker,
// containerd or CRI-O").
func EngineTitles() string {
	defs := Definitions()
	s := make([]string, len(defs))
	for i, d := range defs {
		s[i] = d.Title
	}
	return orList(s)
}

func orList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

func unknownEngine(s string) error {
	names := Engines()
	list := make([]string, len(names))
	for i, e := range names {
		list[i] = string(e)
	}
	return fmt.Errorf("%w %q: use one of %s", ErrUnknownEngine, s, strings.Join(list, ", "))
}

// definition is Lookup with the unknown-engine error; callers pass
// ParseEngine's result, so a raw string such as "Docker" is refused
// rather than guessed at.
func definition(e Engine) (Definition, error) {
	d, ok := Lookup(e)
	if !ok {
		return Definition{}, unknownEngine(string(e))
	}
	return d, nil
}

// DefaultPath is the file `runtime configure` edits for the engine when the
// user names none. For CRI-O it is a drop-in that gantry owns, so the
// distribution's crio.conf is never touched.
func DefaultPath(e Engine) string {
	d, _ := Lookup(e)
	return d.DefaultPath
}

// read is Definition.Read, or for an engine without one: Parse of the
// file alone.
func (d Definition) read(path string) (Registered, []string, error) {
	if d.Read != nil {
		return d.Read(path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Registered{}, nil, err
	}
	r, err := d.Parse(b)
	if err != nil {
		return Registered{}, []string{path}, fmt.Errorf("%s: %w", path, err)
	}
	return r, []string{path}, nil
}

// ReadEngine reads what the configuration of engine e at path registers
// (Definition.Read), with the files read.
func ReadEngine(e Engine, path string) (Registered, []string, error) {
	d, err := definition(e)
	if err != nil {
		return Registered{}, nil, err
	}
	return d.read(path)
}

// planned adapts a planner of this package to Definition.Plan.
func planned(f func([]byte, Options, []string) (result, error)) func([]byte, Options, []string) (Planned, error) {
	return func(current []byte, opts Options, names []string) (Planned, error) {
		r, err := f(current, opts, names)
		return Planned{Updated: r.updated, Changes: r.changes, Lossy: r.lossy}, err
	}
}
