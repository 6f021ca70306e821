package cli

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/cdispec"
	"github.com/gantry-gpu/gantry/internal/gpu"
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
gantry-cdi-hook beside this gantry, else /usr/bin/gantry-cdi-hook.`,
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
				switch *format {
				case "", "yaml", "json":
				default:
					return usagef("--format %q: use yaml or json", *format)
				}
				if *imex {
					spec, err := cdispec.GenerateIMEX(e.cfg.EffectiveDevRoot())
					if err != nil {
						return err
					}
					return writeSpec(e, spec, *output, *format, "IMEX channels")
				}
				caps, err := parseCapabilities(*capsFlag)
				if err != nil {
					return usagef("--capabilities: %v", err)
				}
				k := e.cfg.CDI.Kind
				if *kind != "" {
					k = *kind
				}
				hook := e.cfg.CDI.HookPath
				if *hookPath != "" {
					if !filepath.IsAbs(*hookPath) {
						return usagef("--hook-path %q: want an absolute path (the runtime runs it from anywhere)", *hookPath)
					}
					hook = *hookPath
				}
				if hook == "" {
					if hook, err = defaultHookPath(); err != nil {
						return err
					}
				}
				for _, p := range libPaths {
					if !filepath.IsAbs(p) {
						return usagef("--library-search-path %q: want an absolute path (inside the driver root)", p)
					}
				}
				e.cfg.LibrarySearchPaths = append(e.cfg.LibrarySearchPaths, libPaths...)
				sys, inv, err := e.host(true)
				if err != nil {
					return err
				}
				if len(inv.Missing) > 0 && !*allowPartial {
					return fmt.Errorf("driver %s under %s is incomplete (%s missing): reinstall the driver or fix --driver-root; --allow-partial writes a spec anyway", inv.Version, inv.Root, strings.Join(inv.Missing, ", "))
				}
				if sys, err = selectDevices(sys, ids); err != nil {
					return usagef("--device-id: %v", err)
				}
				spec, err := cdispec.Generate(sys, inv, cdispec.Options{Kind: k, HookPath: hook, Capabilities: caps, DevRoot: e.cfg.EffectiveDevRoot()})
				if err != nil {
					return err
				}
				if *noAll {
					kept := spec.Devices[:0]
					for _, d := range spec.Devices {
						if d.Name != "all" {
							kept = append(kept, d)
						}
					}
					spec.Devices = kept
				}
				return writeSpec(e, spec, *output, *format, "driver "+inv.Version)
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
				cache, err := cdi.NewCache(cdi.WithSpecDirs(specDirs...), cdi.WithAutoRefresh(false))
				if err != nil {
					return fmt.Errorf("reading CDI specs in %s: %w", strings.Join(specDirs, ", "), err)
				}
				var bad []string
				for path, errs := range cache.GetErrors() {
					for _, err := range errs {
						bad = append(bad, fmt.Sprintf("%s: %v", path, err))
					}
				}
				sort.Strings(bad)
				for _, b := range bad {
					fmt.Fprintf(e.stderr, "warning: %s\n", b)
				}
				names := cache.ListDevices()
				if len(names) == 0 {
					return fmt.Errorf("no CDI devices in %s: run `gantry cdi generate --output /var/run/cdi/nvidia.yaml`", strings.Join(specDirs, ", "))
				}
				sort.Strings(names)
				for _, n := range names {
					fmt.Fprintln(e.stdout, n)
				}
				return nil
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

// selectDevices narrows sys to the devices ids name ("all" or none: every
// GPU): a GPU by index or UUID keeps all its MIG devices; a MIG device by
// GPU:INSTANCE (0:1) or MIG UUID keeps its parent with that MIG device
// only, as nvidia-ctk cdi generate --device-id does. An id matching nothing
// is an error: a spec silently missing a device fails containers later.
func selectDevices(sys *gpu.System, ids []string) (*gpu.System, error) {
	if len(ids) == 0 || (len(ids) == 1 && ids[0] == "all") {
		return sys, nil
	}
	whole := map[int]bool{}        // parent index -> every MIG device
	migs := map[int]map[int]bool{} // parent index -> MIG indexes
	for _, id := range ids {
		found := false
		for _, d := range sys.Devices {
			if id == strconv.Itoa(d.Index) || strings.EqualFold(id, d.UUID) {
				found, whole[d.Index] = true, true
			}
			for _, m := range d.MIGDevices {
				if id == m.Name() || strings.EqualFold(id, m.UUID) {
					if !d.MIGEnabled {
						continue
					}
					found = true
					if migs[d.Index] == nil {
						migs[d.Index] = map[int]bool{}
					}
					migs[d.Index][m.Index] = true
				}
			}
		}
		if !found {
			if strings.Contains(id, ":") || strings.HasPrefix(strings.ToUpper(id), "MIG-") {
				return nil, fmt.Errorf("%q is not a MIG device of this host (GPU:INSTANCE or MIG UUID; see gantry info)", id)
			}
			return nil, fmt.Errorf("%q is not the index or UUID of a GPU of this host (see gantry list)", id)
		}
	}
	out := *sys
	out.Devices = nil
	for _, d := range sys.Devices {
		switch {
		case whole[d.Index]:
			out.Devices = append(out.Devices, d)
		case migs[d.Index] != nil:
			kept := d
			kept.MIGDevices = nil
			for _, m := range d.MIGDevices {
				if migs[d.Index][m.Index] {
					kept.MIGDevices = append(kept.MIGDevices, m)
				}
			}
			out.Devices = append(out.Devices, kept)
		}
	}
	return &out, nil
}

// hookName is the CDI hook binary (cmd/gantry-cdi-hook) that generated specs
// run, and systemHookPath where `make install` puts it.
const (
	hookName       = "gantry-cdi-hook"
	systemHookPath = "/usr/bin/" + hookName
)

// executable is os.Executable; tests place the running gantry elsewhere.
var executable = os.Executable

// defaultHookPath finds the CDI hook binary when cdi.hook-path is empty: the
// gantry-cdi-hook beside the running gantry (bin/ of a build, or where it
// was installed), else systemHookPath. A spec naming a hook that does not
// exist would fail every container that uses it, so a missing one is an
// error here, naming the fix.
func defaultHookPath() (string, error) {
	var tried []string
	if exe, err := executable(); err == nil {
		tried = append(tried, filepath.Join(filepath.Dir(exe), hookName))
	}
	if len(tried) == 0 || tried[0] != systemHookPath {
		tried = append(tried, systemHookPath)
	}
	for _, p := range tried {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("the CDI hook binary %s is missing (looked at %s): install it with `make install`, or set cdi.hook-path in the configuration", hookName, strings.Join(tried, " and "))
}

// writeSpec prints spec to stdout, or writes it atomically to output.
func writeSpec(e *env, spec *specs.Spec, output, format, what string) error {
	if output == "" {
		f := format
		if f == "" {
			f = "yaml"
		}
		b, err := cdispec.Marshal(spec, f)
		if err != nil {
			return err
		}
		_, err = e.stdout.Write(b)
		return err
	}
	if err := cdispec.Write(spec, output, format); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "wrote %s: %d devices of kind %s (%s)\n", output, len(spec.Devices), spec.Kind, what)
	return nil
}
