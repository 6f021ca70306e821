// Package cli implements the gantry command: argument parsing, the commands'
// output, and exit codes. cmd/gantry only calls Main.
//
// Every command takes the global flags (--config, --gpus, --driver-root,
// --dev-root, --debug) before or after its name; flags override the
// configuration file. Errors are one line on stderr and exit code 1; usage
// errors exit 2.
//
// NVIDIACTKMain serves the same commands under NVIDIA's nvidia-ctk grammar
// and flags (nvctk*.go), translating each command line into gantry's.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"

	"github.com/gantry-gpu/gantry/internal/cdicmd"
	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/cudackpt"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/version"
)

// env carries what a command needs: its output streams and the resolved configuration.
type env struct {
	stdout, stderr io.Writer
	cfg            config.Config
	cfgPath        string
	log            *slog.Logger
	// flagNames are the names the command line used for some of the
	// command's flags, when it came under another program's grammar
	// (nvidia-docker-plugin's -s for --plugin-dir), so that messages name
	// the flag the user can give.
	flagNames map[string]string
}

// flag is how the user names the command's flag name ("--plugin-dir").
func (e *env) flag(name string) string {
	if n, ok := e.flagNames[name]; ok {
		return n
	}
	return name
}

type command struct {
	name    string // "info", "cdi generate"
	summary string
	usage   string // argument synopsis after the name
	help    string // paragraphs shown by --help
	// texts, when set, makes summary and help when they are shown, for a
	// command whose text lists what is registered at run time (the
	// engines of runtime configure).
	texts func() (summary, help string)
	flags func(fs *flag.FlagSet) func(e *env, args []string) error
	// noConfig commands take no global flags and run with the default
	// configuration, never reading $GANTRY_CONFIG or a file: the CDI hooks,
	// which run as root with an environment the image may have written.
	noConfig bool
	// errCode is the exit code of an error of the command's own (a
	// configuration it cannot load, output it cannot write); 0 means 1.
	// doctor uses 2, keeping 1 for "a check failed".
	errCode int
}

// shown is c with its texts made.
func (c *command) shown() *command {
	if c.texts == nil {
		return c
	}
	d := *c
	d.summary, d.help = c.texts()
	return &d
}

func (c *command) failCode() int {
	if c.errCode != 0 {
		return c.errCode
	}
	return 1
}

// usageError is an error in how the command was called: exit code 2.
type usageError = cdicmd.UsageError

func usagef(format string, a ...any) error { return cdicmd.Usagef(format, a...) }

var commands []*command

func register(c *command) { commands = append(commands, c) }

// Main runs gantry with args (without the program name) and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	return mainAs(args, stdout, stderr, nil)
}

