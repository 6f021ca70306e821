package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/gantry-gpu/gantry/internal/cdicmd"
	"github.com/gantry-gpu/gantry/internal/containerhook"
	"github.com/gantry-gpu/gantry/internal/version"
)

// NVIDIA's nvidia-ctk (Container Toolkit 1.20) command lines, served by the
// gantry binary under the name nvidia-ctk (cdi generate and cdi list also by
// gantry-runtime under that name: package cdicmd): provisioning scripts, Ansible
// roles and install guides written for NVIDIA's toolkit run unchanged. Each
// command's flags are NVIDIA's; they are translated into the gantry command
// that does the same work (runtime configure, cdi generate, ...), which then
// runs as `gantry ...` would. A flag of NVIDIA's that Gantry has no
// equivalent for is refused with one line naming it and what to use
// instead: a provisioning script must not believe it got something it did
// not.

// nvFlag is one of NVIDIA's flags of a command; the grammar (and the flags
// of cdi generate and cdi list, which the lean gantry-runtime serves too) is
// in package cdicmd.
type nvFlag = cdicmd.Flag

// nvCommand is one nvidia-ctk command.
type nvCommand struct {
	words   string // "runtime configure"
	summary string
	help    string
	flags   []nvFlag
	// texts, when set, fills the parts of a copy of the command that list
	// what is registered at run time (runtime configure's engines) before
	// it is shown.
	texts func(c *nvCommand)
	// run translates the parsed flags (name -> values, the last one for a
	// single-valued flag) into a gantry invocation, or does the work itself.
	run func(c *nvCtx, f nvValues) error
}

type nvValues = cdicmd.Values

// nvCtx is what a command runs with.
type nvCtx struct {
	stdout, stderr io.Writer
	debug          bool
	name           string // "nvidia-ctk runtime configure"
}

// gantry runs the gantry command line args (global flags added) and turns
// its exit code into an error.
func (c *nvCtx) gantry(args ...string) error {
	if c.debug {
		args = append([]string{"--debug"}, args...)
	}
	if code := Main(args, c.stdout, c.stderr); code != 0 {
		return exitCode(code)
	}
	return nil
}

var nvCommands []*nvCommand

// NVIDIACTKMain runs gantry as nvidia-ctk: args without the program name.
// It returns the exit code: 0, 1 for a failure, 2 for a usage error.
func NVIDIACTKMain(args []string, stdout, stderr io.Writer) int {
	debug := false
	// NVIDIA's global flags come before the command.
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && !isHelp(args[0]) {
		name, val, hasVal := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		switch name {
		case "debug", "d":
			debug = !hasVal || val != "false"
		case "quiet":
			// Gantry's commands print only their result and errors anyway.
		case "version", "v":
			fmt.Fprintf(stdout, "nvidia-ctk (gantry) %s\n", version.Version)
			return 0
		case "config":
			fmt.Fprintf(stderr, "nvidia-ctk: --config (before the command) names NVIDIA's config.toml, which Gantry does not read: Gantry's configuration is $GANTRY_CONFIG or /etc/gantry/config.toml (convert yours with `gantry config migrate FILE`)\n")
			return 2
		default:
			fmt.Fprintf(stderr, "nvidia-ctk: unknown global flag %s (see nvidia-ctk --help)\n", args[0])
			return 2
		}
		args = args[1:]
	}
	if len(args) == 0 || isHelp(args[0]) {
		w, code := stdout, 0
		if len(args) == 0 {
			w, code = stderr, 2
		}
		nvOverview(w)
		return code
	}
	if args[0] == "hook" {
		// NVIDIA's nvidia-ctk hook is its nvidia-cdi-hook under another
		// name; so is this one.
		return containerhook.Main(append([]string{"nvidia-ctk hook"}, args[1:]...), os.Stdin, stdout, stderr)
	}
	c, rest := findNVCommand(args)
	if c == nil {
		if group := nvGroup(args[0]); len(group) > 0 {
			w, code := stderr, 2
			switch {
			case len(args) > 1 && isHelp(args[1]):
				w, code = stdout, 0
			case len(args) > 1 && !strings.HasPrefix(args[1], "-"):
				// A subcommand that is none: "nvidia-ctk cdi generat".
				var subs []string
				for _, g := range group {
					subs = append(subs, strings.TrimPrefix(g.words, args[0]+" "))
				}
				hint := ""
				if c := closest(args[1], subs); c != "" {
					hint = fmt.Sprintf(" (did you mean \"nvidia-ctk %s %s\"?)", args[0], c)
				}
				fmt.Fprintf(w, "nvidia-ctk %s: unknown subcommand %q%s\n\n", args[0], args[1], hint)
			default:
				fmt.Fprintf(w, "nvidia-ctk %s: name a subcommand\n\n", args[0])
			}
			fmt.Fprintf(w, "Subcommands of nvidia-ctk %s:\n", args[0])
			for _, g := range group {
				fmt.Fprintf(w, "  %-36s %s\n", g.words, g.shown().summary)
			}
			return code
		}
		var top []string
		for _, c := range nvCommands {
			if w := strings.Fields(c.words)[0]; !slices.Contains(top, w) {
				top = append(top, w)
			}
		}
		fmt.Fprintf(stderr, "nvidia-ctk: unknown command %q%s (see nvidia-ctk --help)\n", args[0], didYouMean(args[0], append(top, "hook")))
		return 2
	}
	ctx := &nvCtx{stdout: stdout, stderr: stderr, debug: debug, name: "nvidia-ctk " + c.words}
	vals, help, err := cdicmd.ParseFlags(c.flags, rest)
	if help {
		nvCommandHelp(stdout, c)
		return 0
	}
	if err == nil {
		err = c.run(ctx, vals)
	}
	if err != nil {
		var ec exitCode
		if errors.As(err, &ec) {
			return int(ec)
		}
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "%s: %s (see %s --help)\n", ctx.name, ue.Msg, ctx.name)
			return 2
		}
		fmt.Fprintf(stderr, "%s: %v\n", ctx.name, err)
		return 1
	}
	return 0
}

