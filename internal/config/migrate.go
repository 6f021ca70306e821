package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
)

// NVIDIADefaultPath is where NVIDIA's container toolkit keeps its
// configuration (nvidia-ctk config default writes it there; the runtime, the
// hook and nvidia-ctk read it).
const NVIDIADefaultPath = "/etc/nvidia-container-runtime/config.toml"

// NVIDIAEnvPath is the environment variable with which NVIDIA's toolkit
// names another configuration file.
const NVIDIAEnvPath = "NVIDIA_CTK_CONFIG_FILE_PATH"

// NoteKind says what became of one key of NVIDIA's configuration.
type NoteKind int

const (
	// Mapped: carried over to a Gantry key.
	Mapped NoteKind = iota
	// Ignored: Gantry has no such setting and needs none; with this value
	// containers get what they got with NVIDIA's toolkit.
	Ignored
	// Unsupported: the value asks for something Gantry does not do, so a
	// container may get something else than it did; the reason says what to
	// do instead. These are worth reading before switching.
	Unsupported
	// Unknown: not a key of NVIDIA's toolkit (a typo, or a newer key).
	Unknown
)

func (k NoteKind) String() string {
	switch k {
	case Mapped:
		return "mapped"
	case Ignored:
		return "ignored"
	case Unsupported:
		return "unsupported"
	}
	return "unknown"
}

// Note is what became of one key of NVIDIA's file.
type Note struct {
	Key    string   // NVIDIA's key, dotted: nvidia-container-cli.root
	Value  string   // its value as TOML writes it
	Kind   NoteKind //
	To     string   // the Gantry key it was carried over to (Mapped)
	Reason string   // why it was not carried over, or how it was
}

// Migration is NVIDIA's configuration translated.
type Migration struct {
	// Config is the equivalent Gantry configuration: the defaults with every
	// mapped key applied. It passes Validate.
	Config Config
	// Notes has one entry per key found in the file, in the order of
	// NVIDIA's default file.
	Notes []Note
}

// MigrateOptions are what the migration asks of the host.
type MigrateOptions struct {
	// LookPath finds a low-level runtime candidate of
	// nvidia-container-runtime.runtimes, as NVIDIA's runtime does (an
	// absolute path as is, a name in PATH). Nil: the first candidate that
	// is not a GPU runtime itself is taken without looking.
	LookPath func(name string) (string, error)
}

// nvidiaCapabilities are the driver capabilities NVIDIA's toolkit knows;
// Gantry serves them all.
var nvidiaCapabilities = []string{"compat32", "compute", "display", "graphics", "ngx", "utility", "video"}

// gpuRuntimes are the names of runtimes that would exec themselves if
// taken as the low-level runtime.
var gpuRuntimes = map[string]bool{"nvidia-container-runtime": true, "nvidia-container-runtime.cdi": true,
	"nvidia-container-runtime.legacy": true, "gantry-runtime": true, "gantry": true}

// keyOrder is the order of NVIDIA's default file (nvidia-ctk config
// default), in which notes are listed; keys not in it come after, sorted.
var keyOrder = []string{
	"accept-nvidia-visible-devices-as-volume-mounts",
	"accept-nvidia-visible-devices-envvar-when-unprivileged",
	"disable-require",
	"supported-driver-capabilities",
	"swarm-resource",
	"nvidia-container-cli.debug",
	"nvidia-container-cli.environment",
	"nvidia-container-cli.ldcache",
	"nvidia-container-cli.ldconfig",
	"nvidia-container-cli.load-kmods",
	"nvidia-container-cli.no-cgroups",
	"nvidia-container-cli.no-pivot",
	"nvidia-container-cli.path",
	"nvidia-container-cli.root",
	"nvidia-container-cli.user",
	"nvidia-container-runtime.debug",
	"nvidia-container-runtime.log-level",
	"nvidia-container-runtime.mode",
	"nvidia-container-runtime.runtimes",
	"nvidia-container-runtime.modes.cdi.annotation-prefixes",
	"nvidia-container-runtime.modes.cdi.default-kind",
	"nvidia-container-runtime.modes.cdi.spec-dirs",
	"nvidia-container-runtime.modes.csv.mount-spec-path",
	"nvidia-container-runtime.modes.legacy.cuda-compat-mode",
	"nvidia-container-runtime-hook.path",
	"nvidia-container-runtime-hook.skip-mode-detection",
	"nvidia-ctk.path",
}

