package cli

import (
	"flag"
	"strings"

	"github.com/gantry-gpu/gantry/internal/cdicmd"
	"github.com/gantry-gpu/gantry/internal/cdispec"
)

func init() {
	register(&command{
		name:    "cdi generate",
		summary: "Write a CDI spec for the host's GPUs (nvidia.com/gpu=0, =UUID, =all, MIG =0:1)",
		help: `Generates a Container Device Interface spec from the GPUs and the driver files
under --driver-root, validates it with the CNCF CDI library, and writes it atomically
(a temporary file renamed into place: readers never see a partial spec).

Podman, CRI-O, containerd and Docker (with CDI enabled) then take devices by name:
  podman run --device nvidia.com/gpu=0 ...
  docker run --device nvidia.com/gpu=all ...

Without --output the spec goes to stdout. The format follows --format, else the
output file's extension (.json or .yaml).

The spec's createContainer hooks (the SONAME links, the container's ld.so.cache)
run gantry-cdi-hook, a static binary that reads no configuration, each with a
fixed environment (PATH only). Its path is cdi.hook-path, by default the
gantry-cdi-hook beside this gantry, else /usr/bin/gantry-cdi-hook.

nvidia-ctk cdi generate writes the same spec (NVIDIA's flags); where make install
linked nvidia-ctk to gantry-runtime it starts a few milliseconds sooner, for
gantry-runtime links none of this CLI's other packages.`,
		usage: "",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			output := fs.String("output", "", "write the spec to FILE (e.g. /var/run/cdi/nvidia.yaml) instead of stdout")
			format := fs.String("format", "", "yaml or json (default: from --output's extension, else yaml)")
			kind := fs.String("kind", "", "CDI kind vendor.com/class (default from config: nvidia.com/gpu)")
			capsFlag := fs.String("capabilities", "all", "driver capabilities whose files the spec injects")
			allowPartial := fs.Bool("allow-partial", false, "write a spec even when the driver lacks libcuda, libnvidia-ml, nvidia-smi or nvidiactl")
			hookPath := fs.String("hook-path", "", "absolute path of the CDI hook binary the spec runs (default: cdi.hook-path, else gantry-cdi-hook beside gantry)")
			noAll := fs.Bool("no-all-device", false, "leave the \"all\" device out of the spec")
			imex := fs.Bool("imex", false, "the IMEX channels' spec instead (kind nvidia.com/imex-channel, one device per /dev/nvidia-caps-imex-channels/channelN; nvidia-ctk's --mode=imex)")
			var ids, libPaths repeated
			fs.Var(&libPaths, "library-search-path", "a further directory (inside the driver root) searched for the driver's libraries, after the ld.so.cache and the standard ones (repeatable, or a comma list; adds to library-search-paths of the configuration)")
			fs.Var(&ids, "device-id", "only this device: a GPU by index or UUID, a MIG device by GPU:INSTANCE or MIG UUID (repeatable, or a comma list; default all)")
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				return cdicmd.Generate(e.cfg, cdicmd.GenerateOptions{
					Output: *output, Format: *format, Kind: *kind, Capabilities: *capsFlag, HookPath: *hookPath,
					AllowPartial: *allowPartial, NoAllDevice: *noAll, IMEX: *imex,
					DeviceIDs: ids, LibrarySearchPaths: libPaths, Log: e.log,
				}, e.stdout, e.stderr)
			}
		},
	})
	register(&command{
		name:    "cdi list",
		summary: "List the CDI device names in the spec directories",
		help: `Reads every CDI spec in the spec directories (default from config:
/etc/cdi and /var/run/cdi) through the CNCF CDI library and prints the fully
qualified device names, one per line. Errors in spec files are reported.`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			dirs := fs.String("spec-dirs", "", "comma list of directories (default from config)")
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				specDirs := e.cfg.CDI.SpecDirs
				if *dirs != "" {
					specDirs = strings.Split(*dirs, ",")
				}
				return cdicmd.List(specDirs, e.stdout, e.stderr)
			}
		},
	})
	_ = cdispec.Names
}

// repeated collects a flag given several times or as a comma list.
type repeated []string

func (r *repeated) String() string { return strings.Join(*r, ",") }
func (r *repeated) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*r = append(*r, v)
		}
	}
	return nil
}
