package nvcli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/version"
)

// Name is the program name this entry point answers to.
const Name = "nvidia-container-cli"

// CLIVersion is the NVIDIA CLI release whose interface this entry point
// implements; --version reports it as cli-version, the line tools that
// check the CLI's version read.
const CLIVersion = "1.17.8"

// globalOptions are the options before the command.
var globalOptions = []option{
	{long: "debug", short: 'd', arg: requiredArg, metavar: "FILE", help: "append a log of what is done to FILE"},
	{long: "load-kmods", short: 'k', help: "accepted; Gantry never loads kernel modules (the driver install does)"},
	{long: "no-pivot", short: 'n', help: "accepted; Gantry never pivots into the container"},
	{long: "user", short: 'u', arg: optionalArg, metavar: "UID[:GID]", help: "accepted (LXC passes it for unprivileged containers); nothing runs as another user"},
	{long: "root", short: 'r', arg: requiredArg, metavar: "PATH", help: "driver root directory (overrides driver-root of the Gantry config)"},
	{long: "ldcache", short: 'l', arg: requiredArg, metavar: "FILE", help: "the driver root's DSO cache; only PATH/etc/ld.so.cache is supported"},
	{long: "no-create-imex-channels", help: "accepted; Gantry never creates IMEX channel nodes"},
}

// globals are the parsed global options.
type globals struct {
	debug   string
	root    string
	ldcache string
	user    string
}

func parseGlobals(sets []setting) (globals, error) {
	var g globals
	for _, s := range sets {
		switch s.name {
		case "debug":
			g.debug = s.value
		case "root":
			if !strings.HasPrefix(s.value, "/") {
				return g, usagef("--root=%s: the driver root must be an absolute path", s.value)
			}
			g.root = s.value
		case "ldcache":
			g.ldcache = s.value
		case "user":
			if s.set {
				if err := checkUser(s.value); err != nil {
					return g, err
				}
			}
			g.user = s.value
		}
	}
	return g, nil
}

// checkUser validates --user=UID[:GID] as NVIDIA's CLI does: decimal ids.
func checkUser(v string) error {
	uid, gid, hasGID := strings.Cut(v, ":")
	ids := []string{uid}
	if hasGID {
		ids = append(ids, gid)
	}
	for _, n := range ids {
		if _, err := strconv.ParseUint(n, 10, 32); err != nil {
			return usagef("--user=%s: want UID or UID:GID in decimal", v)
		}
	}
	return nil
}

// command is one subcommand.
type command struct {
	name    string
	args    string // operand synopsis
	summary string
	help    string
	options []option
	run     func(c *ctx, sets []setting, operands []string) error
}

var commands []*command

// ctx carries what a command needs.
type ctx struct {
	stdout, stderr io.Writer
	g              globals
	log            *slog.Logger
}

// Main runs the nvidia-container-cli compatible entry point with args (without
// the program name) and returns the exit code: 0, or 1 for any failure (usage
// errors included, as NVIDIA's CLI exits).
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && args[0] == applyHelper {
		return runApplyHelper(os.Stdin, stderr)
	}
	sets, rest, err := parse(args, globalOptions, true)
	switch {
	case errors.As(err, new(helpRequested)):
		printOverview(stdout)
		return 0
	case errors.As(err, new(versionRequested)):
		printVersion(stdout)
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v (see %s --help)\n", Name, err, Name)
		return 1
	}
	if len(rest) == 0 {
		fmt.Fprintf(stderr, "%s: missing command: one of info, list, configure (see %s --help)\n", Name, Name)
		return 1
	}
	var cmd *command
	for _, c := range commands {
		if c.name == rest[0] {
			cmd = c
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "%s: unknown command %q: one of info, list, configure (see %s --help)\n", Name, rest[0], Name)
		return 1
	}
	g, err := parseGlobals(sets)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", Name, err)
		return 1
	}
	csets, operands, err := parse(rest[1:], cmd.options, false)
	switch {
	case errors.As(err, new(helpRequested)):
		printCommandHelp(stdout, cmd)
		return 0
	case errors.As(err, new(versionRequested)):
		printVersion(stdout)
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "%s %s: %v (see %s %s --help)\n", Name, cmd.name, err, Name, cmd.name)
		return 1
	}
	c := &ctx{stdout: stdout, stderr: stderr, g: g, log: slog.New(slog.DiscardHandler)}
	if g.debug != "" {
		f, err := os.OpenFile(g.debug, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Fprintf(stderr, "%s: --debug=%s: %v\n", Name, g.debug, err)
			return 1
		}
		defer f.Close()
		c.log = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.log.Debug("started", "args", strings.Join(args, " "), "pid", os.Getpid(), "ppid", os.Getppid())
	}
	if err := cmd.run(c, csets, operands); err != nil {
		c.log.Error("failed", "err", err)
		var u usageError
		if errors.As(err, &u) {
			fmt.Fprintf(stderr, "%s %s: %v (see %s %s --help)\n", Name, cmd.name, err, Name, cmd.name)
		} else {
			fmt.Fprintf(stderr, "%s %s: %v\n", Name, cmd.name, err)
		}
		return 1
	}
	return 0
}