// MigrateNVIDIA translates the contents of NVIDIA's container toolkit
// config.toml (any version: the 1.x files with commented defaults and what
// nvidia-ctk config default prints) into a Gantry configuration. Keys it does
// not know are listed as Unknown, not refused. A file that is not TOML, or a
// known key with a value of the wrong type, is an error.
func MigrateNVIDIA(b []byte, opts MigrateOptions) (*Migration, error) {
	tree := map[string]any{}
	if err := toml.Unmarshal(b, &tree); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return nil, fmt.Errorf("line %d, column %d: %s (not valid TOML; fix the file or pass another one)", row, col, de.Error())
		}
		return nil, err
	}
	flat := map[string]any{}
	flatten("", tree, flat)

	m := &migrator{flat: flat, done: map[string]bool{}, c: Default(), opts: opts}
	if err := m.run(); err != nil {
		return nil, err
	}
	for k := range flat {
		if !m.done[k] {
			m.note(Note{Key: k, Kind: Unknown, Reason: "not a key of NVIDIA's container toolkit as Gantry knows it; left out"})
		}
	}
	rank := map[string]int{}
	for i, k := range keyOrder {
		rank[k] = i + 1
	}
	sort.SliceStable(m.notes, func(i, j int) bool {
		ri, rj := rank[m.notes[i].Key], rank[m.notes[j].Key]
		if ri == 0 && rj == 0 {
			return m.notes[i].Key < m.notes[j].Key
		}
		if ri == 0 || rj == 0 {
			return ri != 0
		}
		return ri < rj
	})
	if err := m.c.Validate(); err != nil {
		return nil, fmt.Errorf("the migrated configuration is invalid: %w", err)
	}
	return &Migration{Config: m.c, Notes: m.notes}, nil
}

// flatten turns nested tables into dotted keys. Empty tables
// ([nvidia-container-runtime.modes]) leave no key.
func flatten(prefix string, t map[string]any, out map[string]any) {
	for k, v := range t {
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		if sub, ok := v.(map[string]any); ok {
			flatten(key, sub, out)
			continue
		}
		out[key] = v
	}
}

type migrator struct {
	flat  map[string]any
	done  map[string]bool
	notes []Note
	c     Config
	opts  MigrateOptions
}

func (m *migrator) note(n Note) {
	if n.Value == "" {
		if v, ok := m.flat[n.Key]; ok {
			n.Value = tomlValue(v)
		}
	}
	m.notes = append(m.notes, n)
}

// tomlValue renders one value as it would appear in a TOML file.
func tomlValue(v any) string {
	b, err := toml.Marshal(map[string]any{"v": v})
	if err != nil {
		return fmt.Sprint(v)
	}
	s := strings.TrimSpace(string(b))
	return strings.TrimPrefix(s, "v = ")
}

func typeErr(key string, v any, want string) error {
	return fmt.Errorf("key %s = %s: want %s (fix the value or remove the line)", key, tomlValue(v), want)
}

// str, boolean and list fetch a key, marking it handled; ok is false when
// the file does not set it.
func (m *migrator) str(key string) (string, bool, error) {
	v, ok := m.flat[key]
	if !ok {
		return "", false, nil
	}
	m.done[key] = true
	s, isStr := v.(string)
	if !isStr {
		return "", false, typeErr(key, v, "a string")
	}
	return s, true, nil
}

func (m *migrator) boolean(key string) (bool, bool, error) {
	v, ok := m.flat[key]
	if !ok {
		return false, false, nil
	}
	m.done[key] = true
	b, isBool := v.(bool)
	if !isBool {
		return false, false, typeErr(key, v, "true or false")
	}
	return b, true, nil
}

func (m *migrator) list(key string) ([]string, bool, error) {
	v, ok := m.flat[key]
	if !ok {
		return nil, false, nil
	}
	m.done[key] = true
	arr, isArr := v.([]any)
	if !isArr {
		return nil, false, typeErr(key, v, "a list of strings")
	}
	out := make([]string, 0, len(arr))
	for _, e := range arr {
		s, isStr := e.(string)
		if !isStr {
			return nil, false, typeErr(key, v, "a list of strings")
		}
		out = append(out, s)
	}
	return out, true, nil
}

// ignore marks a key handled with a note of kind k, when the file sets it.
func (m *migrator) ignore(key string, k NoteKind, reason string) {
	if _, ok := m.flat[key]; !ok {
		return
	}
	m.done[key] = true
	m.note(Note{Key: key, Kind: k, Reason: reason})
}

