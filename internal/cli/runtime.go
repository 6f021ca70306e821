package cli

import (
	"flag"
	"fmt"
	"strings"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
)

func init() {
	register(&command{
		name:    "runtime configure",
		summary: "Register Gantry's runtime with Docker, containerd or CRI-O (under the name nvidia)",
		help: `Edits the engine's configuration so that containers can run with the GPU runtime:
  docker      /etc/docker/daemon.json: "runtimes": {"nvidia": {"path": ...}}
  containerd  /etc/containerd/config.toml (version 2, 3 and 4 layouts): a runc-v2 runtime
              "nvidia" whose options.BinaryName is the runtime, copying runc's options,
              and the default runtime's own entry (runc) when the file has none:
              containerd 1.x forgets its built-in runc once the file defines a runtime
  crio        /etc/crio/crio.conf.d/99-nvidia.toml: [crio.runtime.runtimes.nvidia]
Everything already in the file is kept. Before the file is replaced, the engine's own
program reads the result: containerd --config FILE config dump (which must show the
default runtime and ours), dockerd --validate (Docker 23+; 20.10 has none, and Gantry
reads the runtimes as dockerd does), crio config; a result the engine would not load is
refused and the file left as it was (--executable-path names the program, found on
PATH otherwise). The old file is kept as FILE.gantry-backup, the new one replaces it
atomically, and the change is printed as a diff. --dry-run prints the diff and writes
nothing. Restart the engine afterwards (systemctl restart docker / containerd / crio).

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
  gantry runtime configure --runtime docker --enable-cdi   (docker run --device nvidia.com/gpu=0)`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			engine := fs.String("runtime", "", "docker, containerd or crio (required)")
			path := fs.String("config-file", "", "the engine's configuration file (default: the engine's standard path)")
			name := fs.String("name", engineconfig.DefaultRuntimeName, "runtime name to register")
			also := fs.String("also-name", "gantry", "comma list of further names for the same runtime (empty for none)")
			runtimePath := fs.String("runtime-path", engineconfig.DefaultRuntimePath, "path of the gantry-runtime binary")
			setDefault := fs.Bool("set-as-default", false, "make it the engine's default runtime")
			dryRun := fs.Bool("dry-run", false, "print the diff only; write nothing")
			enableCDI := fs.Bool("enable-cdi", false, "also turn on the engine's CDI support (docker: features.cdi; containerd: enable_cdi; CRI-O: always on)")
			dropIn := fs.String("drop-in", "", "containerd: write the runtime to this drop-in (e.g. "+engineconfig.DefaultContainerdDropIn+") and make --config-file import it, instead of editing --config-file itself")
			source := fs.String("config-source", string(engineconfig.SourceFile), "where the configuration to edit is read: file (the file as written, comments kept), command (containerd config dump / crio config: the engine's merged view with its defaults) or command,file (command where the engine's program is found)")
			engineBin := fs.String("executable-path", "", "the engine's program (containerd, dockerd or crio) that checks the result, and that --config-source=command runs (default: found on PATH)")
			noCheck := fs.Bool("no-engine-check", false, "do not run the engine's program on the result (e.g. a file for another host); Gantry's reader still checks it")
			nvidiaForm := fs.Bool("nvidia-form", false, "docker: write the entry as NVIDIA's nvidia-ctk does ({\"path\": ..., \"args\": []}; the path may be a name on dockerd's PATH); nvidia-ctk runtime configure sets it")
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				if *engine == "" {
					return usagef("--runtime is required: docker, containerd or crio")
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