// findNVCommand matches the longest command at the start of args.
func findNVCommand(args []string) (*nvCommand, []string) {
	var best *nvCommand
	n := 0
	for _, c := range nvCommands {
		w := strings.Fields(c.words)
		if len(w) > n && len(w) <= len(args) && equalWords(w, args[:len(w)]) {
			best, n = c, len(w)
		}
	}
	return best, args[n:]
}

func nvGroup(word string) []*nvCommand {
	var out []*nvCommand
	for _, c := range nvCommands {
		if w := strings.Fields(c.words); len(w) > 1 && w[0] == word {
			out = append(out, c)
		}
	}
	return out
}

func nvOverview(w io.Writer) {
	fmt.Fprintf(w, `nvidia-ctk: NVIDIA Container Toolkit's command names, served by Gantry.

Usage: nvidia-ctk [--debug] COMMAND [flags]

The commands and flags are those of NVIDIA's nvidia-ctk 1.20; each runs the
gantry command that does the same work (shown in each command's --help). A flag
of NVIDIA's that Gantry has no equivalent for is refused with an error saying
what to use instead.

Commands:
`)
	sorted := append([]*nvCommand(nil), nvCommands...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].words < sorted[j].words })
	for _, c := range sorted {
		fmt.Fprintf(w, "  %-36s %s\n", c.words, c.shown().summary)
	}
	fmt.Fprintf(w, "  %-36s %s\n", "hook COMMAND", "the CDI hooks, as nvidia-cdi-hook runs them (nvidia-ctk hook --help)")
	fmt.Fprintf(w, `
Examples (NVIDIA's install and CDI guides):
  sudo nvidia-ctk runtime configure --runtime=docker
  sudo nvidia-ctk runtime configure --runtime=containerd
  sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml
  nvidia-ctk cdi list

See nvidia-ctk COMMAND --help, and gantry --help for Gantry's own commands.
`)
}

// shown is c with its texts made.
func (c *nvCommand) shown() *nvCommand {
	if c.texts == nil {
		return c
	}
	d := *c
	d.flags = slices.Clone(c.flags)
	c.texts(&d)
	return &d
}

func nvCommandHelp(w io.Writer, c *nvCommand) {
	c = c.shown()
	fmt.Fprintf(w, "Usage: nvidia-ctk %s [flags]\n\n%s\n\n%s\n\nFlags:\n", c.words, c.summary, strings.TrimSpace(c.help))
	for _, f := range c.flags {
		names := make([]string, len(f.Names))
		for i, n := range f.Names {
			names[i] = "--" + n
		}
		arg := " VALUE"
		if f.Bool {
			arg = ""
		}
		fmt.Fprintf(w, "  %s%s\n", strings.Join(names, ", "), arg)
		if f.Unsupported != "" {
			fmt.Fprintf(w, "        not supported: %s\n", f.Unsupported)
		} else {
			fmt.Fprintf(w, "        %s\n", f.Help)
		}
	}
}