func (m *migrator) run() error {
	steps := []func() error{m.topLevel, m.cli, m.runtime, m.modes, m.hookAndCTK}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	// Feature gates of newer toolkits, and keys of older ones.
	for key := range m.flat {
		name, ok := strings.CutPrefix(key, "features.")
		if !ok {
			continue
		}
		on, _, err := m.boolean(key)
		if err != nil {
			return err
		}
		if !on {
			m.note(Note{Key: key, Kind: Ignored, Reason: "an NVIDIA feature gate, off; Gantry has no feature gates"})
			continue
		}
		k, reason := featureNote(name)
		m.note(Note{Key: key, Kind: k, Reason: reason})
	}
	m.ignore("nvidia-container-runtime.experimental", Ignored, "an option of NVIDIA's 1.x runtime, since removed; Gantry has nothing like it")
	m.ignore("nvidia-container-runtime.discover-mode", Ignored, "an option of NVIDIA's 1.x runtime (now mode); Gantry has one mode")
	return nil
}

// featureNote says what an NVIDIA feature gate that is on becomes.
func featureNote(name string) (NoteKind, string) {
	switch name {
	case "allow-ldconfig-from-container":
		return Ignored, "Gantry never runs ldconfig, the container's or the host's: it writes the container's ld.so.cache itself"
	case "allow-cuda-compat-libs-from-container", "disable-cuda-compat-lib-hook":
		return Unsupported, "Gantry always puts the image's CUDA forward compatibility libraries first when they are newer than the driver, in-process; there is no switch"
	case "disable-imex-channel-creation", "ignore-imex-channel-requests":
		return Ignored, "Gantry does not serve IMEX channel requests at all (NVIDIA_IMEX_CHANNELS is not read)"
	case "no-additional-gids-for-device-nodes":
		return Ignored, "Gantry adds no supplementary groups for device nodes"
	case "allow-unknown-oci-spec-fields":
		return Ignored, "Gantry keeps fields of the OCI spec it does not know as they are; there is no switch"
	}
	return Unsupported, "an NVIDIA feature gate Gantry has no equivalent for"
}

func (m *migrator) topLevel() error {
	if v, ok, err := m.boolean("accept-nvidia-visible-devices-envvar-when-unprivileged"); err != nil {
		return err
	} else if ok {
		m.c.Runtime.AcceptEnvUnprivileged = v
		m.note(Note{Key: "accept-nvidia-visible-devices-envvar-when-unprivileged", Kind: Mapped, To: "runtime.accept-env-unprivileged"})
	}
	if v, ok, err := m.boolean("accept-nvidia-visible-devices-as-volume-mounts"); err != nil {
		return err
	} else if ok {
		m.c.Runtime.AcceptVolumeMounts = v
		m.note(Note{Key: "accept-nvidia-visible-devices-as-volume-mounts", Kind: Mapped, To: "runtime.accept-volume-mounts"})
	}
	if v, ok, err := m.boolean("disable-require"); err != nil {
		return err
	} else if ok {
		m.c.Runtime.DisableRequire = v
		m.note(Note{Key: "disable-require", Kind: Mapped, To: "runtime.disable-require"})
	}
	if v, ok, err := m.str("supported-driver-capabilities"); err != nil {
		return err
	} else if ok {
		var missing []string
		caps := map[string]bool{}
		for _, c := range strings.Split(v, ",") {
			caps[strings.TrimSpace(c)] = true
		}
		for _, c := range nvidiaCapabilities {
			if !caps[c] && !caps["all"] {
				missing = append(missing, c)
			}
		}
		if len(missing) == 0 {
			m.note(Note{Key: "supported-driver-capabilities", Kind: Ignored, Reason: "every capability, as Gantry serves"})
		} else {
			m.note(Note{Key: "supported-driver-capabilities", Kind: Unsupported, Reason: fmt.Sprintf("Gantry has no host-wide capability filter: containers asking for %s get it, where NVIDIA's hook refused them", strings.Join(missing, ", "))})
		}
	}
	if v, ok, err := m.str("swarm-resource"); err != nil {
		return err
	} else if ok {
		// NVIDIA's value is one string of comma-separated variable names.
		names := []string{}
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
		m.c.Runtime.SwarmResource = names
		m.note(Note{Key: "swarm-resource", Kind: Mapped, To: "runtime.swarm-resource"})
	}
	return nil
}

