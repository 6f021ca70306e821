package cli

import (
	"flag"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

// defaultSimGPUs is the simulated host sim driver-root makes a driver
// root for when --gpus names none.
const defaultSimGPUs = "sim:h100x8"

func init() {
	register(&command{
		name:    "sim profiles",
		summary: "List the built-in simulated GPU hosts (for --gpus sim:PROFILE)",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			return func(e *env, args []string) error {
				for _, p := range sim.Profiles() {
					sys, err := sim.Load(p)
					if err != nil {
						return err
					}
					name := ""
					if len(sys.Devices) > 0 {
						name = sys.Devices[0].Name
					}
					fmt.Fprintf(e.stdout, "%-12s %d x %s, driver %s, CUDA %s\n", p, len(sys.Devices), name, sys.DriverVersion, sys.CUDADriverVersion)
				}
				return nil
			}
		},
	})
	register(&command{
		name:    "sim driver-root",
		summary: "Build a fake NVIDIA driver root (real ELF libraries, ld.so.cache, device nodes) in DIR",
		usage:   "DIR",
		help: `Makes a driver root that looks like a real driver install, for trying Gantry and
testing clusters on machines without a GPU: shared objects built with gcc with the
driver's SONAMEs (libcuda.so.1 exports cuInit and cuDriverGetVersion), binaries,
firmware, config files, proc/driver/nvidia/version, a real etc/ld.so.cache made by
ldconfig -r, and dev/nvidia* device nodes (character devices when run as root);
--imex-channels N adds IMEX channel nodes (the DRA class imex.nvidia.com).
Needs gcc and ldconfig.

  gantry sim driver-root /tmp/driver
  gantry --gpus sim:h100x8 --driver-root /tmp/driver cdi generate`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			version := fs.String("version", "", "driver version (default: the simulated profile's, from --gpus, else 580.159.04)")
			layout := fs.String("layout", "standard", "standard (/usr/lib/x86_64-linux-gnu) or gke (/usr/local/nvidia/lib64 plus /lib)")
			count := fs.Int("count", 0, "number of GPU device nodes (default: the simulated profile's GPU count, else 8)")
			imexChannels := fs.Int("imex-channels", 0, "number of IMEX channel nodes, dev/nvidia-caps-imex-channels/channel0..N-1 (default none)")
			return func(e *env, args []string) error {
				if len(args) != 1 {
					return usagef("need exactly one argument, the directory to build in")
				}
				v, n := *version, *count
				// The simulated GPUs the root is made for: those of --gpus
				// (or the configuration's gpus) when simulated, else
				// h100x8's, so that its fake nvidia-smi -L, gantry info and
				// the CDI spec name the same GPUs.
				gpus := e.cfg.GPUs
				if !strings.HasPrefix(gpus, "sim:") {
					gpus = defaultSimGPUs
				}
				sys, err := sim.Load(strings.TrimPrefix(gpus, "sim:"))
				if err != nil {
					return err
				}
				if v == "" {
					v = sys.DriverVersion
				}
				if n == 0 {
					n = len(sys.Devices)
				}
				// The fake nvidia-smi -L names the profile's GPUs.
				var ids []fakedriver.Identity
				for _, d := range sys.Devices {
					ids = append(ids, fakedriver.Identity{Minor: d.Minor, UUID: d.UUID, Name: d.Name})
				}
				if v == "" {
					v = "580.159.04"
				}
				if n == 0 {
					n = 8
				}
				if *layout != "standard" && *layout != "gke" {
					return usagef("--layout %q: use standard or gke", *layout)
				}
				if *imexChannels < 0 || *imexChannels > 2048 {
					return usagef("--imex-channels %d: give 0 to 2048", *imexChannels)
				}
				res, err := fakedriver.Build(args[0], fakedriver.Options{Version: v, Layout: *layout, GPUs: n, DeviceNodes: true, Identities: ids, IMEXChannels: *imexChannels})
				if err != nil {
					return err
				}
				nodes := "character device nodes"
				if !res.RealDeviceNodes {
					nodes = "regular files standing in for device nodes (not root)"
				}
				fmt.Fprintf(e.stdout, "built fake driver %s (%s layout, %d GPUs, %s) in %s\n", v, *layout, n, nodes, args[0])
				for _, d := range sys.Devices {
					fmt.Fprintf(e.stdout, "GPU %d: %s (UUID: %s)\n", d.Index, d.Name, d.UUID)
				}
				dir, err := filepath.Abs(args[0])
				if err != nil {
					return err
				}
				if e.cfg.GPUs != gpus || e.cfg.DriverRoot != dir {
					fmt.Fprintf(e.stdout, "\nTo use it: gantry --gpus %s --driver-root %s info\n", gpus, dir)
					fmt.Fprintf(e.stdout, "For the installed stack (gantry-runtime, the hook, nvidia-ctk, cdi generate), in %s:\n  gpus = %q\n  driver-root = %q\n", config.DefaultPath, gpus, dir)
				}
				return nil
			}
		},
	})
	register(&command{
		name:    "config default",
		summary: "Print the default configuration file, every key documented",
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			return func(e *env, args []string) error {
				b, err := config.Default().Encode()
				if err != nil {
					return err
				}
				_, err = e.stdout.Write(b)
				return err
			}
		},
	})
}
