package containerhook

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/internal/version"
)

// Command is one hook subcommand. The static gantry-cdi-hook binary runs
// them at top level (gantry-cdi-hook create-symlinks ..., NVIDIA's
// nvidia-cdi-hook grammar) through Main; the gantry CLI keeps them under
// `gantry hook` for CDI specs written before that binary existed. Both parse
// the same flags and run the same code.
type Command struct {
	Name    string // "create-symlinks"
	Summary string
	Usage   string // argument synopsis after the name
	Help    string // paragraphs shown by --help
	Hidden  bool   // left out of the command list (NVIDIA's noop)
	// Flags registers the command's flags on fs and returns the function
	// that runs it: args are what is left after the flags, in holds the
	// container state, warn takes warnings worth a line on stderr.
	Flags func(fs *flag.FlagSet) func(args []string, in io.Reader, warn func(string)) error
}

// UsageError is an error in how a hook was called (exit code 2), as opposed
// to one met while doing its work (exit code 1).
type UsageError struct{ Msg string }

func (u UsageError) Error() string { return u.Msg }

func usagef(format string, a ...any) error { return UsageError{fmt.Sprintf(format, a...)} }

// repeated collects a flag given several times (--link a --link b).
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(s string) error { *r = append(*r, s); return nil }

// Commands are the hook subcommands, in the order --help lists them.
var Commands = []*Command{
	{
		Name:    "create-symlinks", // edits.HookCreateSymlinks
		Summary: "create symlinks inside the container (the SONAME links of injected libraries)",
		Usage:   "--link TARGET::LINK [--link ...]",
		Help: `Run by the container runtime as a createContainer hook, with the container
state on stdin. Creates each --link TARGET::LINK inside the container's root
filesystem, replacing a file already there (like ln -sf), e.g. the SONAME link
  --link libcuda.so.580.159.04::/usr/lib/x86_64-linux-gnu/libcuda.so.1
LINK is a container path; it and its directories are resolved inside the
container's root, so symlinks in the image never lead out of it. An error
fails the container: it must not start half configured.`,
		Flags: func(fs *flag.FlagSet) func([]string, io.Reader, func(string)) error {
			var links repeated
			fs.Var(&links, "link", "TARGET::LINK: make the container path LINK a symlink to TARGET (repeatable)")
			return func(args []string, in io.Reader, _ func(string)) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				var parsed []Link
				for _, s := range links {
					l, err := ParseLink(s)
					if err != nil {
						return usagef("%v", err)
					}
					parsed = append(parsed, l)
				}
				root, err := OpenRoot(in)
				if err != nil {
					return err
				}
				defer root.Close()
				return CreateSymlinks(root, parsed)
			}
		},
	},
	{
		Name:    "update-ldcache", // edits.HookUpdateLDCache
		Summary: "add injected library folders to the container's ld.so.cache",
		Usage:   "--folder DIR [--folder ...] [--host-driver-version VERSION]",
		Help: `Run by the container runtime as a createContainer hook, with the container
state on stdin. Adds the shared libraries in each --folder (a container path) to
the container's /etc/ld.so.cache, ahead of the image's own entries of the same
name, and lists the folders in /etc/ld.so.conf.d/000-gantry.conf so that a later
ldconfig in the container keeps them. No program from the image is run (nor
ldconfig): the cache is read and written here, every path resolved inside the
container's root. An unreadable cache in the image is replaced, with a warning;
other errors fail the container.

With --host-driver-version (gantry cdi generate adds it), CUDA forward
compatibility is applied: when the image's /usr/local/cuda/compat holds one
libcuda.so.X.Y.Z whose major version X is greater than the host driver's, its
libraries are put ahead of the host driver's, as NVIDIA's enable-cuda-compat hook
arranges. Folders named by /etc/ld.so.conf.d/00-compat-*.conf in the container
(enable-cuda-compat's files) are added first, the way NVIDIA's ldconfig run
would read them.`,
		Flags: func(fs *flag.FlagSet) func([]string, io.Reader, func(string)) error {
			var folders repeated
			fs.Var(&folders, "folder", "container directory holding injected libraries (repeatable)")
			hostDriver := fs.String("host-driver-version", "", "the host's driver version, e.g. 580.159.04: enables CUDA forward compatibility")
			// NVIDIA's hook runs the image's ldconfig and takes its path;
			// this one runs no program from the image, so the flag is
			// accepted (specs written by nvidia-ctk pass it) and unused.
			fs.String("ldconfig-path", "", "accepted for NVIDIA's specs and unused: no ldconfig is run")
			return func(args []string, in io.Reader, warn func(string)) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				if len(folders) == 0 {
					return usagef("need at least one --folder")
				}
				for _, f := range folders {
					if !strings.HasPrefix(f, "/") {
						return usagef("--folder %q: want an absolute container path", f)
					}
				}
				root, err := OpenRoot(in)
				if err != nil {
					return err
				}
				defer root.Close()
				compat, err := compatConfDirs(root)
				if err != nil {
					return err
				}
				return UpdateLDCacheCompat(root, append(compat, folders...), *hostDriver, warn)
			}
		},
	},
}