func (m *migrator) cli() error {
	if v, ok, err := m.str("nvidia-container-cli.root"); err != nil {
		return err
	} else if ok && v != "" {
		if !filepath.IsAbs(v) {
			return fmt.Errorf("key nvidia-container-cli.root = %q: not an absolute path (fix it, e.g. \"/\" or \"/run/nvidia/driver\")", v)
		}
		m.c.DriverRoot = filepath.Clean(v)
		m.note(Note{Key: "nvidia-container-cli.root", Kind: Mapped, To: "driver-root", Reason: "Gantry looks for the device nodes under it too: if the driver makes them in the host's /dev, add dev-root = '/'"})
	} else if ok {
		m.note(Note{Key: "nvidia-container-cli.root", Kind: Ignored, Reason: "empty: the driver is under /, Gantry's default"})
	}
	// Both NVIDIA's runtime and its CLI have a debug log file; Gantry's
	// runtime.log-file is the one log of the container front ends, so the
	// runtime's wins when both name a file.
	var logFrom string
	for _, key := range []string{"nvidia-container-runtime.debug", "nvidia-container-cli.debug"} {
		v, ok, err := m.str(key)
		if err != nil {
			return err
		}
		switch {
		case !ok:
		case v == "" || v == "/dev/null":
			m.note(Note{Key: key, Kind: Ignored, Reason: "no log file, Gantry's default (runtime.log-file = '')"})
		case !filepath.IsAbs(v):
			return fmt.Errorf("key %s = %q: not an absolute path (fix it or remove the line)", key, v)
		case logFrom == "":
			m.c.Runtime.LogFile = v
			logFrom = key
			m.note(Note{Key: key, Kind: Mapped, To: "runtime.log-file", Reason: "one line per container gantry-runtime or gantry-hook handles"})
		default:
			m.note(Note{Key: key, Kind: Ignored, Reason: fmt.Sprintf("Gantry has one log file for its container front ends, taken from %s", logFrom)})
		}
	}
	m.ignore("nvidia-container-cli.environment", Ignored, "the environment of the nvidia-container-cli process; Gantry runs no such process")
	m.ignore("nvidia-container-cli.path", Ignored, "Gantry runs no nvidia-container-cli: gantry-runtime and gantry-hook compute and apply the edits in-process (gantry itself answers to the name nvidia-container-cli, for LXC)")
	if v, ok, err := m.str("nvidia-container-cli.ldcache"); err != nil {
		return err
	} else if ok {
		if v == "" || filepath.Clean(v) == filepath.Join(m.c.DriverRoot, "etc/ld.so.cache") {
			m.note(Note{Key: "nvidia-container-cli.ldcache", Kind: Ignored, Reason: "Gantry reads driver-root's etc/ld.so.cache itself (both formats), never running ldconfig"})
		} else {
			m.note(Note{Key: "nvidia-container-cli.ldcache", Kind: Unsupported, Reason: "Gantry reads the ld.so.cache under driver-root (etc/ld.so.cache) only; name the driver's library directories in library-search-paths if it finds none"})
		}
	}
	m.ignore("nvidia-container-cli.ldconfig", Ignored, "Gantry never runs ldconfig: it writes the container's ld.so.cache itself, through root-confined paths")
	m.ignore("nvidia-container-cli.load-kmods", Ignored, "Gantry never loads kernel modules (as load-kmods = false): load them at boot (the driver's packages or driver container do; modprobe nvidia nvidia-uvm)")
	if v, ok, err := m.boolean("nvidia-container-cli.no-cgroups"); err != nil {
		return err
	} else if ok {
		m.c.Runtime.NoCgroups = v
		m.note(Note{Key: "nvidia-container-cli.no-cgroups", Kind: Mapped, To: "runtime.no-cgroups", Reason: "gantry-hook leaves the device cgroup alone and gantry-runtime adds no device cgroup rules (rootless engines)"})
	}
	m.ignore("nvidia-container-cli.user", Ignored, "the user NVIDIA's CLI ran as; Gantry runs no separate process and works as the runtime's own user")
	m.ignore("nvidia-container-cli.no-pivot", Ignored, "Gantry never enters the container's root with pivot_root; it works through root-confined paths")
	return nil
}

