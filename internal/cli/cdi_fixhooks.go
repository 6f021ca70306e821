package cli

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/internal/cdicmd"
	"github.com/gantry-gpu/gantry/internal/cdispec"
)

func init() {
	register(&command{
		name:    "cdi fix-hooks",
		summary: "Rewrite CDI specs whose hooks run the gantry CLI (or nvidia-ctk hook) without an env",
		usage:   "[FILE|DIR ...]",
		help: `Finds CDI specs (default: in /etc/cdi and /var/run/cdi; or the files and
directories named) with hooks of the forms written before gantry-cdi-hook
existed: ` + "`gantry hook update-ldcache|create-symlinks ...`" + ` (or nvidia-ctk's
` + "`nvidia-ctk hook ...`" + `) with no env. An engine that injects such a spec (containerd,
CRI-O, Podman, Docker's CDI) runs the hook as root on the host with the
image's environment on runc before 1.2, and gantry is dynamically linked:
the image's LD_PRELOAD runs as host root before gantry's own code.

Each such spec is rewritten atomically: gantry hooks run the static
gantry-cdi-hook (--hook-path, else the one beside the gantry the hook
named, else beside this gantry or in /usr/bin) with the explicit env
` + "`PATH=...`" + `, nvidia-ctk hooks keep their program and get the env. The
original is kept beside it as FILE.bak (FILE.bak.N if that exists; engines
load only .yaml and .json files). --dry-run lists what would change.
make install runs this; gantry doctor's check "old cdi hooks" names it.

  sudo gantry cdi fix-hooks
  sudo gantry cdi fix-hooks /etc/cdi/nvidia.yaml`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			hookFlag := fs.String("hook-path", "", "the gantry-cdi-hook the rewritten hooks run (default: beside the hook's gantry, else beside this gantry or in /usr/bin)")
			dryRun := fs.Bool("dry-run", false, "list the specs and hooks that would change, change nothing")
			return func(e *env, args []string) error {
				if *hookFlag != "" && !filepath.IsAbs(*hookFlag) {
					return usagef("--hook-path %q: give an absolute path", *hookFlag)
				}
				paths := args
				if len(paths) == 0 {
					paths = cdispec.DefaultSpecDirs
				}
				hookPath := func(gantry string) (string, error) {
					if *hookFlag != "" {
						return *hookFlag, nil
					}
					if p := cdispec.HookBeside(gantry); p != "" {
						return p, nil
					}
					return cdicmd.DefaultHookPath()
				}
				found, errs := cdispec.FindOldSpecs(paths)
				for _, err := range errs {
					fmt.Fprintf(e.stderr, "gantry cdi fix-hooks: warning: %v\n", err)
				}
				if len(found) == 0 {
					fmt.Fprintf(e.stderr, "no CDI spec in %s has hooks of the old forms\n", strings.Join(paths, ", "))
					return nil
				}
				var failed []error
				for _, o := range found {
					if *dryRun {
						fmt.Fprintf(e.stdout, "%s: would rewrite %d hooks:\n", o.Path, len(o.Hooks))
						for _, h := range o.Hooks {
							fmt.Fprintf(e.stdout, "  %s\n", h)
						}
						continue
					}
					backup, err := cdispec.RewriteOldSpec(o, hookPath)
					if err != nil {
						failed = append(failed, fmt.Errorf("%s: %w", o.Path, err))
						continue
					}
					fmt.Fprintf(e.stdout, "rewrote %s: %d hooks now run with an explicit env (the original is %s)\n", o.Path, len(o.Hooks), backup)
				}
				return errors.Join(failed...)
			}
		},
	})
}
