package cdicmd

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gantry-gpu/gantry/internal/cdispec"
	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/containerhook"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/fastpath"
)

// NVIDIA's nvidia-ctk flag grammar (urfave/cli), and its cdi generate and
// cdi list commands. The gantry CLI's nvidia-ctk (internal/cli) parses every
// command with ParseFlags; Lean serves these two without it.

// Flag is one of NVIDIA's flags of a command.
type Flag struct {
	Names []string // the name and its aliases, without dashes
	Bool  bool     // takes no value (--flag, --flag=true|false)
	Multi bool     // may be repeated (urfave's StringSliceFlag), and takes comma lists
	Whole bool     // with Multi: a value is never split at commas
	Help  string
	// Unsupported, when set, is why Gantry refuses the flag and what to do
	// instead; the flag is then never accepted.
	Unsupported string
}

// Values are parsed flags: the first name of each flag given -> its values.
type Values map[string][]string

// Str is the flag's value (the last one given) and whether it was given.
func (v Values) Str(name string) (string, bool) {
	vals, ok := v[name]
	if !ok || len(vals) == 0 {
		return "", ok
	}
	return vals[len(vals)-1], true
}

// On says whether a bool flag was given and not set to false.
func (v Values) On(name string) bool {
	s, ok := v.Str(name)
	return ok && s != "false"
}

// IsHelp says whether a word asks for help.
func IsHelp(s string) bool { return s == "-h" || s == "--help" || s == "help" || s == "-help" }

// FindFlag returns the flag of flags with this name or alias, or nil.
func FindFlag(flags []Flag, name string) *Flag {
	for i := range flags {
		for _, n := range flags[i].Names {
			if n == name {
				return &flags[i]
			}
		}
	}
	return nil
}

