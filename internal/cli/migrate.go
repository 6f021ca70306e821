package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"

	"github.com/gantry-gpu/gantry/internal/config"
)

func init() {
	register(&command{
		name:    "config migrate",
		summary: "Translate NVIDIA's container toolkit config.toml into a Gantry configuration",
		usage:   "[FILE]",
		help: `Reads NVIDIA's container toolkit configuration (FILE, default $` + config.NVIDIAEnvPath + ` or
` + config.NVIDIADefaultPath + `) and prints the equivalent Gantry configuration, in the
shape of gantry config default. Comments at its end name what became of every NVIDIA key:
carried over (nvidia-container-cli.root -> driver-root, ...), not needed by Gantry (ldconfig,
load-kmods, the hook and CLI paths, ...), not supported (a value containers would notice:
those are also printed on stderr as warnings), or unknown. Unknown keys are not an error.

  gantry config migrate                                   print, write nothing
  gantry config migrate --write /etc/gantry/config.toml   write it (atomically)

--write refuses to replace an existing file unless --force is given.
nvidia-container-runtime.runtimes becomes runtime.low-level: the first candidate found
in PATH, as NVIDIA's runtime picks it.`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			write := fs.String("write", "", "write the configuration to this file instead of printing it")
			force := fs.Bool("force", false, "with --write: replace the file if it exists")
			return func(e *env, args []string) error {
				if len(args) > 1 {
					return usagef("unexpected argument %q: give at most one file", args[1])
				}
				if *force && *write == "" {
					return usagef("--force needs --write FILE")
				}
				src := config.NVIDIADefaultPath
				if p := os.Getenv(config.NVIDIAEnvPath); p != "" {
					src = p
				}
				if len(args) == 1 {
					src = args[0]
				}
				b, err := os.ReadFile(src)
				if err != nil {
					return fmt.Errorf("reading NVIDIA's configuration: %w (name the file: gantry config migrate FILE)", err)
				}
				mg, err := config.MigrateNVIDIA(b, config.MigrateOptions{LookPath: exec.LookPath})
				if err != nil {
					return fmt.Errorf("%s: %w", src, err)
				}
				out, err := mg.Encode(src)
				if err != nil {
					return fmt.Errorf("%s: %w", src, err)
				}
				for _, n := range mg.Notes {
					if n.Kind == config.Unsupported {
						fmt.Fprintf(e.stderr, "warning: %s: %s = %s: %s\n", src, n.Key, n.Value, n.Reason)
					}
				}
				if *write == "" {
					_, err = e.stdout.Write(out)
					return err
				}
				if err := config.WriteFile(*write, out, *force); err != nil {
					if errors.Is(err, config.ErrExists) {
						return fmt.Errorf("%s exists; not replaced (add --force to replace it, or print the result without --write and compare)", *write)
					}
					return fmt.Errorf("writing %s: %w", *write, err)
				}
				c := mg.Counts()
				fmt.Fprintf(e.stderr, "wrote %s: %d NVIDIA keys carried over, %d not needed, %d not supported, %d unknown (see the comments at its end)\n",
					*write, c[config.Mapped], c[config.Ignored], c[config.Unsupported], c[config.Unknown])
				return nil
			}
		},
	})
}
