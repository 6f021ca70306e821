package nvcli

import (
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/inject"
	"github.com/gantry-gpu/gantry/internal/nsmount"
	"github.com/gantry-gpu/gantry/internal/request"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

var configureOptions = []option{
	{long: "pid", short: 'p', arg: requiredArg, metavar: "PID", help: "a process in the container (default: the parent process, as LXC's hook expects)"},
	{long: "device", short: 'd', arg: requiredArg, metavar: "ID", help: "GPUs to give the container: indices, UUIDs, bus ids, GPU:MIG pairs, MIG UUIDs, all, none (repeatable)"},
	{long: "require", short: 'r', arg: requiredArg, metavar: "EXPR", help: "a requirement the host must meet, as NVIDIA_REQUIRE_* (repeatable)"},
	{long: "ldconfig", short: 'l', arg: requiredArg, metavar: "PATH", help: "accepted and never run: Gantry writes the container's ld.so.cache itself"},
	{long: "compute", short: 'c', help: "CUDA and OpenCL libraries, MPS programs"},
	{long: "utility", short: 'u', help: "NVML and nvidia-smi"},
	{long: "video", short: 'v', help: "video encode and decode libraries"},
	{long: "graphics", short: 'g', help: "OpenGL, Vulkan and EGL libraries"},
	{long: "display", short: 'D', help: "X server modules and /dev/nvidia-modeset"},
	{long: "ngx", short: 'n', help: "the NGX library"},
	{long: "compat32", help: "32-bit libraries"},
	{long: "mig-config", arg: requiredArg, metavar: "ID", help: "grant the MIG config capability (only \"all\")"},
	{long: "mig-monitor", arg: requiredArg, metavar: "ID", help: "grant the MIG monitor capability (only \"all\")"},
	{long: "imex-channel", arg: requiredArg, metavar: "CHANNEL", help: "IMEX channels to give the container: channel numbers (/dev/nvidia-caps-imex-channels/channelN) or all (repeatable, comma lists)"},
	{long: "no-cgroups", help: "do not touch the device cgroup (the caller grants access)"},
	{long: "no-devbind", help: "do not create the device nodes in the container"},
	{long: "no-persistenced", help: "leave out the nvidia-persistenced socket"},
	{long: "no-fabricmanager", help: "leave out the fabric manager socket"},
	{long: "cuda-compat-mode", arg: requiredArg, metavar: "MODE", help: "ldconfig (default) or mount: use the image's newer CUDA forward-compatibility libraries; disabled: never"},
}

func init() {
	commands = append(commands, &command{
		name:    "configure",
		args:    " ROOTFS",
		summary: "Give a created, not yet started container GPUs and the driver",
		help: `
Mounts the driver files for the capabilities asked for and the device nodes of
the GPUs asked for into the container whose process is PID, at ROOTFS (an
absolute path as that process sees it, before it pivots into it: LXC passes
$LXC_ROOTFS_MOUNT), grants the nodes in its device cgroup unless --no-cgroups,
then makes the SONAME links and adds the libraries to the container's
/etc/ld.so.cache. No ldconfig runs, from the image or the host (--ldconfig is
accepted for compatibility and ignored): Gantry writes the cache itself, and
every path inside the container is resolved inside ROOTFS. Requirements are
checked before anything changes.`,
		options: configureOptions,
		run:     runConfigure,
	})
}

// configureRequest is a parsed `configure` command line.
type configureRequest struct {
	pid                             int
	rootfs                          string
	req                             request.Request
	noCgroups, noDevbind            bool
	noPersistenced, noFabricmanager bool
	compat                          bool // use the image's CUDA forward-compatibility libraries
}

var capabilityFlags = map[string]driver.Capability{
	"compute":  driver.Compute,
	"utility":  driver.Utility,
	"video":    driver.Video,
	"graphics": driver.Graphics,
	"display":  driver.Display,
	"ngx":      driver.NGX,
	"compat32": driver.Compat32,
}

func parseConfigure(sets []setting, operands []string) (configureRequest, error) {
	r := configureRequest{compat: true}
	switch len(operands) {
	case 0:
		return r, usagef("missing ROOTFS: the container's root directory (LXC passes $LXC_ROOTFS_MOUNT)")
	case 1:
	default:
		return r, usagef("one ROOTFS expected, got %q", strings.Join(operands, " "))
	}
	r.rootfs = operands[0]
	if !path.IsAbs(r.rootfs) || path.Clean(r.rootfs) == "/" {
		return r, usagef("ROOTFS %q: want the container root's absolute path (not /)", r.rootfs)
	}
	r.rootfs = path.Clean(r.rootfs)

	var devs, migConfig, migMonitor, imex []string
	caps := map[driver.Capability]bool{}
	for _, s := range sets {
		if c, ok := capabilityFlags[s.name]; ok {
			caps[c] = true
			continue
		}
		switch s.name {
		case "pid":
			pid, err := strconv.Atoi(s.value)
			if err != nil || pid <= 0 {
				return r, usagef("--pid=%s: want a process id", s.value)
			}
			r.pid = pid
		case "device":
			devs = append(devs, s.value)
		case "require":
			req, err := request.ParseRequirement("--require", s.value)
			if err != nil {
				return r, usageError{err.Error()}
			}
			r.req.Requirements = append(r.req.Requirements, req)
		case "ldconfig":
			if strings.TrimPrefix(s.value, "@") == "" {
				return r, usagef("--ldconfig=%s: want a path (it is not run)", s.value)
			}
		case "mig-config":
			migConfig = append(migConfig, s.value)
		case "mig-monitor":
			migMonitor = append(migMonitor, s.value)
		case "imex-channel":
			imex = append(imex, s.value)
		case "no-cgroups":
			r.noCgroups = true
		case "no-devbind":
			r.noDevbind = true
		case "no-persistenced":
			r.noPersistenced = true
		case "no-fabricmanager":
			r.noFabricmanager = true
		case "cuda-compat-mode":
			switch s.value {
			case "ldconfig", "mount":
				r.compat = true
			case "disabled":
				r.compat = false
			default:
				return r, usagef("--cuda-compat-mode=%s: want ldconfig, mount or disabled", s.value)
			}
		}
	}
	for _, c := range driver.AllCapabilities {
		if caps[c] {
			r.req.Capabilities = append(r.req.Capabilities, c)
		}
	}
	// No --device: the driver files, no GPU (NVIDIA's CLI does the same; LXC's
	// hook leaves --device out for NVIDIA_VISIBLE_DEVICES=none).
	r.req.Devices = request.Selection{Mode: request.None}
	if len(devs) > 0 {
		sel, err := parseDevices(devs)
		if err != nil {
			return r, err
		}
		r.req.Devices = sel
	}
	var err error
	if r.req.MIGConfig, err = parseMIG("--mig-config", migConfig); err != nil {
		return r, err
	}
	if r.req.MIGMonitor, err = parseMIG("--mig-monitor", migMonitor); err != nil {
		return r, err
	}
	// The channels NVIDIA's runtime hook passes on from
	// NVIDIA_IMEX_CHANNELS (--imex-channel=0,1), read as that variable is.
	if len(imex) > 0 {
		joined := strings.Join(imex, ",")
		if r.req.IMEXChannels, err = request.ParseIMEXChannels(joined); err != nil {
			return r, usageError{strings.ReplaceAll(err.Error(), request.EnvIMEXChannels+"=", "--imex-channel=")}
		}
	}
	return r, nil
}

func runConfigure(c *ctx, sets []setting, operands []string) error {
	r, err := parseConfigure(sets, operands)
	if err != nil {
		return err
	}
	standalone := false
	if r.pid == 0 {
		// No --pid: the container is where we run (LXC's mount hook runs
		// inside its namespaces) or, as NVIDIA's CLI assumes, our parent.
		userns, err := inUserNamespace()
		if err != nil {
			return err
		}
		if userns {
			standalone = true
			if r.pid, err = selfPID(); err != nil {
				return err
			}
		} else {
			r.pid = os.Getppid()
		}
	}
	if r.req.Devices.Mode == request.Void {
		c.log.Info("nothing requested (--device=void)")
		return nil
	}
	cfg, err := c.config()
	if err != nil {
		return err
	}
	rec := inject.NewRecord(inject.FrontEndCLI, strconv.Itoa(r.pid), "")
	err = configure(c, cfg, r, standalone, rec)
	rec.Log(cfg, err)
	return err
}

// configure is the pipeline for one parsed command line: the plan, the
// mounts and nodes in the mount namespace of the container's process, then
// the root filesystem's links and loader cache.
func configure(c *ctx, cfg config.Config, r configureRequest, standalone bool, rec *inject.Record) error {
	// The container's own mounts (LXC's, in its process's mount namespace):
	// the driver tree's mount must not hide one. Read only for that layout.
	var own []string
	if cfg.Runtime.DriverLayout == config.DriverLayoutTree {
		var err error
		if own, err = nsmount.MountPoints(r.pid, r.rootfs); err != nil {
			return fmt.Errorf("reading the mounts of process %d: %w", r.pid, err)
		}
	}
	plan, err := inject.Prepare(cfg, &r.req, inject.Options{
		SpecMounts: own,
		// Requirements judge each GPU's brand and architecture, which
		// only the full discovery reports.
		FullGPUs:      len(r.req.Requirements) > 0,
		ForwardCompat: r.compat,
		DeviceFlag:    "--device=" + strings.Join(r.req.Devices.IDs, ","),
		Inventory: func(inv *driver.Inventory) {
			withoutSockets(inv, r.noPersistenced, r.noFabricmanager)
		},
	}, rec)
	if err != nil {
		return err
	}
	e := plan.Edits
	if r.noDevbind {
		e.DeviceNodes = nil
	}
	c.log.Debug("edits", "devices", len(e.DeviceNodes), "mounts", len(e.Mounts), "symlinks", len(e.Symlinks), "libraryDirs", strings.Join(e.LibraryDirs, ","))

	// The root as the container's mount namespace has it: what is mounted
	// there below is visible through it too. Opened first, so that a wrong
	// ROOTFS fails before anything is mounted.
	rootPath := "/proc/" + strconv.Itoa(r.pid) + "/root" + r.rootfs
	openRoot := func() (*rootfs.Root, error) {
		root, err := rootfs.Open(rootPath)
		if err != nil {
			return nil, fmt.Errorf("container root %s of process %d: %w", r.rootfs, r.pid, err)
		}
		return root, nil
	}
	root, err := openRoot()
	if err != nil {
		return err
	}
	root.Close()

	if standalone {
		err = applyStandalone(r.pid, r.rootfs, e)
	} else {
		err = nsmount.Apply(r.pid, r.rootfs, e, nsmount.Options{NoCgroups: r.noCgroups || cfg.Runtime.NoCgroups})
	}
	if err != nil {
		return err
	}
	rec.Phase("namespace")
	for _, m := range e.Mounts {
		c.log.Debug("mounted", "source", m.HostPath, "target", m.ContainerPath)
	}
	for _, n := range e.DeviceNodes {
		c.log.Debug("device", "path", n.Path, "major", n.Major, "minor", n.Minor)
	}
	note := func(s string) {
		if strings.HasPrefix(s, "CUDA forward compatibility") {
			c.log.Info(s)
			return
		}
		c.log.Warn(s)
		fmt.Fprintf(c.stderr, "%s configure: warning: %s\n", Name, s)
	}
	if err := plan.FinishRootfs(openRoot, note); err != nil {
		return err
	}
	rec.Phase("rootfs")
	c.log.Info("configured", "pid", r.pid, "rootfs", r.rootfs)
	return nil
}
