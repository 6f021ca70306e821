package nodeinstall

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
)

// Defaults of Options.
const (
	DefaultHostRoot   = "/host"
	DefaultBinDir     = "/usr/local/gantry/bin"
	DefaultSourceDir  = "/usr/bin"
	DefaultStateDir   = "/var/lib/gantry/node-install"
	DefaultCDISpec    = "/var/run/cdi/gantry.yaml"
	DefaultReadyLabel = "gantry.dev/runtime-ready"
	DefaultTimeout    = 2 * time.Minute
)

// hostPATH is the environment of every host program the installer runs
// (engine checks, restarts, its own gantry): a fixed PATH and nothing of
// the pod's.
var hostEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// Options say where things are; every path but HostRoot and SourceDir is a
// path on the host.
type Options struct {
	// HostRoot is where this process sees the host's /; "/" when it runs
	// on the host itself.
	HostRoot string
	// SourceDir holds the binaries to install (the image's /usr/bin).
	SourceDir string
	// BinDir is the host directory of the installed binaries, Gantry's own.
	BinDir string
	// Engine is containerd or crio.
	Engine engineconfig.Engine
	// ConfigFile is the engine's main configuration (containerd's
	// config.toml); DropIn the file the runtime is written to (containerd's
	// conf.d/99-nvidia.toml, CRI-O's crio.conf.d/99-nvidia.toml).
	ConfigFile, DropIn string
	// EngineBinary is the engine's program for `runtime configure`'s check
	// (found on the host's PATH when empty; without one the check is
	// Gantry's reader only, as configure does).
	EngineBinary string
	// EnableCDI also turns the engine's CDI support on (containerd).
	EnableCDI bool
	// CDISpec is the CDI spec file to generate; "" for none.
	CDISpec string
	// GantryConfig is the Gantry configuration file the installed gantry
	// reads (passed as --config); DriverRoot, when set, its --driver-root
	// (/, /usr/local/nvidia's parent layout, /run/nvidia/driver).
	GantryConfig, DriverRoot string
	// StateDir keeps the install record.
	StateDir string
	// CRISocket is the engine's CRI socket.
	CRISocket string
	// RestartCommand restarts the engine: a shell command run by the
	// host's /bin/sh in the host's root.
	RestartCommand string
	// Timeout bounds the wait for the engine to answer after a restart.
	Timeout time.Duration
	// Log gets one line per step.
	Log io.Writer
}

