// Package cdicmd runs `cdi generate` and `cdi list`: the work behind
// `gantry cdi generate` and `gantry cdi list`, and behind NVIDIA's command
// lines for them (`nvidia-ctk cdi generate`, `nvidia-ctk cdi list`, whose
// flag grammar is in nvctk.go).
//
// It is its own package so that gantry-runtime, the lean binary that also
// answers to the name nvidia-ctk, serves those two commands itself without
// linking the gantry CLI (HTTP, gRPC, Prometheus: milliseconds of package
// initialisation per start), and execs the gantry binary for every other
// nvidia-ctk command (Lean). The gantry CLI (internal/cli) calls the same
// functions, so both give the same spec for the same flags.
package cdicmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/cdispec"
	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/inject"
)

// UsageError is an error in how a command was called: its front end prints
// it with a pointer to --help and exits 2.
type UsageError struct{ Msg string }

func (u UsageError) Error() string { return u.Msg }

// Usagef makes a UsageError.
func Usagef(format string, a ...any) error { return UsageError{fmt.Sprintf(format, a...)} }

// GenerateOptions are `gantry cdi generate`'s flags.
type GenerateOptions struct {
	Output       string // the spec file; "" is stdout
	Format       string // yaml, json, or "" (from Output's extension, else yaml)
	Kind         string // vendor.com/class; "" is the configuration's cdi.kind
	Capabilities string // comma list, "" or "all" for every capability
	HookPath     string // absolute; "" is cdi.hook-path, else DefaultHookPath
	AllowPartial bool   // write a spec for an incomplete driver
	NoAllDevice  bool   // leave the "all" device out
	IMEX         bool   // the IMEX channels' spec instead
	// DeviceIDs narrows the spec to these devices (SelectDevices); none is all.
	DeviceIDs []string
	// LibrarySearchPaths are added to the configuration's.
	LibrarySearchPaths []string
	// Log, when set, is told at debug level what was decided and why:
	// the request, the driver and GPUs found, and each device, mount,
	// device node and hook of the spec (--debug).
	Log *slog.Logger
}

// Generate writes the CDI spec of the host cfg describes, as o asks: to
// stdout, or atomically to o.Output with a one-line note on stderr. Driver
// files that are missing are warnings on stderr.
func Generate(cfg config.Config, o GenerateOptions, stdout, stderr io.Writer) error {
	switch o.Format {
	case "", "yaml", "json":
	default:
		return Usagef("--format %q: use yaml or json", o.Format)
	}
	if o.IMEX {
		spec, err := cdispec.GenerateIMEX(cfg.EffectiveDevRoot())
		if err != nil {
			return err
		}
		return writeSpec(stdout, stderr, spec, o.Output, o.Format, "IMEX channels")
	}
	caps, err := ParseCapabilities(o.Capabilities)
	if err != nil {
		return Usagef("--capabilities: %v", err)
	}
	kind := cfg.CDI.Kind
	if o.Kind != "" {
		kind = o.Kind
	}
	hook := cfg.CDI.HookPath
	if o.HookPath != "" {
		if !filepath.IsAbs(o.HookPath) {
			return Usagef("--hook-path %q: want an absolute path (the runtime runs it from anywhere)", o.HookPath)
		}
		hook = o.HookPath
	}
	if hook == "" {
		if hook, err = DefaultHookPath(); err != nil {
			return err
		}
	}
	for _, p := range o.LibrarySearchPaths {
		if !filepath.IsAbs(p) {
			return Usagef("--library-search-path %q: want an absolute path (inside the driver root)", p)
		}
	}
	cfg.LibrarySearchPaths = append(cfg.LibrarySearchPaths[:len(cfg.LibrarySearchPaths):len(cfg.LibrarySearchPaths)], o.LibrarySearchPaths...)
	sys, inv, err := Host(cfg, stderr)
	if err != nil {
		return err
	}
	if len(inv.Missing) > 0 && !o.AllowPartial {
		return fmt.Errorf("driver %s under %s is incomplete (%s missing): reinstall the driver or fix --driver-root; --allow-partial writes a spec anyway", inv.Version, inv.Root, strings.Join(inv.Missing, ", "))
	}
	if sys, err = SelectDevices(sys, o.DeviceIDs); err != nil {
		return Usagef("--device-id: %v", err)
	}
	spec, err := cdispec.Generate(sys, inv, cdispec.Options{Kind: kind, HookPath: hook, Capabilities: caps, DevRoot: cfg.EffectiveDevRoot()})
	if err != nil {
		return err
	}
	if o.Log != nil {
		logDecisions(o.Log, o, kind, hook, caps, sys, inv, spec)
	}
	if o.NoAllDevice {
		kept := spec.Devices[:0]
		for _, d := range spec.Devices {
			if d.Name != "all" {
				kept = append(kept, d)
			}
		}
		spec.Devices = kept
	}
	return writeSpec(stdout, stderr, spec, o.Output, o.Format, "driver "+inv.Version)
}

