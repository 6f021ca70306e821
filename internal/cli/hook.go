package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/gantry-gpu/gantry/internal/containerhook"
)

// stdin is where hooks read the container state; tests replace it.
var stdin = func() *os.File { return os.Stdin }

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
