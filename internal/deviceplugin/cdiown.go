package deviceplugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
	"github.com/gantry-gpu/gantry/internal/cdispec"
	gconfig "github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

// The plugin's own CDI spec. With a cdi-* device list strategy and no
// gantry.cdiKind of the admin's, the plugin does what NVIDIA's does: it
// writes the spec of the devices it hands out itself, under NVIDIA's
// plugin vendor (k8s.device-plugin.nvidia.com/gpu=<id>, and
// .../imex-channel=<N>), into the CDI spec directory, in NVIDIA's file
// names, so the names in its answers always resolve; its kind is not
// nvidia.com/gpu, so it never conflicts with a spec from `gantry cdi
// generate` or nvidia-ctk. The spec is written atomically (temporary file,
// rename), rewritten when the driver changes (its version in
// /proc/driver/nvidia/version or /sys/module/nvidia/version) or the file
// disappears, and removed on exit only if the file still holds what the
// plugin wrote (a spec someone else put there since is theirs).
const (
	// OwnCDIVendor is the CDI vendor of the plugin's own spec (NVIDIA's plugin's).
	OwnCDIVendor = "k8s.device-plugin.nvidia.com"
	// DefaultCDISpecDir is where the plugin's own spec goes: the transient
	// CDI directory, which runtimes read.
	DefaultCDISpecDir = "/var/run/cdi"
	// DefaultCDIHookPath is the host path of gantry-cdi-hook that the
	// spec's hooks run unless Gantry's cdi.hook-path or gantry.cdiHookPath
	// says otherwise (where the installer puts it).
	DefaultCDIHookPath = "/usr/bin/gantry-cdi-hook"
)

// ownSpecRecheck is how often the driver version and the files are looked
// at again (a variable for tests).
var ownSpecRecheck = 30 * time.Second

// ownSpecFile is NVIDIA's plugin's file name for the spec of kind.
func ownSpecFile(dir, kind string) string {
	return filepath.Join(dir, strings.Replace(kind, "/", "-", 1)+".json")
}

// ownSpec keeps the plugin's spec files current.
type ownSpec struct {
	dir, hostRoot, hook string
	kind                string // <OwnCDIVendor>/gpu
	gcfg                gconfig.Config
	sys                 *gpu.System
	imex                []imexChannel
	log                 *slog.Logger
	recheck             time.Duration

	driverID string            // the driver version files' content when last generated
	written  map[string][]byte // path -> what was written there
	given    map[string]bool   // files another writer replaced
}

// ownsCDISpec reports whether the plugin writes its own spec: a cdi-*
// strategy is on and the admin named no CDI kind (gantry.cdiKind), which
// would say that they manage the spec. Called before run fills the kind in.
func ownsCDISpec(cfg *Config) bool {
	return cfg.Flags.Plugin.DeviceListStrategy.anyCDI() && cfg.Gantry.CDIKind == ""
}

// startOwnSpec writes the spec files now and keeps them current until ctx
// ends; the returned function (call it after ctx ends) removes the files
// that still hold what was written.
func startOwnSpec(ctx context.Context, cfg *Config, gcfg gconfig.Config, p *Plugin, log *slog.Logger) (func(), error) {
	o := &ownSpec{
		dir: cfg.Gantry.CDISpecDir, hostRoot: cfg.Gantry.HostRoot, hook: cfg.Gantry.CDIHookPath, kind: cfg.cdiKind(),
		gcfg: gcfg, sys: p.sys, imex: p.imex, log: log, recheck: ownSpecRecheck,
		written: map[string][]byte{}, given: map[string]bool{},
	}
	if o.dir == "" {
		o.dir = DefaultCDISpecDir
	}
	if o.hostRoot == "" {
		o.hostRoot = "/"
	}
	if o.hook == "" {
		o.hook = gcfg.CDI.HookPath
	}
	if o.hook == "" {
		o.hook = DefaultCDIHookPath
	}
	if err := o.sync(true); err != nil {
		return func() {}, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(o.recheck)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := o.sync(false); err != nil {
					log.Error("keeping the plugin's CDI spec current", "dir", o.dir, "err", err)
				}
			}
		}
	}()
	return func() { <-done; o.remove() }, nil
}

// driverVersion is the loaded driver's identity: the kernel module's
// version files ("" when there is none, as with simulated GPUs).
func (o *ownSpec) driverVersion() string {
	var b strings.Builder
	for _, p := range []string{"/proc/driver/nvidia/version", "/sys/module/nvidia/version"} {
		if data, err := os.ReadFile(filepath.Join(o.hostRoot, p)); err == nil {
			b.Write(data)
		}
	}
	return b.String()
}

