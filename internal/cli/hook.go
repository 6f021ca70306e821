package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gantry-gpu/gantry/internal/cdispec"
	"github.com/gantry-gpu/gantry/internal/containerhook"
	"github.com/gantry-gpu/gantry/internal/edits"
)

// stdin is where hooks read the container state; tests replace it.
var stdin = func() *os.File { return os.Stdin }

// HookGuard is what `gantry hook SUB ARGS` (and gantry run as `nvidia-ctk
// hook SUB ARGS`) does first, from main, before the CLI parses anything. gantry is
// dynamically linked: when a runtime hands it the image's environment (a CDI
// spec written before gantry-cdi-hook existed, whose hook has no env, on
// runc before 1.2), the loader has run the image's LD_PRELOAD as host root
// before this code, and nothing here can undo that. So a loader variable in
// the environment is a refusal naming the fix (rewrite the spec), which
// fails the container rather than letting such a spec look healthy. Without
// one, the work is done by the static gantry-cdi-hook beside this binary,
// run with the fixed hook environment; without that binary, here (the
// environment holds nothing the loader acts on).
func HookGuard(name string, args []string) error {
	if containerhook.Lookup(name) == nil {
		return nil // --help, or a hook this build does not know: the CLI says so
	}
	if vars := containerhook.LoaderVars(os.Environ()); len(vars) > 0 {
		return fmt.Errorf("refusing to run: the environment holds %s, the dynamic loader's variables (an image's, given to a CDI spec's hook that has no env): gantry is dynamically linked, so the loader already acted on them; rewrite the spec to run the static gantry-cdi-hook with an explicit env: sudo gantry cdi fix-hooks (sudo gantry doctor lists every such spec)", strings.Join(vars, ", "))
	}
	exe, err := os.Executable()
	if err != nil {
		return nil
	}
	hook := cdispec.HookBeside(exe)
	if hook == "" {
		return nil
	}
	err = syscall.Exec(hook, append([]string{filepath.Base(hook), name}, args...), edits.HookEnv())
	return fmt.Errorf("running %s: %w", hook, err)
}

// The CDI hooks, `gantry hook create-symlinks|update-ldcache`, are what CDI
// specs written before gantry-cdi-hook existed run. They are the same
// commands as that binary's (package containerhook), and like it they read
// no configuration: they run as root with whatever environment the spec
// gives them, which for a spec without an env is the image's, so
// GANTRY_CONFIG and --config are not theirs to read (noConfig).
func init() {
	for _, hc := range containerhook.Commands {
		if hc.Hidden {
			continue
		}
		register(&command{
			name:     "hook " + hc.Name,
			summary:  "OCI hook of older CDI specs (now gantry-cdi-hook): " + hc.Summary,
			usage:    hc.Usage,
			help:     hc.Help + "\n\nThe same as gantry-cdi-hook " + hc.Name + ", which new specs run. Reads no\nconfiguration (neither $GANTRY_CONFIG nor --config) and takes no global flags.",
			noConfig: true,
			flags: func(fs *flag.FlagSet) func(*env, []string) error {
				run := hc.Flags(fs)
				return func(e *env, args []string) error {
					in := stdin()
					if in != os.Stdin {
						defer in.Close()
					}
					warn := func(w string) { fmt.Fprintf(e.stderr, "gantry hook %s: warning: %s\n", hc.Name, w) }
					err := run(args, in, warn)
					var ue containerhook.UsageError
					if errors.As(err, &ue) {
						return usagef("%s", ue.Msg)
					}
					return err
				}
			},
		})
	}
}