// Lookup returns the subcommand called name, or nil.
func Lookup(name string) *Command {
	for _, c := range Commands {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Main runs the CDI hook binary: args is the whole argument vector, args[0]
// the name it was run under (gantry-cdi-hook, or nvidia-cdi-hook where it is
// installed under NVIDIA's name; only messages use it), args[1] the
// subcommand. It reads the container state from stdin and nothing else: no
// configuration file and no environment variable, for a createContainer
// hook's environment is whatever the spec gives it, and a spec without one
// hands it the image's. It returns the exit code: 0, 1 for a failure, 2 for
// a usage error.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	prog := "gantry-cdi-hook"
	if len(args) > 0 && args[0] != "" {
		prog = filepath.Base(args[0])
	}
	// NVIDIA's global flags, which come before the subcommand: logging
	// levels. The hooks log only warnings and errors either way.
	for len(args) > 1 && isGlobalFlag(args[1]) {
		args = append(args[:1:1], args[2:]...)
	}
	if len(args) < 2 || isHelp(args[1]) {
		w, code := stdout, 0
		if len(args) < 2 {
			w, code = stderr, 2
		}
		overview(w, prog)
		return code
	}
	if args[1] == "--version" || args[1] == "version" {
		fmt.Fprintf(stdout, "%s (gantry) %s\n", prog, version.Version)
		return 0
	}
	c := Lookup(args[1])
	if c == nil {
		// A hook this binary does not know comes from a spec written by a
		// newer (or older) nvidia-ctk. Failing would stop every container
		// using the spec; NVIDIA's binary warns and succeeds, and so do we.
		fmt.Fprintf(stderr, "%s: warning: unsupported CDI hook %q ignored (see %s --help for the hooks this version runs)\n", prog, args[1], prog)
		return 0
	}
	name := prog + " " + c.Name
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	run := c.Flags(fs)
	spec := fs.String("container-spec", "", "read the container state from this file instead of stdin ('-' or empty: stdin)")
	if err := fs.Parse(args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage: %s %s\n\n%s\n\nFlags:\n", name, c.Usage, c.Help)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(stderr, "%s: %v (see %s --help)\n", name, err, name)
		return 2
	}
	warn := func(w string) { fmt.Fprintf(stderr, "%s: warning: %s\n", name, w) }
	if *spec != "" && *spec != "-" {
		f, err := os.Open(*spec)
		if err != nil {
			fmt.Fprintf(stderr, "%s: --container-spec: %v\n", name, err)
			return 1
		}
		defer f.Close()
		stdin = f
	}
	if err := run(fs.Args(), stdin, warn); err != nil {
		var ue UsageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "%s: %s (see %s --help)\n", name, ue.Msg, name)
			return 2
		}
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

// isGlobalFlag reports NVIDIA's nvidia-cdi-hook flags that go before the
// subcommand (--debug, -d, --quiet), which specs or wrappers may pass.
func isGlobalFlag(s string) bool {
	name, _, _ := strings.Cut(strings.TrimLeft(s, "-"), "=")
	return strings.HasPrefix(s, "-") && (name == "debug" || name == "d" || name == "quiet")
}

func isHelp(s string) bool { return s == "-h" || s == "--help" || s == "help" || s == "-help" }

func overview(w io.Writer, prog string) {
	fmt.Fprintf(w, `%s: the OCI createContainer hooks of Gantry's CDI specs.

Usage: %s COMMAND [flags] < container-state.json

The container runtime runs these as root with the container's state on stdin
(the bundle's config.json names the root filesystem). They read no
configuration and use nothing from their environment: everything comes from
the arguments and the state. The binary is statically linked, so no dynamic
loader (and no LD_PRELOAD) ever runs for it.

Commands:
`, prog, prog)
	for _, c := range Commands {
		if !c.Hidden {
			fmt.Fprintf(w, "  %-34s %s\n", c.Name, c.Summary)
		}
	}
	fmt.Fprintf(w, `
A command this version does not know is warned about on stderr and succeeds
(exit 0), as NVIDIA's nvidia-cdi-hook does: a spec written by a newer nvidia-ctk
must not stop containers. Global flags --debug/-d and --quiet are accepted.

See %s COMMAND --help.
`, prog)
}