// mainAs is Main for a command line translated from another program's
// grammar: flagNames maps gantry's flag names to the ones the user gave.
func mainAs(args []string, stdout, stderr io.Writer, flagNames map[string]string) int {
	// gantry-runtime, built without NVML, asks gantry for NVML's GPUs
	// (package discover): a command of the binaries', not listed, reading
	// no configuration.
	if len(args) > 0 && args[0] == discover.HelperCommand {
		return discover.HelperMain(args[1:], stdout, stderr)
	}
	// Likewise the CUDA process checkpoint calls of its checkpoint and
	// restore (package cudackpt): they need libcuda loaded.
	if len(args) > 0 && args[0] == cudackpt.HelperCommand {
		return cudackpt.HelperMain(args[1:], stdout, stderr)
	}
	cmd, rest := findCommand(args)
	if cmd == nil {
		if len(args) == 0 || isHelp(args[0]) {
			printOverview(stdout)
			return 0
		}
		if args[0] == "--version" || args[0] == "version" {
			fmt.Fprintf(stdout, "gantry %s\n", version.Version)
			return 0
		}
		// A command group without its subcommand ("gantry cdi", "gantry
		// runtime --help"): list the group's commands.
		if group := groupCommands(args[0]); len(group) > 0 {
			w, code := stdout, 0
			switch {
			case len(args) > 1 && !isHelp(args[1]) && !strings.HasPrefix(args[1], "-"):
				// A subcommand that is none: "gantry cdi generat".
				subs := make([]string, len(group))
				for i, c := range group {
					subs[i] = strings.Fields(c.name)[1]
				}
				w, code = stderr, 2
				hint := ""
				if c := closest(args[1], subs); c != "" {
					hint = fmt.Sprintf(" (did you mean \"gantry %s %s\"?)", args[0], c)
				}
				fmt.Fprintf(w, "gantry %s: unknown subcommand %q%s\n\n", args[0], args[1], hint)
			case len(args) == 1 || !isHelp(args[1]):
				w, code = stderr, 2
				fmt.Fprintf(w, "gantry %s: name a subcommand\n\n", args[0])
			}
			fmt.Fprintf(w, "Usage: gantry %s SUBCOMMAND [flags]\n\nSubcommands:\n", args[0])
			for _, c := range group {
				fmt.Fprintf(w, "  %-22s %s\n", c.name, c.shown().summary)
			}
			fmt.Fprintf(w, "\nSee gantry %s SUBCOMMAND --help.\n", args[0])
			return code
		}
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
			// Flags only, one of them no global flag: "gantry -v".
			bad := firstUnknownFlag(args)
			if bad == "" {
				fmt.Fprintf(stderr, "gantry: name a command\n\n")
				printOverview(stderr)
				return 2
			}
			fmt.Fprintf(stderr, "gantry: unknown flag %q%s (see gantry --help)\n", bad,
				didYouMean(bad, []string{"--version", "--help", "--config", "--gpus", "--driver-root", "--dev-root", "--debug"}))
			return 2
		}
		if hint := didYouMean(rest[0], topWords()); hint != "" {
			fmt.Fprintf(stderr, "gantry: unknown command %q%s (see gantry --help)\n", rest[0], hint)
			return 2
		}
		fmt.Fprintf(stderr, "gantry: unknown command %q\n\n", strings.Join(leadingWords(rest), " "))
		printOverview(stderr)
		return 2
	}
	fs := flag.NewFlagSet("gantry "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var g *globals
	if !cmd.noConfig {
		g = globalFlags(fs)
	}
	run := cmd.flags(fs)
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printCommandHelp(stdout, cmd, fs)
			return 0
		}
		fmt.Fprintf(stderr, "gantry %s: %v (see gantry %s --help)\n", cmd.name, err, cmd.name)
		return 2
	}
	var e *env
	if cmd.noConfig {
		e = &env{stdout: stdout, stderr: stderr, cfg: config.Default(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	} else {
		var err error
		if e, err = g.resolve(fs, stdout, stderr); err != nil {
			hint := ""
			if cmd.name == "runtime configure" && *g.config != "" {
				// NVIDIA's nvidia-ctk runtime configure takes the engine's
				// file as --config; here that flag is Gantry's own file.
				hint = fmt.Sprintf(" (--config is Gantry's own configuration: give the engine's file as --config-file %s, or run nvidia-ctk runtime configure --config=%s)", *g.config, *g.config)
			}
			fmt.Fprintf(stderr, "gantry: %v%s\n", err, hint)
			return cmd.failCode()
		}
	}
	e.flagNames = flagNames
	if err := run(e, fs.Args()); err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "gantry %s: %s (see gantry %s --help)\n", cmd.name, ue.Msg, cmd.name)
			return 2
		}
		var ec exitCode
		if errors.As(err, &ec) {
			return int(ec)
		}
		fmt.Fprintf(stderr, "gantry %s: %v\n", cmd.name, err)
		return cmd.failCode()
	}
	return 0
}

// topWords are the words a gantry command line can start with: each
// command's first word, and version and help.
func topWords() []string {
	words := []string{"version", "help"}
	for _, c := range commands {
		if w := strings.Fields(c.name)[0]; !slices.Contains(words, w) {
			words = append(words, w)
		}
	}
	return words
}

// firstUnknownFlag is the first of args that is a flag but none of the
// global flags (nor a global flag's value).
func firstUnknownFlag(args []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch name {
		case "config", "gpus", "driver-root", "dev-root":
			if !hasVal {
				i++ // its value
			}
			continue
		case "debug":
			continue
		}
		return a
	}
	return ""
}

// exitCode lets a command end with a given code after printing its own output.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit code %d", int(e)) }

