package cli

import (
	"flag"
	"fmt"
	"strings"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
)

func init() {
	register(&command{
		name:  "runtime configure",
		texts: runtimeConfigureTexts,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			engine := fs.String("runtime", "", engineconfig.EngineList()+" (required)")
			path := fs.String("config-file", "", "the engine's configuration file (default: the engine's standard path)")
			name := fs.String("name", engineconfig.DefaultRuntimeName, "runtime name to register")
			also := fs.String("also-name", "gantry", "comma list of further names for the same runtime (empty for none)")
			runtimePath := fs.String("runtime-path", engineconfig.DefaultRuntimePath, "path of the gantry-runtime binary")
			setDefault := fs.Bool("set-as-default", false, "make it the engine's default runtime")
			dryRun := fs.Bool("dry-run", false, "print the diff only; write nothing")
			enableCDI := fs.Bool("enable-cdi", false, "also turn on the engine's CDI support (docker: features.cdi; containerd: enable_cdi; CRI-O: always on)")
			dropIn := fs.String("drop-in", "", "containerd: write the runtime to this drop-in (e.g. "+engineconfig.DefaultContainerdDropIn+") and make --config-file import it, instead of editing --config-file itself")
			source := fs.String("config-source", string(engineconfig.SourceFile), "where the configuration to edit is read: file (the file as written, comments kept), command (containerd config dump / crio config: the engine's merged view with its defaults) or command,file (command where the engine's program is found)")
			engineBin := fs.String("executable-path", "", "the engine's program ("+programList()+") that checks the result, and that --config-source=command runs (default: found on PATH)")
			noCheck := fs.Bool("no-engine-check", false, "do not run the engine's program on the result (e.g. a file for another host); Gantry's reader still checks it")
			nvidiaForm := fs.Bool("nvidia-form", false, "docker: write the entry as NVIDIA's nvidia-ctk does ({\"path\": ..., \"args\": []}; the path may be a name on dockerd's PATH); nvidia-ctk runtime configure sets it")
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				if *engine == "" {
					return usagef("--runtime is required: %s", engineconfig.EngineList())
				}
				eng, err := engineconfig.ParseEngine(*engine)
				if err != nil {
					return usagef("--runtime: %v", err)
				}
				p := *path
				if p == "" {
					p = engineconfig.DefaultPath(eng)
				}
				var extra []string
				for _, n := range strings.Split(*also, ",") {
					if n = strings.TrimSpace(n); n != "" && n != *name {
						extra = append(extra, n)
					}
				}
				src, err := engineconfig.ParseConfigSource(*source)
				if err != nil {
					return usagef("--config-source: %v", err)
				}
				opts := engineconfig.Options{RuntimeName: *name, ExtraNames: extra, RuntimePath: *runtimePath, SetAsDefault: *setDefault, EnableCDI: *enableCDI,
					NVIDIAForm: *nvidiaForm, Source: src, EngineBinary: *engineBin, SkipEngineCheck: *noCheck}
				if *dropIn != "" {
					if eng != engineconfig.Containerd {
						return usagef("--drop-in is for containerd: for %s give the file with --config-file (CRI-O's default is already the drop-in %s)", eng, engineconfig.DefaultPath(engineconfig.CRIO))
					}
					return configureDropIn(e, p, *dropIn, opts, *dryRun)
				}
				diff, changes, err := engineconfig.Apply(eng, p, opts, *dryRun)
				if err != nil {
					return err
				}
				if len(changes) == 0 {
					fmt.Fprintf(e.stdout, "%s already configured; nothing to change\n", p)
					return nil
				}
				fmt.Fprint(e.stdout, diff)
				for _, c := range changes {
					fmt.Fprintf(e.stderr, "%s: %s\n", p, c)
				}
				if *dryRun {
					fmt.Fprintf(e.stderr, "dry run: %s not written\n", p)
				} else {
					fmt.Fprintf(e.stderr, "wrote %s; restart %s to use it\n", p, eng)
				}
				return nil
			}
		},
	})
}