// config loads the Gantry configuration and applies the global options.
func (c *ctx) config() (config.Config, error) {
	cfg, path, err := config.Load("")
	if err != nil {
		return cfg, err
	}
	if c.g.root != "" {
		cfg.DriverRoot = c.g.root
	}
	if c.g.ldcache != "" {
		want := strings.TrimSuffix(cfg.DriverRoot, "/") + "/etc/ld.so.cache"
		if cleanPath(c.g.ldcache) != cleanPath(want) {
			return cfg, usagef("--ldcache=%s: Gantry reads the cache of the driver root (%s); give the driver root with --root instead", c.g.ldcache, want)
		}
	}
	c.log.Debug("configuration", "file", path, "gpus", cfg.GPUs, "driverRoot", cfg.DriverRoot, "devRoot", cfg.EffectiveDevRoot())
	return cfg, nil
}

func cleanPath(p string) string {
	for strings.Contains(p, "//") {
		p = strings.ReplaceAll(p, "//", "/")
	}
	return strings.TrimSuffix(p, "/")
}

func printOverview(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s [OPTION...] COMMAND [ARG...]\n", Name)
	b.WriteString(`Gantry's nvidia-container-cli compatible entry point: the commands and
options of NVIDIA's CLI that LXC's nvidia hook (/usr/share/lxc/hooks/nvidia)
and other callers use, done by Gantry. GPUs and the driver are found as the
Gantry configuration says (GANTRY_CONFIG or /etc/gantry/config.toml).

Options:
`)
	writeOptions(&b, globalOptions)
	fmt.Fprintf(&b, "  %-30s %s\n", "-?, --help", "this help (COMMAND --help: the command's)")
	fmt.Fprintf(&b, "  %-30s %s\n", "-V, --version", "print the version")
	b.WriteString("\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-30s %s\n", c.name, c.summary)
	}
	io.WriteString(w, b.String())
}

func printCommandHelp(w io.Writer, c *command) {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: %s %s [OPTION...]%s\n%s\n\nOptions:\n", Name, c.name, c.args, c.help)
	writeOptions(&b, c.options)
	io.WriteString(w, b.String())
}

// printVersion prints the lines NVIDIA's CLI prints, so that scripts reading
// "cli-version:" find a version of the interface implemented here.
func printVersion(w io.Writer) {
	fmt.Fprintf(w, "cli-version: %s\nlib-version: %s\nbuild revision: gantry %s\n", CLIVersion, CLIVersion, version.Version)
}

// busLocation formats a PCI bus id as NVIDIA's CLI prints it: lower-case
// hex, eight digits of domain ("00000000:1b:00.0").
func busLocation(id string) string {
	a, err := gpu.ParsePCIAddress(id)
	if err != nil {
		return id
	}
	return fmt.Sprintf("%08x:%02x:%02x.%x", a.Domain, a.Bus, a.Device, a.Function)
}

// brandNames are the brands as NVIDIA's CLI spells them in `info`; brands it
// does not name print as the NVIDIA_REQUIRE_* word (e.g. "nvidia").
var brandNames = map[string]string{
	"quadro":  "Quadro",
	"tesla":   "Tesla",
	"nvs":     "NVS",
	"grid":    "GRID",
	"geforce": "GeForce",
	"titan":   "TITAN",
	"unknown": "Unknown",
	"":        "Unknown",
}

func brandName(b string) string {
	if n, ok := brandNames[b]; ok {
		return n
	}
	return b
}

func init() {
	commands = append(commands, &command{
		name:    "info",
		summary: "Report the driver and the GPUs it detected",
		help:    "\nPrints the driver and CUDA versions and, per GPU, its index, minor, model,\nbrand, UUID, bus location and compute capability.",
		options: []option{{long: "csv", help: "print CSV"}},
		run:     runInfo,
	})
}

func runInfo(c *ctx, sets []setting, operands []string) error {
	if len(operands) > 0 {
		return usagef("unexpected argument %q", operands[0])
	}
	csv := len(sets) > 0
	cfg, err := c.config()
	if err != nil {
		return err
	}
	sys, err := discover.GPUs(cfg, false)
	if err != nil {
		return err
	}
	writeInfo(c.stdout, sys, csv)
	return nil
}

func writeInfo(w io.Writer, sys *gpu.System, csv bool) {
	var b strings.Builder
	if csv {
		fmt.Fprintf(&b, "NVRM version,CUDA version\n%s,%s\n", sys.DriverVersion, sys.CUDADriverVersion)
		b.WriteString("\nDevice Index,Device Minor,Model,Brand,GPU UUID,Bus Location,Architecture\n")
		for i, d := range sys.Devices {
			fmt.Fprintf(&b, "%d,%d,%s,%s,%s,%s,%s\n", i, d.Minor, d.Name, brandName(d.Brand), d.UUID, busLocation(d.PCIBusID), d.ComputeCapability)
		}
	} else {
		fmt.Fprintf(&b, "%-15s %s\n%-15s %s\n", "NVRM version:", sys.DriverVersion, "CUDA version:", sys.CUDADriverVersion)
		for i, d := range sys.Devices {
			for _, kv := range [][2]string{
				{"Device Index:", strconv.Itoa(i)},
				{"Device Minor:", strconv.Itoa(d.Minor)},
				{"Model:", d.Name},
				{"Brand:", brandName(d.Brand)},
				{"GPU UUID:", d.UUID},
				{"Bus Location:", busLocation(d.PCIBusID)},
				{"Architecture:", d.ComputeCapability},
			} {
				if kv[0] == "Device Index:" {
					b.WriteString("\n")
				}
				fmt.Fprintf(&b, "%-15s %s\n", kv[0], kv[1])
			}
		}
	}
	io.WriteString(w, b.String())
}

// hostPaths returns the host paths of files.
func hostPaths(files []driver.File) []string {
	out := make([]string, 0, len(files))
	for _, f := range files {
		out = append(out, f.HostPath)
	}
	return out
}
