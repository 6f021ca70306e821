package nvcli

import (
	"fmt"
	"strings"

	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/request"
)

// Sockets the --no-persistenced and --no-fabricmanager options leave out.
const (
	persistencedSocket  = "/run/nvidia-persistenced/socket"
	fabricmanagerSocket = "/run/nvidia-fabricmanager/socket"
)

var listOptions = []option{
	{long: "device", short: 'd', arg: requiredArg, metavar: "ID", help: "list the device nodes of these GPUs (indices, UUIDs, bus ids, GPU:MIG, all; repeatable)"},
	{long: "libraries", short: 'l', help: "list the driver libraries"},
	{long: "binaries", short: 'b', help: "list the driver programs"},
	{long: "ipcs", short: 'i', help: "list the driver IPC sockets and pipe directories"},
	{long: "firmwares", short: 'f', help: "list the GSP firmware files"},
	{long: "compat32", help: "with --libraries, list the 32-bit libraries too"},
	{long: "mig-config", arg: requiredArg, metavar: "ID", help: "list the MIG config capability node (only \"all\")"},
	{long: "mig-monitor", arg: requiredArg, metavar: "ID", help: "list the MIG monitor capability node (only \"all\")"},
	{long: "imex-channel", arg: requiredArg, metavar: "CHANNEL", help: "not supported by list (configure --imex-channel injects the channels)"},
	{long: "no-persistenced", help: "leave out the nvidia-persistenced socket"},
	{long: "no-fabricmanager", help: "leave out the fabric manager socket"},
}

func init() {
	commands = append(commands, &command{
		name:    "list",
		summary: "List the host files a GPU container gets",
		help: `
Prints one host path per line: with --device the driver's control device nodes
and the GPUs' nodes, then the programs, libraries (64-bit, then 32-bit with
--compat32), IPC endpoints and firmware, each group only when asked for.
Without any option, everything is listed for all GPUs.`,
		options: listOptions,
		run:     runList,
	})
}

// listRequest is a parsed `list` command line.
type listRequest struct {
	devices                         request.Selection
	listDevices                     bool
	libs, bins, ipcs, firmware      bool
	compat32                        bool
	migConfig, migMonitor           request.Selection
	noPersistenced, noFabricmanager bool
}

func parseList(sets []setting, operands []string) (listRequest, error) {
	var r listRequest
	if len(operands) > 0 {
		return r, usagef("unexpected argument %q", operands[0])
	}
	if len(sets) == 0 {
		return listRequest{devices: request.Selection{Mode: request.All}, listDevices: true,
			libs: true, bins: true, ipcs: true, firmware: true, compat32: true}, nil
	}
	var devs, migConfig, migMonitor []string
	for _, s := range sets {
		switch s.name {
		case "device":
			devs = append(devs, s.value)
		case "libraries":
			r.libs = true
		case "binaries":
			r.bins = true
		case "ipcs":
			r.ipcs = true
		case "firmwares":
			r.firmware = true
		case "compat32":
			r.compat32 = true
		case "mig-config":
			migConfig = append(migConfig, s.value)
		case "mig-monitor":
			migMonitor = append(migMonitor, s.value)
		case "imex-channel":
			return r, usagef("--imex-channel=%s: list does not list IMEX channels (they are /dev/nvidia-caps-imex-channels/channelN; configure --imex-channel injects them)", s.value)
		case "no-persistenced":
			r.noPersistenced = true
		case "no-fabricmanager":
			r.noFabricmanager = true
		}
	}
	var err error
	if len(devs) > 0 {
		r.listDevices = true
		if r.devices, err = parseDevices(devs); err != nil {
			return r, err
		}
	}
	if r.migConfig, err = parseMIG("--mig-config", migConfig); err != nil {
		return r, err
	}
	if r.migMonitor, err = parseMIG("--mig-monitor", migMonitor); err != nil {
		return r, err
	}
	return r, nil
}

// parseDevices joins repeated --device values with commas, as NVIDIA's CLI
// does, and parses the list. CDI names are refused: this interface names
// devices by ID only.
func parseDevices(vals []string) (request.Selection, error) {
	joined := strings.Join(vals, ",")
	sel, cdi, err := request.ParseSelection("--device", joined)
	if err != nil {
		return sel, usageError{err.Error()}
	}
	if len(cdi) > 0 {
		return sel, usagef("--device=%s: %s is a CDI name; give GPU indices, UUIDs, bus ids or GPU:MIG pairs", joined, cdi[0])
	}
	return sel, nil
}

func parseMIG(flag string, vals []string) (request.Selection, error) {
	if len(vals) == 0 {
		return request.Selection{Mode: request.Void}, nil
	}
	sel, err := request.ParseMIGSelection(flag, strings.Join(vals, ","))
	if err != nil {
		return sel, usageError{err.Error()}
	}
	return sel, nil
}

// withoutSockets drops the sockets the options leave out.
func withoutSockets(inv *driver.Inventory, noPersistenced, noFabricmanager bool) {
	if !noPersistenced && !noFabricmanager {
		return
	}
	kept := inv.Sockets[:0:0]
	for _, f := range inv.Sockets {
		if (noPersistenced && f.ContainerPath == persistencedSocket) || (noFabricmanager && f.ContainerPath == fabricmanagerSocket) {
			continue
		}
		kept = append(kept, f)
	}
	inv.Sockets = kept
}

func runList(c *ctx, sets []setting, operands []string) error {
	r, err := parseList(sets, operands)
	if err != nil {
		return err
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	sys, err := discover.GPUs(cfg, true)
	if err != nil {
		return err
	}
	inv, err := discover.Driver(cfg)
	if err != nil {
		return err
	}
	withoutSockets(inv, r.noPersistenced, r.noFabricmanager)
	devRoot := cfg.EffectiveDevRoot()

	var out []string
	if r.listDevices {
		out = append(out, hostPaths(inv.DeviceNodes)...)
		_, e, err := edits.ForDevices(sys, r.devices, devRoot)
		if err != nil {
			return fmt.Errorf("--device: %w", err)
		}
		for _, n := range e.DeviceNodes {
			out = append(out, n.HostPath)
		}
	}
	if r.migConfig.Mode != request.Void || r.migMonitor.Mode != request.Void {
		e, err := edits.Build(sys, inv, &request.Request{
			Devices:    request.Selection{Mode: request.None},
			MIGConfig:  r.migConfig,
			MIGMonitor: r.migMonitor,
		}, edits.Options{DevRoot: devRoot})
		if err != nil {
			return err
		}
		for _, n := range e.DeviceNodes {
			if strings.HasPrefix(n.Path, "/dev/nvidia-caps/") {
				out = append(out, n.HostPath)
			}
		}
	}
	if r.bins {
		out = append(out, hostPaths(inv.Binaries)...)
	}
	if r.libs {
		var libs32 []driver.File
		for _, f := range inv.Libraries {
			if f.Capability == driver.Compat32 {
				libs32 = append(libs32, f)
				continue
			}
			out = append(out, f.HostPath)
		}
		if r.compat32 {
			out = append(out, hostPaths(libs32)...)
		}
	}
	if r.ipcs {
		out = append(out, hostPaths(inv.Sockets)...)
	}
	if r.firmware {
		out = append(out, hostPaths(inv.Firmware)...)
	}
	seen := map[string]bool{}
	var b strings.Builder
	for _, p := range out {
		if !seen[p] {
			seen[p] = true
			b.WriteString(p)
			b.WriteByte('\n')
		}
	}
	_, err = c.stdout.Write([]byte(b.String()))
	return err
}