// logDecisions logs, at debug level, what a generated spec holds and
// where each part came from, one line each (as NVIDIA's --debug does).
func logDecisions(log *slog.Logger, o GenerateOptions, kind, hook string, caps []driver.Capability, sys *gpu.System, inv *driver.Inventory, spec *specs.Spec) {
	ctx := context.Background()
	if !log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	capNames := "all"
	if len(caps) > 0 {
		names := make([]string, len(caps))
		for i, c := range caps {
			names[i] = string(c)
		}
		capNames = strings.Join(names, ",")
	}
	ids := "all"
	if len(o.DeviceIDs) > 0 {
		ids = strings.Join(o.DeviceIDs, ",")
	}
	log.Debug("request", "kind", kind, "devices", ids, "capabilities", capNames, "hook", hook, "allDevice", !o.NoAllDevice)
	log.Debug("driver", "version", inv.Version, "root", inv.Root, "libraries", len(inv.Libraries), "binaries", len(inv.Binaries),
		"firmware", len(inv.Firmware), "configs", len(inv.Configs), "sockets", len(inv.Sockets), "missing", strings.Join(inv.Missing, ","))
	for _, d := range sys.Devices {
		log.Debug("gpu", "index", d.Index, "uuid", d.UUID, "minor", d.Minor, "name", d.Name, "pciBusID", d.PCIBusID, "migDevices", len(d.MIGDevices))
	}
	for _, d := range spec.Devices {
		nodes := make([]string, len(d.ContainerEdits.DeviceNodes))
		for i, n := range d.ContainerEdits.DeviceNodes {
			nodes[i] = n.Path
		}
		log.Debug("spec device", "name", kind+"="+d.Name, "nodes", strings.Join(nodes, ","), "mounts", len(d.ContainerEdits.Mounts))
	}
	for _, n := range spec.ContainerEdits.DeviceNodes {
		log.Debug("node", "path", n.Path, "hostPath", n.HostPath, "why", "every device: a control node of the driver")
	}
	for _, m := range spec.ContainerEdits.Mounts {
		log.Debug("mount", "hostPath", m.HostPath, "containerPath", m.ContainerPath, "options", strings.Join(m.Options, ","))
	}
	for _, h := range spec.ContainerEdits.Hooks {
		log.Debug("hook", "hookName", h.HookName, "path", h.Path, "args", strings.Join(h.Args, " "))
	}
	for _, e := range spec.ContainerEdits.Env {
		log.Debug("env", "value", e)
	}
}

// Host discovers the GPUs (light: from procfs where that is enough) and the
// driver's files, and warns on stderr about driver files that are missing:
// a partial driver still works for what is there, but is rarely intended.
//
// With runtime.cache-dir set (the default), both come from the inventory
// cache gantry-runtime keeps for containers when it is current, and fill
// it when it is not: about 2 ms of discovery saved on an H100 host.
// Without it the two discoveries run at the same time (the GPUs' is NVML's
// initialisation, milliseconds, when MIG devices exist); a GPU error is
// reported before a driver error, as when they ran one after the other.
func Host(cfg config.Config, stderr io.Writer) (*gpu.System, *driver.Inventory, error) {
	if cfg.Runtime.CacheDir != "" {
		// The containers' inventory cache, valid while the driver's
		// version, ld.so.cache, device nodes, sockets and program
		// directories are unchanged (inject.LoadHost).
		sys, inv, err := inject.LoadHost(cfg)
		if err != nil {
			return nil, nil, err
		}
		ReportGaps(stderr, inv)
		return sys, inv, nil
	}
	var sys *gpu.System
	var gpuErr error
	var wg sync.WaitGroup
	wg.Go(func() { sys, gpuErr = discover.GPUs(cfg, true) })
	inv, err := discover.Driver(cfg)
	wg.Wait()
	if gpuErr != nil {
		return nil, nil, gpuErr
	}
	if err != nil {
		return nil, nil, err
	}
	ReportGaps(stderr, inv)
	return sys, inv, nil
}