func (m *migrator) runtime() error {
	if v, ok, err := m.str("nvidia-container-runtime.log-level"); err != nil {
		return err
	} else if ok {
		var level string
		switch strings.ToLower(v) {
		case "trace", "debug":
			level = "debug"
		case "info":
			level = "info"
		case "warn", "warning":
			level = "warn"
		case "error", "fatal", "panic":
			level = "error"
		default:
			return fmt.Errorf("key nvidia-container-runtime.log-level = %q: not a log level (use trace, debug, info, warning, error, fatal or panic)", v)
		}
		m.c.LogLevel = level
		m.note(Note{Key: "nvidia-container-runtime.log-level", Kind: Mapped, To: "log-level"})
	}
	if v, ok, err := m.list("nvidia-container-runtime.runtimes"); err != nil {
		return err
	} else if ok {
		low, reason := m.lowLevel(v)
		if low != "" {
			m.c.Runtime.LowLevel = low
			m.note(Note{Key: "nvidia-container-runtime.runtimes", Kind: Mapped, To: "runtime.low-level", Reason: reason})
		} else {
			m.note(Note{Key: "nvidia-container-runtime.runtimes", Kind: Ignored, Reason: reason})
		}
	}
	if v, ok, err := m.str("nvidia-container-runtime.mode"); err != nil {
		return err
	} else if ok {
		switch v {
		case "", "auto", "legacy", "cdi", "jit-cdi":
			m.note(Note{Key: "nvidia-container-runtime.mode", Kind: Ignored, Reason: "Gantry has one mode: gantry-runtime serves NVIDIA_VISIBLE_DEVICES, CDI annotations and device volume mounts alike, from the edits it caches"})
		case "csv":
			m.note(Note{Key: "nvidia-container-runtime.mode", Kind: Unsupported, Reason: "CSV mode (Jetson/Tegra integrated GPUs) is not supported: Gantry serves discrete GPUs with NVML's device nodes"})
		default:
			m.note(Note{Key: "nvidia-container-runtime.mode", Kind: Unsupported, Reason: "not a mode of NVIDIA's runtime (auto, legacy, cdi, jit-cdi, csv); Gantry has one mode"})
		}
	}
	return nil
}

// lowLevel picks runtime.low-level from NVIDIA's candidate list: as NVIDIA's
// runtime does, the first that is found (absolute paths as given), skipping
// GPU runtimes that would run themselves.
func (m *migrator) lowLevel(cands []string) (string, string) {
	var usable []string
	for _, c := range cands {
		if c = strings.TrimSpace(c); c != "" && !gpuRuntimes[filepath.Base(c)] {
			usable = append(usable, c)
		}
	}
	if len(usable) == 0 {
		return "", "no usable candidate; Gantry's default runtime.low-level = 'runc' stays"
	}
	pick := usable[0]
	how := "the first candidate"
	if m.opts.LookPath != nil {
		found := false
		for _, c := range usable {
			if _, err := m.opts.LookPath(c); err == nil {
				pick, found, how = c, true, "the first candidate found on this host"
				break
			}
		}
		if !found {
			how = "the first candidate (none is found on this host)"
		}
	}
	reason := how
	if len(usable) > 1 {
		reason += "; Gantry execs one runtime, not a list: " + strings.Join(slices.DeleteFunc(slices.Clone(usable), func(s string) bool { return s == pick }), ", ") + " dropped"
	}
	return pick, reason
}

func (m *migrator) modes() error {
	const cdi = "nvidia-container-runtime.modes.cdi."
	if v, ok, err := m.str(cdi + "default-kind"); err != nil {
		return err
	} else if ok && v != "" {
		if strings.Count(v, "/") != 1 {
			return fmt.Errorf("key %sdefault-kind = %q: not a CDI kind (vendor.com/class, e.g. nvidia.com/gpu)", cdi, v)
		}
		m.c.CDI.Kind = v
		m.note(Note{Key: cdi + "default-kind", Kind: Mapped, To: "cdi.kind"})
	} else if ok {
		m.note(Note{Key: cdi + "default-kind", Kind: Ignored, Reason: "empty: Gantry's default cdi.kind nvidia.com/gpu stays"})
	}
	if v, ok, err := m.list(cdi + "spec-dirs"); err != nil {
		return err
	} else if ok && len(v) > 0 {
		m.c.CDI.SpecDirs = v
		m.note(Note{Key: cdi + "spec-dirs", Kind: Mapped, To: "cdi.spec-dirs"})
	} else if ok {
		m.note(Note{Key: cdi + "spec-dirs", Kind: Ignored, Reason: "empty: Gantry's default cdi.spec-dirs stay"})
	}
	if v, ok, err := m.list(cdi + "annotation-prefixes"); err != nil {
		return err
	} else if ok {
		m.c.CDI.AnnotationPrefixes = v
		m.note(Note{Key: cdi + "annotation-prefixes", Kind: Mapped, To: "cdi.annotation-prefixes"})
	}
	for key := range m.flat {
		if strings.HasPrefix(key, "nvidia-container-runtime.modes.csv.") {
			m.ignore(key, Ignored, "a setting of CSV mode (Jetson/Tegra), which Gantry does not have")
		}
		if strings.HasPrefix(key, "nvidia-container-runtime.modes.jit-cdi.") {
			m.ignore(key, Ignored, "a setting of NVIDIA's just-in-time CDI mode; Gantry computes every container's edits from its cached inventory, with no feature flags")
		}
	}
	if v, ok, err := m.str("nvidia-container-runtime.modes.legacy.cuda-compat-mode"); err != nil {
		return err
	} else if ok {
		k := Ignored
		if v == "disabled" {
			k = Unsupported
		}
		m.note(Note{Key: "nvidia-container-runtime.modes.legacy.cuda-compat-mode", Kind: k, Reason: "Gantry puts an image's CUDA forward compatibility libraries first (when newer than the driver) itself, in-process, with no ldconfig or hook; there is no switch"})
	}
	return nil
}

