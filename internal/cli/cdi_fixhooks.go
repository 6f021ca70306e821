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

Hooks named by a relative path are found too: a runtime resolves one in
the container's root filesystem and runs the image's file as host root.

Each such spec is rewritten atomically, keeping its mode and owner: gantry
hooks (and hook programs named by a relative path) run the static
gantry-cdi-hook (--hook-path, else the one beside the gantry the hook
named, else beside this gantry or in /usr/bin) with the explicit env
` + "`PATH=...`" + `, nvidia-ctk hooks keep their program and get the env. The
original is kept beside it as FILE.bak (FILE.bak.N if that exists; engines
load only .yaml and .json files). A spec that is a link (NixOS) has its
target rewritten when root alone may write to the target's directories,
else the link is replaced by the rewritten spec and kept as FILE.bak. A
relative path to another program, or a spec that cannot be read, is an
error naming it (exit status 1). --dry-run lists what would change.
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
				// A spec that cannot be read may be one an engine loads:
				// not knowing its hooks is a failure, not a pass.
				var failed []error
				for _, err := range errs {
					failed = append(failed, fmt.Errorf("%w (cannot tell whether its hooks are old)", err))
				}
				if len(found) == 0 {
					if len(failed) == 0 {
						fmt.Fprintf(e.stderr, "no CDI spec in %s has hooks of the old forms\n", strings.Join(paths, ", "))
					}
					return errors.Join(failed...)
				}
				for _, o := range found {
					if *dryRun {
						fmt.Fprintf(e.stdout, "%s: would rewrite %d hooks:\n", o.Path, len(o.Hooks))
						for _, h := range o.Hooks {
							fmt.Fprintf(e.stdout, "  %s\n", h)
						}
						continue
					}
					written, backup, err := cdispec.RewriteOldSpecFile(o, hookPath)
					if err != nil {
						failed = append(failed, fmt.Errorf("%s: %w", o.Path, err))
						continue
					}
					switch {
					case o.Target == "":
						fmt.Fprintf(e.stdout, "rewrote %s: %d hooks now run with an explicit env (the original is %s)\n", o.Path, len(o.Hooks), backup)
					case written == o.Path:
						fmt.Fprintf(e.stdout, "rewrote %s, a link to %s, as a file: %d hooks now run with an explicit env (the link is %s)\n", o.Path, o.Target, len(o.Hooks), backup)
					default:
						fmt.Fprintf(e.stdout, "rewrote %s (%s links to it): %d hooks now run with an explicit env (the original is %s)\n", written, o.Path, len(o.Hooks), backup)
					}
				}
				return errors.Join(failed...)
			}
		},
	})
}
