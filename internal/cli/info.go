package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/gantry-gpu/gantry/internal/cdicmd"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

func init() {
	register(&command{
		name:    "info",
		summary: "Show the driver and every GPU: model, UUID, bus location, architecture, MIG devices",
		help: `The same facts as nvidia-container-cli info, from NVML (or the simulator with
--gpus sim:PROFILE). --json prints the full discovery result, including memory,
NUMA node, brand and NVLink peers.`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				sys, err := discover.GPUs(e.cfg, false)
				if err != nil {
					return err
				}
				if *asJSON {
					return writeJSON(e.stdout, sys)
				}
				printInfo(e.stdout, sys)
				return nil
			}
		},
	})
	register(&command{
		name:    "list",
		summary: "List every device node, library, binary, socket and firmware file a GPU container gets",
		help: `Lists the host files Gantry injects into a container that asks for all GPUs
with the given capabilities (default: all capabilities), found under --driver-root.
--json prints each file with its container path, kind, capability and SONAME.`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			asJSON := fs.Bool("json", false, "print JSON")
			capsFlag := fs.String("capabilities", "all", "comma list of driver capabilities (compute, compat32, graphics, utility, video, display, ngx) or all")
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				caps, err := parseCapabilities(*capsFlag)
				if err != nil {
					return usagef("--capabilities: %v", err)
				}
				sys, inv, err := e.host(true)
				if err != nil {
					return err
				}
				files := listFiles(sys, inv, caps, e.cfg.EffectiveDevRoot())
				if *asJSON {
					return writeJSON(e.stdout, files)
				}
				for _, f := range files {
					fmt.Fprintln(e.stdout, f.HostPath)
				}
				return nil
			}
		},
	})
}

func printInfo(w io.Writer, sys *gpu.System) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "NVRM version:\t%s\n", sys.DriverVersion)
	fmt.Fprintf(tw, "CUDA version:\t%s\n", sys.CUDADriverVersion)
	if strings.HasPrefix(sys.Backend, "sim:") {
		fmt.Fprintf(tw, "Backend:\t%s (simulated GPUs)\n", sys.Backend)
	}
	for _, d := range sys.Devices {
		fmt.Fprintf(tw, "\nDevice Index:\t%d\n", d.Index)
		fmt.Fprintf(tw, "Device Minor:\t%d\n", d.Minor)
		fmt.Fprintf(tw, "Model:\t%s\n", d.Name)
		fmt.Fprintf(tw, "Brand:\t%s\n", d.Brand)
		fmt.Fprintf(tw, "GPU UUID:\t%s\n", d.UUID)
		fmt.Fprintf(tw, "Bus Location:\t%s\n", d.PCIBusID)
		fmt.Fprintf(tw, "Architecture:\t%s\n", d.ComputeCapability)
		for _, m := range d.MIGDevices {
			fmt.Fprintf(tw, "\n    Device Index:\t%s\n", m.Name())
			fmt.Fprintf(tw, "    Profile:\t%s\n", m.Profile)
			fmt.Fprintf(tw, "    GPU Instance ID:\t%d\n", m.GPUInstance)
			fmt.Fprintf(tw, "    Compute Instance ID:\t%d\n", m.ComputeInstance)
			fmt.Fprintf(tw, "    MIG UUID:\t%s\n", m.UUID)
		}
	}
	tw.Flush()
}

// listFiles is every host file a container with all GPUs and caps gets: the
// GPUs' device nodes first, then the driver's files.
func listFiles(sys *gpu.System, inv *driver.Inventory, caps []driver.Capability, devRoot string) []driver.File {
	var out []driver.File
	for _, d := range sys.Devices {
		if f, err := driver.StatDevice(devRoot, d.DevicePath()); err == nil {
			out = append(out, f)
		}
	}
	return append(out, inv.Files(caps)...)
}

func parseCapabilities(s string) ([]driver.Capability, error) { return cdicmd.ParseCapabilities(s) }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// host discovers the GPUs (light: from procfs where that is enough) and the
// driver's files, and warns on stderr about driver files that are missing.
func (e *env) host(light bool) (*gpu.System, *driver.Inventory, error) {
	if light {
		return cdicmd.Host(e.cfg, e.stderr)
	}
	sys, err := discover.GPUs(e.cfg, false)
	if err != nil {
		return nil, nil, err
	}
	inv, err := discover.Driver(e.cfg)
	if err != nil {
		return nil, nil, err
	}
	cdicmd.ReportGaps(e.stderr, inv)
	return sys, inv, nil
}