// groupCommands returns the commands whose first word is word, sorted, when
// they have more words ("cdi" for "cdi generate" and "cdi list").
func groupCommands(word string) []*command {
	var out []*command
	for _, c := range commands {
		parts := strings.Fields(c.name)
		if len(parts) > 1 && parts[0] == word {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func isHelp(s string) bool { return s == "-h" || s == "--help" || s == "help" || s == "-help" }

// findCommand matches the longest command name at the start of args; global
// flags may come first.
func findCommand(args []string) (*command, []string) {
	var pre []string
	i := 0
	for i < len(args) && strings.HasPrefix(args[i], "-") && !isHelp(args[i]) {
		pre = append(pre, args[i])
		// A global flag written as "--flag value" takes the next word.
		if !strings.Contains(args[i], "=") && i+1 < len(args) && globalTakesValue(args[i]) {
			pre = append(pre, args[i+1])
			i++
		}
		i++
	}
	words := args[i:]
	var best *command
	bestLen := 0
	for _, c := range commands {
		parts := strings.Fields(c.name)
		if len(parts) <= len(words) && len(parts) > bestLen && equalWords(parts, words[:len(parts)]) {
			best, bestLen = c, len(parts)
		}
	}
	if best == nil {
		return nil, args[i:]
	}
	return best, append(pre, words[bestLen:]...)
}

func leadingWords(args []string) []string {
	var w []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			continue
		}
		w = append(w, a)
		if len(w) == 2 {
			break
		}
	}
	return w
}

func equalWords(a, b []string) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

type globals struct {
	config, gpus, driverRoot, devRoot *string
	debug                             *bool
}

func globalTakesValue(arg string) bool {
	switch strings.TrimLeft(arg, "-") {
	case "config", "gpus", "driver-root", "dev-root":
		return true
	}
	return false
}

func globalFlags(fs *flag.FlagSet) *globals {
	return &globals{
		config:     fs.String("config", "", "configuration file (default $GANTRY_CONFIG or "+config.DefaultPath+")"),
		gpus:       fs.String("gpus", "", "GPU backend: nvml, sim:PROFILE (e.g. sim:h100x8) or sim:FILE.yaml"),
		driverRoot: fs.String("driver-root", "", "directory the NVIDIA driver is installed under (default /)"),
		devRoot:    fs.String("dev-root", "", "directory holding dev/nvidia* (default: the driver root)"),
		debug:      fs.Bool("debug", false, "log what gantry does to stderr"),
	}
}

func (g *globals) resolve(fs *flag.FlagSet, stdout, stderr io.Writer) (*env, error) {
	cfg, path, err := config.Load(*g.config)
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["gpus"] {
		if err := config.ValidateGPUs(*g.gpus); err != nil {
			return nil, fmt.Errorf("--gpus: %w", err)
		}
		cfg.GPUs = *g.gpus
	}
	if set["driver-root"] {
		cfg.DriverRoot = *g.driverRoot
	}
	if set["dev-root"] {
		cfg.DevRoot = *g.devRoot
	}
	if *g.debug {
		cfg.LogLevel = "debug"
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("flags: %w", err)
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	log.Debug("configuration", "file", path, "gpus", cfg.GPUs, "driver-root", cfg.DriverRoot)
	return &env{stdout: stdout, stderr: stderr, cfg: cfg, cfgPath: path, log: log}, nil
}

func printOverview(w io.Writer) {
	fmt.Fprintf(w, `gantry: NVIDIA GPUs for containers (Docker, containerd, CRI-O, Podman, LXC, Kubernetes).

Usage: gantry [global flags] COMMAND [flags]

Commands:
`)
	sorted := append([]*command(nil), commands...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	for _, c := range sorted {
		fmt.Fprintf(w, "  %-22s %s\n", c.name, c.shown().summary)
	}
	fmt.Fprintf(w, `
Global flags (before or after the command):
  --gpus nvml|sim:PROFILE|sim:FILE   where GPUs come from (default nvml; try sim:h100x8)
  --driver-root DIR                  where the driver is installed (default /)
  --dev-root DIR                     where dev/nvidia* are (default: the driver root)
  --config FILE                      configuration file (default $GANTRY_CONFIG or %s)
  --debug                            log to stderr

Examples:
  gantry info                                  the GPUs and driver of this host
  gantry --gpus sim:h100x8 info                a simulated 8x H100 host
  gantry cdi generate --output /var/run/cdi/nvidia.yaml
  gantry COMMAND --help                        details of one command
`, config.DefaultPath)
}

func printCommandHelp(w io.Writer, c *command, fs *flag.FlagSet) {
	c = c.shown()
	fmt.Fprintf(w, "Usage: gantry %s [flags] %s\n\n%s\n", c.name, c.usage, c.summary)
	if c.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.help))
	}
	fmt.Fprintf(w, "\nFlags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}