func (m *migrator) hookAndCTK() error {
	m.ignore("nvidia-container-runtime-hook.path", Ignored, "gantry-runtime edits the OCI spec itself and adds no prestart hook; Docker's --gpus finds gantry-hook under the name nvidia-container-runtime-hook in PATH (make install links it)")
	m.ignore("nvidia-container-runtime-hook.skip-mode-detection", Ignored, "gantry-hook has no mode detection: it serves every container that asks through the environment or device volume mounts")
	m.ignore("nvidia-ctk.path", Ignored, "the CDI specs of gantry cdi generate run gantry-cdi-hook as their hook (cdi.hook-path; empty = the one beside gantry), not nvidia-ctk")
	return nil
}

// Counts returns how many notes there are of each kind.
func (mg *Migration) Counts() map[NoteKind]int {
	n := map[NoteKind]int{}
	for _, x := range mg.Notes {
		n[x.Kind]++
	}
	return n
}

// Encode renders the migrated configuration as `gantry config default`
// does, followed by the notes as TOML comments naming what each NVIDIA key
// became. source names the file migrated. The result loads with Parse.
func (mg *Migration) Encode(source string) ([]byte, error) {
	body, err := mg.Config.Encode()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.Write(body)
	fmt.Fprintf(&buf, "\n# Migrated from NVIDIA's %s by `gantry config migrate`.\n", source)
	sections := []struct {
		kind  NoteKind
		title string
	}{
		{Mapped, "Carried over (NVIDIA key -> Gantry key):"},
		{Unsupported, "NOT carried over, and containers may see a difference (read these):"},
		{Ignored, "Not carried over; Gantry needs no such setting:"},
		{Unknown, "Unknown keys, left out:"},
	}
	for _, s := range sections {
		first := true
		for _, n := range mg.Notes {
			if n.Kind != s.kind {
				continue
			}
			if first {
				fmt.Fprintf(&buf, "#\n# %s\n", s.title)
				first = false
			}
			line := fmt.Sprintf("#   %s = %s", n.Key, n.Value)
			if n.Kind == Mapped {
				line += " -> " + n.To
			}
			if n.Reason != "" {
				line += ": " + n.Reason
			}
			buf.WriteString(strings.ReplaceAll(line, "\n", " ") + "\n")
		}
	}
	out := buf.Bytes()
	if _, err := Parse(out); err != nil {
		return nil, fmt.Errorf("the migrated configuration does not load (a bug in gantry config migrate): %w", err)
	}
	return out, nil
}

// ErrExists is returned by WriteFile when the file exists and overwriting
// was not asked for.
var ErrExists = errors.New("file exists")

// WriteFile writes a configuration file atomically: data goes to a
// temporary file in the same directory, is synced, and then takes the
// name, so a reader never sees half a file. Without overwrite an existing
// file is left alone and ErrExists returned; the check and the naming are
// one step (link(2) refuses an existing name), not a race. The directory
// is created if missing.
func WriteFile(path string, data []byte, overwrite bool) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	err := atomicfile.Write(path, data, atomicfile.Options{Mode: 0o644, Sync: true, NoReplace: !overwrite})
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s: %w", path, ErrExists)
	}
	return err
}