// ReportGaps prints, on stderr, a warning per missing driver piece and per
// discovery warning.
func ReportGaps(stderr io.Writer, inv *driver.Inventory) {
	for _, m := range inv.Missing {
		fmt.Fprintf(stderr, "warning: driver %s under %s: %s not found\n", inv.Version, inv.Root, m)
	}
	for _, w := range inv.Warnings {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
}

// ParseCapabilities reads a comma list of driver capabilities; "" and "all"
// are every capability.
func ParseCapabilities(s string) ([]driver.Capability, error) {
	if s == "all" || s == "" {
		return driver.AllCapabilities, nil
	}
	var caps []driver.Capability
	for _, part := range strings.Split(s, ",") {
		c, err := driver.ParseCapability(strings.TrimSpace(part))
		if err != nil {
			return nil, err
		}
		caps = append(caps, c)
	}
	return caps, nil
}

// ErrNoDevices is List's error when the spec directories name no device.
var ErrNoDevices = errors.New("no CDI devices")

// List prints the fully qualified device names of every CDI spec in
// specDirs, one per line, sorted; errors in spec files are warnings on
// stderr. No device at all is an error (ErrNoDevices) naming the fix.
func List(specDirs []string, stdout, stderr io.Writer) error {
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
		fmt.Fprintf(stderr, "warning: %s\n", b)
	}
	names := cache.ListDevices()
	if len(names) == 0 {
		return fmt.Errorf("%w in %s: run `gantry cdi generate --output /var/run/cdi/nvidia.yaml`", ErrNoDevices, strings.Join(specDirs, ", "))
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintln(stdout, n)
	}
	return nil
}

// SelectDevices narrows sys to the devices ids name ("all" or none: every
// GPU): a GPU by index or UUID keeps all its MIG devices; a MIG device by
// GPU:INSTANCE (0:1) or MIG UUID keeps its parent with that MIG device
// only, as nvidia-ctk cdi generate --device-id does. An id matching nothing
// is an error: a spec silently missing a device fails containers later.
func SelectDevices(sys *gpu.System, ids []string) (*gpu.System, error) {
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

// HookName is the CDI hook binary (cmd/gantry-cdi-hook) that generated
// specs run, and SystemHookPath where `make install` puts it.
const (
	HookName       = "gantry-cdi-hook"
	SystemHookPath = "/usr/bin/" + HookName
)

// Executable is os.Executable; tests place the running binary elsewhere.
var Executable = os.Executable

// DefaultHookPath finds the CDI hook binary when cdi.hook-path is empty: the
// gantry-cdi-hook beside the running binary (gantry or gantry-runtime: bin/
// of a build, or where they were installed), else SystemHookPath. A spec
// naming a hook that does not exist would fail every container that uses
// it, so a missing one is an error here, naming the fix.
func DefaultHookPath() (string, error) {
	var tried []string
	if exe, err := Executable(); err == nil {
		tried = append(tried, filepath.Join(filepath.Dir(exe), HookName))
	}
	if len(tried) == 0 || tried[0] != SystemHookPath {
		tried = append(tried, SystemHookPath)
	}
	for _, p := range tried {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("the CDI hook binary %s is missing (looked at %s): install it with `make install`, or set cdi.hook-path in the configuration", HookName, strings.Join(tried, " and "))
}

// writeSpec prints spec to stdout, or writes it atomically to output.
func writeSpec(stdout, stderr io.Writer, spec *specs.Spec, output, format, what string) error {
	if output == "" {
		f := format
		if f == "" {
			f = "yaml"
		}
		b, err := cdispec.Marshal(spec, f)
		if err != nil {
			return err
		}
		_, err = stdout.Write(b)
		return err
	}
	if err := cdispec.Write(spec, output, format); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s: %d devices of kind %s (%s)\n", output, len(spec.Devices), spec.Kind, what)
	return nil
}