// Defaults fills what o leaves empty for its engine.
func (o *Options) Defaults() error {
	if o.Engine == "" {
		o.Engine = engineconfig.Containerd
	}
	if o.HostRoot == "" {
		o.HostRoot = DefaultHostRoot
	}
	if o.SourceDir == "" {
		o.SourceDir = DefaultSourceDir
	}
	if o.BinDir == "" {
		o.BinDir = DefaultBinDir
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	switch o.Engine {
	case engineconfig.Containerd:
		if o.ConfigFile == "" {
			o.ConfigFile = engineconfig.DefaultPath(engineconfig.Containerd)
		}
		if o.DropIn == "" {
			o.DropIn = engineconfig.DefaultContainerdDropIn
		}
		if o.CRISocket == "" {
			o.CRISocket = "/run/containerd/containerd.sock"
		}
		if o.RestartCommand == "" {
			o.RestartCommand = "systemctl restart containerd"
		}
	case engineconfig.CRIO:
		if o.DropIn == "" {
			o.DropIn = engineconfig.DefaultPath(engineconfig.CRIO)
		}
		if o.CRISocket == "" {
			o.CRISocket = "/var/run/crio/crio.sock"
		}
		if o.RestartCommand == "" {
			o.RestartCommand = "systemctl restart crio"
		}
	default:
		return fmt.Errorf("--runtime %s: the installer sets up containerd or crio (Kubernetes engines); for Docker run gantry runtime configure on the host", o.Engine)
	}
	for name, p := range map[string]string{"--host-root": o.HostRoot, "--bin-dir": o.BinDir, "--state-dir": o.StateDir,
		"--config-file": o.ConfigFile, "--drop-in": o.DropIn, "--cri-socket": o.CRISocket, "--source-dir": o.SourceDir} {
		if p != "" && !filepath.IsAbs(p) {
			return fmt.Errorf("%s %q is not an absolute path: give the full path", name, p)
		}
	}
	if o.CDISpec != "" && !filepath.IsAbs(o.CDISpec) {
		return fmt.Errorf("--cdi-spec %q is not an absolute path: give the full path (e.g. %s)", o.CDISpec, DefaultCDISpec)
	}
	return nil
}

// links are NVIDIA's names and Gantry's hook name, each a symlink in
// BinDir to the binary that serves it (it dispatches on its name).
var links = map[string]string{
	"gantry-hook":                   "gantry-runtime",
	"nvidia-container-runtime":      "gantry-runtime",
	"nvidia-container-runtime-hook": "gantry-runtime",
	"nvidia-container-toolkit":      "gantry-runtime",
	"nvidia-container-cli":          "gantry-runtime",
	"nvidia-ctk":                    "gantry-runtime",
	"nvidia-cdi-hook":               "gantry-cdi-hook",
}

// binaries are copied from SourceDir; gantry-runtime runs the gantry
// beside it for NVML's answers, so both go.
var binaries = []string{"gantry", "gantry-runtime", "gantry-cdi-hook"}

// configFiles are the host files install may write, for the record.
func (o *Options) configFiles() []string {
	var fs []string
	add := func(p string) {
		if p != "" && !slices.Contains(fs, p) {
			fs = append(fs, p)
		}
	}
	if o.Engine == engineconfig.Containerd {
		add(o.ConfigFile)
		add(o.ConfigFile + engineconfig.BackupSuffix)
	}
	add(o.DropIn)
	add(o.DropIn + engineconfig.BackupSuffix)
	add(o.CDISpec)
	return fs
}

// Result says what an install or uninstall did.
type Result struct {
	// Changed: the engine's configuration changed (and it was restarted).
	Changed bool
	// Restart is how long the restart took until the engine answered.
	Restart time.Duration
	// KeptFor: uninstall restored the configuration but kept the binaries
	// (and a record naming them) for these pods (namespace/name), which
	// still ran with the runtime; uninstall again once they are gone.
	KeptFor []string
}

// Install sets the node up (see the package documentation). It is
// idempotent: a second run replaces the binaries and changes nothing else
// when the configuration is already in place.
func Install(ctx context.Context, o Options) (Result, error) {
	var res Result
	if err := o.Defaults(); err != nil {
		return res, err
	}
	for _, b := range binaries {
		if fi, err := os.Stat(filepath.Join(o.SourceDir, b)); err != nil || !fi.Mode().IsRegular() {
			return res, fmt.Errorf("%s/%s: not found (%v): run the installer from the Gantry image, or give --source-dir where make build put the binaries", o.SourceDir, b, err)
		}
	}
	rec, err := o.loadRecord()
	if err != nil {
		return res, err
	}
	// A record without files is one an uninstall left for binaries that
	// pods still used: the configuration is the original again.
	fresh := rec == nil || len(rec.Files) == 0
	if fresh {
		var kept []string
		if rec != nil {
			kept = rec.CreatedDirs
		}
		rec = &record{Version: 1, Engine: string(o.Engine), BinDir: o.BinDir}
		rec.CreatedDirs = append(kept, o.missingDirs(o.StateDir)...)
		if err := os.MkdirAll(o.host(filepath.Dir(o.StateDir)), 0o755); err != nil {
			return res, fmt.Errorf("creating the state directory %s: %w", o.StateDir, err)
		}
		if err := os.Mkdir(o.host(o.StateDir), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return res, fmt.Errorf("creating the state directory %s: %w", o.StateDir, err)
		}
		for _, p := range o.configFiles() {
			f, err := o.snapshot(p)
			if err != nil {
				return res, err
			}
			rec.Files = append(rec.Files, f)
		}
		for _, d := range []string{o.BinDir, filepath.Dir(o.DropIn), filepath.Dir(o.CDISpec)} {
			if o.CDISpec == "" && d == "." {
				continue
			}
			rec.CreatedDirs = append(rec.CreatedDirs, o.missingDirs(d)...)
		}
		// The record is on disk before the first change.
		if err := o.saveRecord(rec); err != nil {
			return res, fmt.Errorf("writing the install record in %s: %w", o.StateDir, err)
		}
		fmt.Fprintf(o.Log, "recorded the originals of %s in %s\n", strings.Join(o.configFiles(), ", "), filepath.Join(o.StateDir, recordName))
	} else if rec.Engine != string(o.Engine) || rec.BinDir != o.BinDir {
		return res, fmt.Errorf("this node was set up for %s with binaries in %s (record %s): run gantry node uninstall with those settings first", rec.Engine, rec.BinDir, filepath.Join(o.StateDir, recordName))
	}
	// rollback undoes a fresh install that failed: the files back, the
	// binaries and the record gone. An upgrade that fails keeps the node
	// as the earlier install left it, files restored to what they were.
	before := map[string]savedFile{}
	for _, p := range o.configFiles() {
		if f, err := o.snapshot(p); err == nil {
			before[p] = f
		}
	}
	rollback := func(cause error) error {
		var errs []error
		for _, p := range o.configFiles() {
			f, ok := before[p]
			if !ok {
				continue
			}
			if err := o.restore(f); err != nil {
				errs = append(errs, err)
			}
		}
		if fresh {
			if err := o.removeInstalled(rec); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("%w; putting the old files back also failed: %v (the originals are in %s)", cause, errors.Join(errs...), filepath.Join(o.StateDir, recordName))
		}
		return fmt.Errorf("%w; the old configuration is back", cause)
	}

	if err := o.copyBinaries(); err != nil {
		return res, rollback(err)
	}
	rec.Binaries = append(slices.Clone(binaries), sortedKeys(links)...)
	if err := o.saveRecord(rec); err != nil {
		return res, rollback(err)
	}
	if err := o.configure(ctx); err != nil {
		return res, rollback(err)
	}
	if o.CDISpec != "" {
		if err := o.generateCDI(ctx); err != nil {
			return res, rollback(err)
		}
	}
	for _, p := range o.configFiles() {
		if p == o.CDISpec {
			continue
		}
		after, _ := o.snapshot(p)
		if b := before[p]; after.Existed != b.Existed || !bytes.Equal(after.Data, b.Data) {
			res.Changed = true
		}
	}
	if !res.Changed {
		fmt.Fprintf(o.Log, "%s already configured; no restart\n", o.Engine)
		return res, o.waitEngine(ctx, true, time.Now().Add(o.Timeout))
	}
	start := time.Now()
	if err := o.restartAndWait(ctx, true); err != nil {
		cause := fmt.Errorf("%s did not come back healthy with Gantry's runtime configured: %w", o.Engine, err)
		err := rollback(cause)
		if rerr := o.restartAndWait(ctx, false); rerr != nil {
			return res, fmt.Errorf("%w; restarting %s with it also failed: %v", err, o.Engine, rerr)
		}
		return res, fmt.Errorf("%w, and %s answers again", err, o.Engine)
	}
	res.Restart = time.Since(start)
	return res, nil
}

// Uninstall undoes Install from its record: the files back byte for byte,
// the engine restarted without the runtime, then the binaries, the spec
// and the record removed. Without a record there is nothing to undo.
func Uninstall(ctx context.Context, o Options) (Result, error) {
	var res Result
	if err := o.Defaults(); err != nil {
		return res, err
	}
	rec, err := o.loadRecord()
	if err != nil || rec == nil {
		if rec == nil && err == nil {
			fmt.Fprintf(o.Log, "no install record in %s: nothing to undo\n", o.StateDir)
		}
		return res, err
	}
	// Pods that run with the runtime need its binary to be stopped (their
	// shims run it): give them the time to go (the device plugin's, once
	// the label is off), and keep the binaries for those that stay.
	inUse := o.waitGPUPodsGone(ctx, time.Now().Add(o.Timeout))
	var errs []error
	for _, f := range rec.Files {
		cur, _ := o.snapshot(f.Path)
		if cur.Existed != f.Existed || !bytes.Equal(cur.Data, f.Data) {
			if f.Path != o.CDISpec {
				res.Changed = true
			}
			fmt.Fprintf(o.Log, "restoring %s\n", f.Path)
		}
		if err := o.restore(f); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return res, fmt.Errorf("%w (the originals stay in %s; run uninstall again)", errors.Join(errs...), filepath.Join(o.StateDir, recordName))
	}
	if res.Changed {
		start := time.Now()
		if err := o.restartAndWait(ctx, false); err != nil {
			return res, fmt.Errorf("the original configuration is back, but %s did not come back healthy: %w", o.Engine, err)
		}
		res.Restart = time.Since(start)
	}
	if len(inUse) > 0 {
		// The record stays, naming the binaries, for the next uninstall.
		kept := *rec
		kept.Files = nil
		if err := o.saveRecord(&kept); err != nil {
			return res, err
		}
		res.KeptFor = inUse
		return res, nil
	}
	// The binaries go once the engine no longer names them.
	if err := o.removeInstalled(rec); err != nil {
		return res, err
	}
	return res, nil
}

// removeInstalled removes the binaries, the directories install made and
// the record.
func (o *Options) removeInstalled(rec *record) error {
	var errs []error
	for _, b := range rec.Binaries {
		if err := os.Remove(o.hostEntry(filepath.Join(rec.BinDir, b))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(o.recordPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	dirs := slices.Clone(rec.CreatedDirs)
	// Deepest first; a directory someone else has put files in stays.
	slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
	for _, d := range dirs {
		err := os.Remove(o.host(d))
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			var names []string
			if ents, err := os.ReadDir(o.host(d)); err == nil {
				for _, e := range ents {
					names = append(names, e.Name())
				}
			}
			fmt.Fprintf(o.Log, "kept %s, which install made: it holds what install did not put there (%s)\n", d, strings.Join(names, ", "))
			continue
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// missingDirs lists d and those of its parents that do not exist yet,
// shallowest first.
func (o *Options) missingDirs(d string) []string {
	var out []string
	for d != "/" && d != "." {
		if _, err := os.Lstat(o.host(d)); err == nil {
			break
		}
		out = append([]string{d}, out...)
		d = filepath.Dir(d)
	}
	return out
}

// copyBinaries puts the binaries and links in BinDir, each replaced
// atomically.
func (o *Options) copyBinaries() error {
	dir := o.host(o.BinDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", o.BinDir, err)
	}
	for _, b := range binaries {
		data, err := os.ReadFile(filepath.Join(o.SourceDir, b))
		if err != nil {
			return err
		}
		if err := writeAtomic(filepath.Join(dir, b), data, 0o755, 0, 0); err != nil {
			return fmt.Errorf("installing %s/%s: %w", o.BinDir, b, err)
		}
	}
	for _, name := range sortedKeys(links) {
		tmp := filepath.Join(dir, "."+name+".gantry-tmp")
		os.Remove(tmp)
		if err := os.Symlink(links[name], tmp); err != nil {
			return fmt.Errorf("linking %s/%s: %w", o.BinDir, name, err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("linking %s/%s: %w", o.BinDir, name, err)
		}
	}
	fmt.Fprintf(o.Log, "installed %s and %s in %s\n", strings.Join(binaries, ", "), strings.Join(sortedKeys(links), ", "), o.BinDir)
	return nil
}

// gantry runs the installed gantry in the host's root with args.
func (o *Options) gantry(ctx context.Context, args ...string) error {
	var global []string
	if o.GantryConfig != "" {
		global = append(global, "--config", o.GantryConfig)
	}
	if o.DriverRoot != "" {
		global = append(global, "--driver-root", o.DriverRoot)
	}
	out, err := o.hostCommand(ctx, o.execRoot(), filepath.Join(o.BinDir, "gantry"), append(global, args...)...)
	if len(out) > 0 {
		fmt.Fprintf(o.Log, "%s", out)
	}
	if err != nil {
		return fmt.Errorf("gantry %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// configure is `gantry runtime configure` for the engine, the drop-in way.
func (o *Options) configure(ctx context.Context) error {
	args := []string{"runtime", "configure", "--runtime", string(o.Engine), "--runtime-path", filepath.Join(o.BinDir, "gantry-runtime")}
	if o.Engine == engineconfig.Containerd {
		args = append(args, "--config-file", o.ConfigFile, "--drop-in", o.DropIn)
	} else {
		args = append(args, "--config-file", o.DropIn)
	}
	if o.EnableCDI {
		args = append(args, "--enable-cdi")
	}
	if o.EngineBinary != "" {
		args = append(args, "--executable-path", o.EngineBinary)
	}
	return o.gantry(ctx, args...)
}

func (o *Options) generateCDI(ctx context.Context) error {
	if err := os.MkdirAll(o.host(filepath.Dir(o.CDISpec)), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(o.CDISpec), err)
	}
	return o.gantry(ctx, "cdi", "generate", "--output", o.CDISpec, "--hook-path", filepath.Join(o.BinDir, "gantry-cdi-hook"))
}

// hostCommand runs prog (a host path) with args chrooted into root (when
// it is not this process's /), with the fixed host environment, and
// returns its output.
func (o *Options) hostCommand(ctx context.Context, root, prog string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, prog, args...)
	// The program is looked up in root, after the chroot, not here.
	cmd.Path = prog
	cmd.Env = hostEnv
	cmd.Dir = "/"
	if root != "/" {
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil && out.Len() > 0 {
		err = fmt.Errorf("%w: %s", err, strings.TrimSpace(lastLines(out.String(), 8)))
	}
	return out.Bytes(), err
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func sortedKeys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
