package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/cdispec"
	"github.com/gantry-gpu/gantry/internal/ocibundle"
)

// maxSpecInput bounds a spec read from a file or stdin: a spec for eight
// GPUs is tens of kilobytes.
const maxSpecInput = 16 << 20

func init() {
	register(&command{
		name:    "cdi transform root",
		summary: "Rewrite a CDI spec's paths from one root to another (a driver container's spec for the host)",
		help: `Reads a CDI spec (--input FILE, or stdin) and replaces the leading directory
--from with --to in its paths, then validates it and prints it or writes it
atomically (--output). With --relative-to host (the default) the host side
changes: device nodes' hostPath (their path when they have none), mounts'
hostPath and hooks' path. With --relative-to container the container side
changes: device nodes' path, mounts' containerPath and the paths in the
createContainer and startContainer hooks' arguments (both sides of TARGET::LINK).
A path changes only when it is --from or lies under it.

  gantry cdi transform root --from /run/nvidia/driver --to / --input spec.yaml --output /etc/cdi/nvidia.yaml`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			from := fs.String("from", "", "the root the spec's paths are under (required)")
			to := fs.String("to", "", "the root they move to (required)")
			input := fs.String("input", "-", "the spec file to read; - reads stdin")
			output := fs.String("output", "", "write the spec here (atomically) instead of stdout")
			format := fs.String("format", "", "yaml or json (default: from --output's extension, else yaml)")
			relTo := fs.String("relative-to", "host", "host or container: which side of the paths changes")
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				if *from == "" || *to == "" || !filepath.IsAbs(*from) || !filepath.IsAbs(*to) {
					return usagef("need --from and --to, both absolute paths")
				}
				if *relTo != "host" && *relTo != "container" {
					return usagef("--relative-to %q: use host or container", *relTo)
				}
				switch *format {
				case "", "yaml", "json":
				default:
					return usagef("--format %q: use yaml or json", *format)
				}
				var in io.Reader = os.Stdin
				if *input != "-" {
					f, err := os.Open(*input)
					if err != nil {
						return fmt.Errorf("reading the spec: %w", err)
					}
					defer f.Close()
					in = f
				}
				b, err := ocibundle.ReadAtMost(in, maxSpecInput, "the CDI spec")
				if err != nil {
					return err
				}
				spec, err := cdi.ParseSpec(b)
				if err != nil {
					return fmt.Errorf("parsing the CDI spec %s: %w", *input, err)
				}
				TransformRoot(spec, filepath.Clean(*from), filepath.Clean(*to), *relTo == "container")
				if err := cdispec.Validate(spec); err != nil {
					return fmt.Errorf("the transformed spec: %w", err)
				}
				if *output == "" {
					f := *format
					if f == "" {
						f = "yaml"
					}
					out, err := cdispec.Marshal(spec, f)
					if err != nil {
						return err
					}
					_, err = e.stdout.Write(out)
					return err
				}
				return cdispec.Write(spec, *output, *format)
			}
		},
	})
}

// TransformRoot moves the spec's paths under from to under to, on the host
// side or (container) the container side; see gantry cdi transform root.
func TransformRoot(spec *specs.Spec, from, to string, container bool) {
	move := func(p string) string {
		if p == from {
			return to
		}
		rel, ok := strings.CutPrefix(p, strings.TrimSuffix(from, "/")+"/")
		if !ok || p == "" {
			return p
		}
		return filepath.Join(to, rel)
	}
	edits := []*specs.ContainerEdits{&spec.ContainerEdits}
	for i := range spec.Devices {
		edits = append(edits, &spec.Devices[i].ContainerEdits)
	}
	for _, e := range edits {
		for _, d := range e.DeviceNodes {
			if container {
				d.Path = move(d.Path)
			} else {
				if d.HostPath == "" {
					d.HostPath = d.Path
				}
				d.HostPath = move(d.HostPath)
			}
		}
		for _, m := range e.Mounts {
			if container {
				m.ContainerPath = move(m.ContainerPath)
			} else {
				m.HostPath = move(m.HostPath)
			}
		}
		for _, h := range e.Hooks {
			if !container {
				h.Path = move(h.Path)
				continue
			}
			if h.HookName != "createContainer" && h.HookName != "startContainer" {
				continue
			}
			for i, a := range h.Args {
				if t, l, ok := strings.Cut(a, "::"); ok {
					h.Args[i] = move(t) + "::" + move(l)
				} else {
					h.Args[i] = move(a)
				}
			}
		}
	}
}