// ParseFlags reads NVIDIA's flag syntax (urfave/cli): --name value,
// --name=value, -name, bool flags bare or =true|false, in any order. help
// is true when args ask for help (the values are then nil).
func ParseFlags(flags []Flag, args []string) (vals Values, help bool, err error) {
	vals = Values{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if IsHelp(a) {
			return nil, true, nil
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			return nil, false, Usagef("unexpected argument %q", a)
		}
		if a == "--" {
			if i+1 < len(args) {
				return nil, false, Usagef("unexpected argument %q", args[i+1])
			}
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := FindFlag(flags, name)
		if f == nil {
			return nil, false, Usagef("unknown flag %s", a)
		}
		if f.Unsupported != "" {
			return nil, false, Usagef("--%s is not supported by Gantry: %s", name, f.Unsupported)
		}
		if f.Bool {
			if !hasVal {
				val = "true"
			} else if val != "true" && val != "false" {
				return nil, false, Usagef("--%s=%s: want true or false", name, val)
			}
		} else if !hasVal {
			if i+1 >= len(args) {
				return nil, false, Usagef("--%s needs a value", name)
			}
			i++
			val = args[i]
		}
		key := f.Names[0]
		if f.Multi && f.Whole {
			vals[key] = append(vals[key], val)
		} else if f.Multi {
			for _, v := range strings.Split(val, ",") {
				if v = strings.TrimSpace(v); v != "" {
					vals[key] = append(vals[key], v)
				}
			}
			if _, ok := vals[key]; !ok {
				vals[key] = []string{}
			}
		} else {
			vals[key] = []string{val}
		}
	}
	return vals, false, nil
}

// GenerateFlags are nvidia-ctk cdi generate's flags (NVIDIA's 1.20 names).
var GenerateFlags = []Flag{
	{Names: []string{"output"}, Help: "the spec file to write (default stdout)"},
	{Names: []string{"format"}, Help: "yaml or json (default: from --output's extension, else yaml)"},
	{Names: []string{"mode", "discovery-mode"}, Help: "auto, nvml, or imex for the IMEX channels' spec (the others are not supported)"},
	{Names: []string{"device-name-strategy"}, Multi: true, Help: "index and uuid: Gantry always writes both names"},
	{Names: []string{"driver-root"}, Help: "where the driver is installed (default /)"},
	{Names: []string{"dev-root"}, Help: "where dev/nvidia* are (default: the driver root)"},
	{Names: []string{"nvidia-cdi-hook-path", "nvidia-ctk-path"}, Help: "absolute path of the hook binary the spec runs"},
	{Names: []string{"vendor", "cdi-vendor"}, Help: "the spec's vendor (default nvidia.com)"},
	{Names: []string{"class", "cdi-class"}, Help: "the spec's class (default gpu)"},
	{Names: []string{"no-all-device"}, Bool: true, Help: "leave out the \"all\" device"},
	{Names: []string{"device-id", "device-ids", "device", "devices"}, Multi: true, Help: "only these devices: GPUs by index or UUID, MIG devices by GPU:INSTANCE or MIG UUID (default all)"},
	{Names: []string{"library-search-path"}, Multi: true, Help: "a further directory searched for the driver's libraries (repeatable; inside --driver-root)"},
	{Names: []string{"config-search-path"}, Unsupported: "Gantry finds the driver's configuration files under --driver-root itself"},
	{Names: []string{"ldconfig-path"}, Unsupported: "Gantry's update-ldcache hook runs no ldconfig (it writes the container's cache itself): leave it out"},
	{Names: []string{"csv.file"}, Unsupported: "CSV mode (Jetson/Tegra) is not supported"},
	{Names: []string{"csv.ignore-pattern"}, Unsupported: "CSV mode (Jetson/Tegra) is not supported"},
	{Names: []string{"csv.compat-container-root"}, Unsupported: "CSV mode (Jetson/Tegra) is not supported"},
	{Names: []string{"disable-hook", "disable-hooks"}, Unsupported: "Gantry's spec has the hooks its devices need and no others: leave it out"},
	{Names: []string{"enable-hook", "enable-hooks"}, Unsupported: "Gantry's spec has the hooks its devices need and no others: leave it out"},
	{Names: []string{"feature-flag", "feature-flags"}, Unsupported: "Gantry has no spec feature flags: leave it out"},
}

// ListFlags are nvidia-ctk cdi list's flags.
var ListFlags = []Flag{
	{Names: []string{"spec-dir"}, Multi: true, Help: "a directory of CDI specs (repeatable)"},
}

// NVGenerate runs nvidia-ctk cdi generate with its parsed flags: the same
// spec as gantry cdi generate with the flags they translate to (Gantry's
// configuration file, $GANTRY_CONFIG or /etc/gantry/config.toml, under
// them). debug is nvidia-ctk's global --debug.
func NVGenerate(f Values, debug bool, stdout, stderr io.Writer) error {
	var o GenerateOptions
	o.Output, _ = f.Str("output")
	o.Format, _ = f.Str("format")
	if v, ok := f.Str("mode"); ok && v == "imex" {
		o.IMEX = true
	} else if ok && v != "auto" && v != "nvml" {
		return Usagef("--mode=%s: Gantry discovers GPUs with NVML only: use --mode=auto, --mode=nvml or --mode=imex (the IMEX channels)", v)
	}
	for _, s := range f["device-name-strategy"] {
		if s != "index" && s != "uuid" {
			return Usagef("--device-name-strategy=%s: Gantry names devices by index and by UUID (both, always): use index or uuid", s)
		}
	}
	o.HookPath, _ = f.Str("nvidia-cdi-hook-path") // "": the default, as gantry's --hook-path ""
	vendor, vok := f.Str("vendor")
	class, cok := f.Str("class")
	if vok || cok {
		if !vok {
			vendor = "nvidia.com"
		}
		if !cok {
			class = "gpu"
		}
		o.Kind = vendor + "/" + class
	}
	o.NoAllDevice = f.On("no-all-device")
	o.LibrarySearchPaths = f["library-search-path"]
	o.DeviceIDs = f["device-id"]
	cfg, err := loadConfig(f, debug, stderr)
	if err != nil {
		return err
	}
	if debug {
		o.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return Generate(cfg, o, stdout, stderr)
}

// loadConfig is Gantry's configuration with nvidia-ctk's --driver-root and
// --dev-root over it, as gantry's global flags of the same names set it.
func loadConfig(f Values, debug bool, stderr io.Writer) (config.Config, error) {
	cfg, path, err := config.Load("")
	if err != nil {
		return cfg, err
	}
	if v, ok := f.Str("driver-root"); ok {
		cfg.DriverRoot = v
	}
	if v, ok := f.Str("dev-root"); ok {
		cfg.DevRoot = v
	}
	if debug {
		cfg.LogLevel = "debug"
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("flags: %w", err)
	}
	if debug {
		log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		log.Debug("configuration", "file", path, "gpus", cfg.GPUs, "driver-root", cfg.DriverRoot)
	}
	return cfg, nil
}

// NVList runs nvidia-ctk cdi list: the spec directories are the --spec-dir
// flags, else the configuration's cdi.spec-dirs (the configuration is read
// either way, as gantry cdi list reads it: a broken one is an error).
func NVList(f Values, debug bool, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(nil, debug, stderr)
	if err != nil {
		return err
	}
	dirs, ok := f["spec-dir"]
	if !ok {
		dirs = cfg.CDI.SpecDirs
	}
	// NVIDIA's lists nothing and exits 0 when there is no spec ("Found 0
	// CDI devices"): scripts that run it before generating one go on.
	if err := List(dirs, stdout, stderr); errors.Is(err, ErrNoDevices) {
		fmt.Fprintf(stderr, "Found 0 CDI devices (%v)\n", err)
	} else if err != nil {
		return err
	}
	return nil
}

// Lean runs nvidia-ctk cdi generate and nvidia-ctk cdi list (args without
// the program name) the way the gantry binary's nvidia-ctk does, for the
// lean gantry-runtime binary that answers to the name nvidia-ctk: served is
// false for anything else (other commands, --help, global flags other than
// --quiet and --debug), which the caller hands to the gantry binary
// (ExecGantry), so that every answer but these two comes from one place.
func Lean(args []string, stdout, stderr io.Writer) (code int, served bool) {
	debug := false
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		name, val, hasVal := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		switch name {
		case "debug", "d":
			debug = !hasVal || val != "false"
		case "quiet":
		default:
			return 0, false
		}
		args = args[1:]
	}
	if len(args) < 2 || args[0] != "cdi" || (args[1] != "generate" && args[1] != "list") {
		return 0, false
	}
	flags, name := GenerateFlags, "nvidia-ctk cdi generate"
	if args[1] == "list" {
		flags, name = ListFlags, "nvidia-ctk cdi list"
	}
	vals, help, err := ParseFlags(flags, args[2:])
	if help {
		return 0, false
	}
	if err == nil {
		if args[1] == "list" {
			err = NVList(vals, debug, stdout, stderr)
		} else {
			err = NVGenerate(vals, debug, stdout, stderr)
		}
	}
	if errors.Is(err, cdispec.ErrFullYAML) {
		return 0, false // written by nothing yet: gantry does it all
	}
	return ErrorCode(stderr, name, err), true
}

// ErrorCode prints err as nvidia-ctk does, prefixed by the command's name,
// and returns the exit code: 0 for none, 2 for a UsageError, else 1.
func ErrorCode(stderr io.Writer, name string, err error) int {
	if err == nil {
		return 0
	}
	if ue, ok := err.(UsageError); ok {
		fmt.Fprintf(stderr, "%s: %s (see %s --help)\n", name, ue.Msg, name)
		return 2
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return 1
}

// GantryPath is the gantry binary that serves what a lean binary does not:
// the gantry beside the running one (where make install and the image put
// both), else gantry on $PATH.
func GantryPath() (string, error) {
	var tried []string
	if exe, err := Executable(); err == nil {
		p, ok := discover.GantryBeside(exe)
		if ok {
			return p, nil
		}
		tried = append(tried, p)
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		if p := filepath.Join(dir, "gantry"); discover.IsExecutable(p) {
			return p, nil
		}
	}
	tried = append(tried, "gantry on $PATH")
	return "", fmt.Errorf("the gantry binary is missing (looked at %s): install it beside this one with `make install`", strings.Join(tried, " and "))
}

// ExecGantry replaces the process with the gantry binary run under the
// name name (its argv[0], which chooses what gantry does) with args, in
// this environment less the dynamic loader's variables (a static caller
// may have been given an image's environment: gantry is dynamically
// linked, and its loader would run the image's LD_PRELOAD). It returns
// only on failure.
func ExecGantry(name string, args []string) error {
	p, err := GantryPath()
	if err != nil {
		return err
	}
	// cdi generate may have started on one CPU (package fastpath).
	if err := fastpath.RestoreAffinity(); err != nil {
		return fmt.Errorf("restoring the CPU affinity before running %s: %w", p, err)
	}
	err = syscall.Exec(p, append([]string{name}, args...), containerhook.WithoutLoaderVars(os.Environ()))
	return fmt.Errorf("running %s as %s: %w", p, name, err)
}

// HookAt returns the index of nvidia-ctk's hook command in args (without
// the program name) after any global flags (nvidia-ctk --debug hook ...),
// or -1; a help or version flag before it is not the hook command.
func HookAt(args []string) int {
	for i, a := range args {
		switch {
		case a == "hook":
			return i
		case a == "-h" || a == "--help" || a == "-v" || a == "--version" || a == "-" || a == "--" || !strings.HasPrefix(a, "-"):
			return -1
		}
	}
	return -1
}
