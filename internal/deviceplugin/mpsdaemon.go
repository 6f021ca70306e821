package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
	"github.com/gantry-gpu/gantry/internal/mps"
)

// MPSControlBinary is the MPS control program: with -d it starts the
// control daemon; without, it sends the commands of its standard input to
// the daemon of CUDA_MPS_PIPE_DIRECTORY, one a line, and prints the replies.
const MPSControlBinary = "nvidia-cuda-mps-control"

// MPSManager runs one MPS control daemon per resource shared through MPS
// (gantry-device-plugin mps-control-daemon): it starts each with its own
// pipe and log directories and GPUs, sets the per-client defaults (pinned
// device memory and active thread percentage, an equal share per replica),
// writes the resource's ready file, checks every Interval that the daemon
// answers (touching the ready file), restarts it when it does not, and
// stops it with quit when ctx ends.
type MPSManager struct {
	// Root is the MPS root as this process sees it (the chart mounts the
	// host's flags.mpsRoot at the same path).
	Root  string
	Specs []MPSDaemonSpec
	// Control is the control program; empty means MPSControlBinary in PATH.
	Control string
	// Env is added to the daemon's environment (which is otherwise only
	// PATH and the MPS variables), e.g. LD_LIBRARY_PATH for a driver
	// installed under a driver root.
	Env []string
	// Interval between health checks; 0 means 5s. Keep it well under
	// mpsReadyMaxAge (30s), after which the plugin counts the daemon gone.
	Interval time.Duration
	// Timeout bounds each run of the control program; 0 means 10s.
	Timeout time.Duration
	// ComputeMode, when set, is called with the GPUs of a daemon before it
	// starts (exclusive true: EXCLUSIVE_PROCESS, so only the MPS server
	// opens them) and after it stops (false: DEFAULT).
	ComputeMode func(ctx context.Context, uuids []string, exclusive bool) error
	Log         *slog.Logger
}

// Run manages the daemons until ctx is done, then stops them; it returns
// once every daemon was told to quit.
func (m *MPSManager) Run(ctx context.Context) error {
	if m.Log == nil {
		m.Log = slog.Default()
	}
	if m.Control == "" {
		m.Control = MPSControlBinary
	}
	if !filepath.IsAbs(m.Root) {
		return fmt.Errorf("MPS root %q is not an absolute path (flags.mpsRoot, MPS_ROOT, --mps-root)", m.Root)
	}
	// The clients' /dev/shm: world-writable and sticky as /dev/shm is, so
	// that clients running as any user can make their segments there.
	shm := filepath.Join(m.Root, "shm")
	if err := os.MkdirAll(shm, 0o755); err != nil {
		return fmt.Errorf("creating the MPS shm directory: %w (is %s mounted writable?)", err, m.Root)
	}
	if err := os.Chmod(shm, 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("making %s world-writable and sticky: %w", shm, err)
	}
	var wg sync.WaitGroup
	for _, s := range m.Specs {
		wg.Go(func() { m.manage(ctx, s) })
	}
	wg.Wait()
	return nil
}

// daemon is the mps.Daemon of a spec.
func (m *MPSManager) daemon(s MPSDaemonSpec) *mps.Daemon {
	paths := mpsPathsFor(m.Root, s.Resource)
	return &mps.Daemon{
		Pipe: paths.pipe, Log: paths.log, GPUs: gpuUUIDs(s), Control: m.Control, Timeout: m.Timeout,
		Env: append([]string{"PATH=" + os.Getenv("PATH")}, m.Env...),
	}
}

// manage keeps one daemon running until ctx is done.
func (m *MPSManager) manage(ctx context.Context, s MPSDaemonSpec) {
	log := m.Log.With("resource", s.Resource)
	paths := mpsPathsFor(m.Root, s.Resource)
	d := m.daemon(s)
	mps.Supervise(ctx, d, m.Interval, mps.Hooks{
		Up: func(ctx context.Context) error {
			if err := m.start(ctx, s, d); err != nil {
				return err
			}
			log.Info("MPS control daemon ready", "pipe", paths.pipe, "gpus", len(s.GPUs), "replicas", s.Replicas,
				"activeThreadPercentage", s.ThreadPercentage())
			return nil
		},
		Beat: func() error {
			now := time.Now()
			if err := os.Chtimes(paths.ready, now, now); err != nil && errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("the ready file was removed: %w", err) // start over, which writes it
			} else if err != nil {
				log.Warn("touching the ready file", "err", err)
			}
			return nil
		},
		Down: func(error) { os.Remove(paths.ready) },
		Stop: func() { m.stop(s, d, log) },
	}, log)
}