// configureDropIn is runtime configure --runtime containerd --drop-in.
func configureDropIn(e *env, mainPath, dropIn string, opts engineconfig.Options, dryRun bool) error {
	files, err := engineconfig.ApplyContainerdDropIn(mainPath, dropIn, opts, dryRun)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		fmt.Fprintf(e.stdout, "%s and %s already configured; nothing to change\n", mainPath, dropIn)
		return nil
	}
	for _, f := range files {
		fmt.Fprint(e.stdout, f.Diff)
		for _, c := range f.Changes {
			fmt.Fprintf(e.stderr, "%s: %s\n", f.Path, c)
		}
	}
	for _, f := range files {
		if dryRun {
			fmt.Fprintf(e.stderr, "dry run: %s not written\n", f.Path)
		} else {
			fmt.Fprintf(e.stderr, "wrote %s\n", f.Path)
		}
	}
	if !dryRun {
		fmt.Fprintf(e.stderr, "restart containerd to use it\n")
	}
	return nil
}

// runtimeConfigureTexts are runtime configure's summary and help, with a
// line for each registered engine (engineconfig.Definitions).
func runtimeConfigureTexts() (summary, help string) {
	defs := engineconfig.Definitions()
	var b strings.Builder
	b.WriteString("Edits the engine's configuration so that containers can run with the GPU runtime:\n")
	var restarts []string
	for _, d := range defs {
		fmt.Fprintf(&b, "  %-11s %s\n", d.Name, d.Writes)
		restarts = append(restarts, d.Restart)
	}
	b.WriteString(`Everything already in the file is kept. Before the file is replaced, the engine's own
program reads the result, and a result the engine would not load is refused and the
file left as it was (--executable-path names the program, found on PATH otherwise):
`)
	for _, d := range defs {
		if d.CheckHelp != "" {
			fmt.Fprintf(&b, "  %-11s %s\n", d.Name, d.CheckHelp)
		}
	}
	fmt.Fprintf(&b, `The old file is kept as FILE.gantry-backup, the new one replaces it atomically, and
the change is printed as a diff. --dry-run prints the diff and writes nothing.
Restart the engine afterwards (%s).
`, restartList(restarts))
	b.WriteString(runtimeConfigureHelpTail)
	return "Register Gantry's runtime with " + engineconfig.EngineTitles() + " (under the name nvidia)", b.String()
}

// restartList is "systemctl restart docker / containerd / crio".
func restartList(cmds []string) string {
	const sc = "systemctl restart "
	short := make([]string, len(cmds))
	for i, c := range cmds {
		if !strings.HasPrefix(c, sc) {
			return strings.Join(cmds, " / ")
		}
		short[i] = strings.TrimPrefix(c, sc)
	}
	return sc + strings.Join(short, " / ")
}

// programList is the engines' programs: "dockerd, containerd or crio".
func programList() string {
	var p []string
	for _, d := range engineconfig.Definitions() {
		p = append(p, d.Program)
	}
	if len(p) < 2 {
		return strings.Join(p, "")
	}
	return strings.Join(p[:len(p)-1], ", ") + " or " + p[len(p)-1]
}

const runtimeConfigureHelpTail = `
--config-source=file (the default) edits the file as written, so its comments stay;
--config-source=command starts from containerd config dump (the file, its imports and
containerd's built-in defaults: what the daemon loads when it starts) and writes that
whole view with the runtime added, as NVIDIA's --config-source=command does.

  gantry runtime configure --runtime docker --set-as-default
  gantry runtime configure --runtime containerd --dry-run
  gantry runtime configure --runtime containerd --drop-in /etc/containerd/conf.d/99-nvidia.toml

With --drop-in (containerd), the runtime goes into that file instead, with a copy
of config.toml's CRI plugin section (containerd before 2.1 replaces the section
wholesale with an imported one), and config.toml gets an imports entry for the
drop-in's directory (DIR/*.toml), as NVIDIA's toolkit 1.17+ does. Run it again
after editing config.toml's CRI section.
  gantry runtime configure --runtime docker --enable-cdi   (docker run --device nvidia.com/gpu=0)`