// sync regenerates the specs when forced, when the driver changed, or when
// a file was removed or changed, and writes those that differ.
func (o *ownSpec) sync(force bool) error {
	id := o.driverVersion()
	stale := force || id != o.driverID
	for path, data := range o.written {
		cur, err := os.ReadFile(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			stale = true
		case err == nil && !bytes.Equal(cur, data):
			// Someone else wrote this file since: it is theirs now,
			// neither rewritten nor removed.
			o.log.Warn("the plugin's CDI spec was replaced by another writer; leaving it to them", "file", path)
			delete(o.written, path)
			o.given[path] = true
		}
	}
	if !stale {
		return nil
	}
	files, err := o.generate()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return fmt.Errorf("the plugin's CDI spec directory %s: %w (mount the host's %s into the plugin's container, or set gantry.cdiSpecDir)", o.dir, err, DefaultCDISpecDir)
	}
	for path, data := range files {
		if o.given[path] {
			continue
		}
		if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
			o.written[path] = data
			continue
		}
		if err := atomicfile.Write(path, data, atomicfile.Options{Mode: 0o644, Sync: true}); err != nil {
			return fmt.Errorf("writing the plugin's CDI spec %s: %w (is %s writable? mount the host's %s read-write)", path, err, o.dir, DefaultCDISpecDir)
		}
		o.written[path] = data
		o.log.Info("wrote the plugin's CDI spec", "file", path, "driverChanged", !force && id != o.driverID)
	}
	o.driverID = id
	return nil
}

// generate builds the spec files' content: the GPUs (kind o.kind), and the
// IMEX channels handed out (kind <vendor>/imex-channel), if any.
func (o *ownSpec) generate() (map[string][]byte, error) {
	gcfg := o.gcfg
	gcfg.DriverRoot = filepath.Join(o.hostRoot, o.gcfg.DriverRoot)
	gcfg.DevRoot = filepath.Join(o.hostRoot, o.gcfg.EffectiveDevRoot())
	inv, err := discover.Driver(gcfg)
	if err != nil {
		if !strings.HasPrefix(gcfg.GPUs, "sim:") {
			return nil, fmt.Errorf("the plugin's CDI spec: finding the driver's files under %s: %w (set flags.nvidiaDriverRoot, and gantry.hostRoot where the host's / is mounted in the plugin's container)", gcfg.DriverRoot, err)
		}
		// Simulated GPUs on a host without a driver: device nodes only.
		inv = &driver.Inventory{}
	}
	spec, err := cdispec.Generate(o.sys, inv, cdispec.Options{Kind: o.kind, HookPath: o.hook, DevRoot: gcfg.DevRoot})
	if err != nil {
		return nil, fmt.Errorf("the plugin's CDI spec: %w", err)
	}
	o.unroot(&spec.ContainerEdits)
	for i := range spec.Devices {
		o.unroot(&spec.Devices[i].ContainerEdits)
	}
	files := map[string][]byte{}
	data, err := cdispec.Marshal(spec, cdispec.FormatJSON)
	if err != nil {
		return nil, err
	}
	files[ownSpecFile(o.dir, o.kind)] = data
	if len(o.imex) > 0 {
		is, err := cdispec.GenerateIMEX(gcfg.DevRoot)
		if err != nil {
			return nil, fmt.Errorf("the plugin's CDI spec of IMEX channels: %w", err)
		}
		vendor, _, _ := strings.Cut(o.kind, "/")
		is.Kind = vendor + "/" + imexCDIClass
		is.Devices = slices.DeleteFunc(is.Devices, func(d specs.Device) bool {
			return !slices.ContainsFunc(o.imex, func(c imexChannel) bool { return c.ID == d.Name })
		})
		for i := range is.Devices {
			o.unroot(&is.Devices[i].ContainerEdits)
		}
		if err := cdispec.Validate(is); err != nil {
			return nil, fmt.Errorf("the plugin's CDI spec of IMEX channels: %w", err)
		}
		if data, err = cdispec.Marshal(is, cdispec.FormatJSON); err != nil {
			return nil, err
		}
		files[ownSpecFile(o.dir, is.Kind)] = data
	}
	return files, nil
}

// unroot turns host paths as the plugin sees them (under gantry.hostRoot)
// into the host's own.
func (o *ownSpec) unroot(ce *specs.ContainerEdits) {
	root := filepath.Clean("/" + o.hostRoot)
	if root == "/" {
		return
	}
	strip := func(p string) string {
		if rest, ok := strings.CutPrefix(p, root); ok && (rest == "" || rest[0] == '/') {
			return "/" + strings.TrimPrefix(rest, "/")
		}
		return p
	}
	for _, m := range ce.Mounts {
		m.HostPath = strip(m.HostPath)
	}
	for _, n := range ce.DeviceNodes {
		if n.HostPath != "" {
			if n.HostPath = strip(n.HostPath); n.HostPath == n.Path {
				n.HostPath = ""
			}
		}
	}
}

// remove deletes the files that still hold what the plugin wrote.
func (o *ownSpec) remove() {
	for path, data := range o.written {
		cur, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		if !bytes.Equal(cur, data) {
			o.log.Info("leaving the CDI spec: it changed since the plugin wrote it", "file", path)
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			o.log.Warn("removing the plugin's CDI spec", "file", path, "err", err)
		}
	}
}