// start starts the daemon (or adopts one that already answers on the pipe
// directory, as after a restart of the manager alone: quitting it would
// wait for its clients), applies the defaults and writes the ready file.
func (m *MPSManager) start(ctx context.Context, s MPSDaemonSpec, d *mps.Daemon) error {
	paths := mpsPathsFor(m.Root, s.Resource)
	os.Remove(paths.ready)
	for _, dir := range []string{paths.pipe, paths.log} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	for _, dir := range []string{paths.pipe, paths.shm} {
		if err := mps.LabelForContainers(dir); err != nil {
			m.Log.Warn("cannot label the directory for containers; SELinux may keep clients out", "dir", dir, "err", err)
		}
	}
	var before func(context.Context) error
	if m.ComputeMode != nil {
		before = func(ctx context.Context) error {
			if err := m.ComputeMode(ctx, gpuUUIDs(s), true); err != nil {
				return fmt.Errorf("setting compute mode EXCLUSIVE_PROCESS: %w", err)
			}
			return nil
		}
	}
	adopted, err := d.Start(ctx, before)
	if err != nil {
		return err
	}
	if adopted {
		m.Log.Info("an MPS control daemon already answers on the pipe directory; adopting it", "resource", s.Resource, "pipe", paths.pipe)
	}
	limits := map[int]string{}
	// Ordinal i: the daemon sees s.GPUs in order (CUDA_VISIBLE_DEVICES).
	for i, g := range s.GPUs {
		if g.MemoryMiB > 0 {
			limits[i] = fmt.Sprintf("%dM", s.MemLimitMiB(g))
		}
	}
	if err := d.SetDefaults(ctx, s.ThreadPercentage(), limits); err != nil {
		return err
	}
	body := fmt.Sprintf("resource=%s\nreplicas=%d\ngpus=%s\nactiveThreadPercentage=%d\nmanagerPID=%d\n",
		s.Resource, s.Replicas, strings.Join(gpuUUIDs(s), ","), s.ThreadPercentage(), os.Getpid())
	if err := atomicfile.Write(paths.ready, []byte(body), atomicfile.Options{Mode: 0o644}); err != nil {
		return fmt.Errorf("writing the ready file: %w", err)
	}
	return nil
}

// stop withdraws the ready file, quits the daemon and gives the GPUs their
// default compute mode back.
func (m *MPSManager) stop(s MPSDaemonSpec, d *mps.Daemon, log *slog.Logger) {
	os.Remove(mpsPathsFor(m.Root, s.Resource).ready)
	// ctx is done: the quit gets its own time.
	ctx := context.Background()
	if err := d.Quit(ctx); err != nil {
		log.Warn("quitting the MPS control daemon", "err", err)
	} else {
		log.Info("MPS control daemon stopped")
	}
	if m.ComputeMode != nil {
		if err := m.ComputeMode(ctx, gpuUUIDs(s), false); err != nil {
			log.Warn("restoring compute mode DEFAULT", "err", err)
		}
	}
}

func gpuUUIDs(s MPSDaemonSpec) []string {
	out := make([]string, len(s.GPUs))
	for i, g := range s.GPUs {
		out[i] = g.UUID
	}
	return out
}

// NvidiaSMIComputeMode sets compute modes with nvidia-smi (found in PATH),
// as MPS wants its GPUs: EXCLUSIVE_PROCESS while the daemon runs.
func NvidiaSMIComputeMode(ctx context.Context, uuids []string, exclusive bool) error {
	mode := "DEFAULT"
	if exclusive {
		mode = "EXCLUSIVE_PROCESS"
	}
	for _, u := range uuids {
		out, err := exec.CommandContext(ctx, "nvidia-smi", "-i", u, "-c", mode).CombinedOutput()
		if err != nil {
			return fmt.Errorf("nvidia-smi -i %s -c %s: %v: %s", u, mode, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// runMPSManager is the mps-control-daemon mode of Main.
func runMPSManager(ctx context.Context, cfg Config, p *Plugin, control string, getenv func(string) string, log *slog.Logger, stderr io.Writer) int {
	if control == "" {
		control = getenv("MPS_CONTROL")
	}
	specs := MPSDaemonSpecs(p.Resources(), p.sys)
	if len(specs) == 0 {
		log.Info("no resource is shared through MPS (sharing.mps); nothing to run, waiting for termination")
		<-ctx.Done()
		return 0
	}
	m := &MPSManager{Root: cfg.MPSRoot(), Specs: specs, Control: control, Log: log}
	if v := getenv("LD_LIBRARY_PATH"); v != "" {
		m.Env = append(m.Env, "LD_LIBRARY_PATH="+v)
	}
	if !strings.HasPrefix(cfg.Gantry.GPUs, "sim:") {
		m.ComputeMode = NvidiaSMIComputeMode
	}
	if err := m.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "gantry-device-plugin mps-control-daemon: %v\n", err)
		return 1
	}
	return 0
}
