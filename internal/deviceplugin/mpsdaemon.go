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
	"slices"
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
	// ShmSize is the size of each daemon's shm (<root>/<resource>/shm, a
	// tmpfs of its own, the daemon's and its clients' /dev/shm); 0 means
	// mps.DefaultShmSize.
	ShmSize int64
	// Self is this program's binary, which starts each daemon through the
	// MPS launcher (mps.Launch: a mount namespace where the resource's shm
	// is /dev/shm); empty means os.Executable.
	Self string
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
	if err := os.MkdirAll(m.Root, 0o755); err != nil {
		return fmt.Errorf("creating the MPS root: %w (is %s mounted writable?)", err, m.Root)
	}
	if m.ShmSize <= 0 {
		m.ShmSize = mps.DefaultShmSize
	}
	if m.Self == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding this program, which launches the MPS daemons: %w", err)
		}
		m.Self = self
	}
	// The launcher executes the control program by its path.
	if p, err := exec.LookPath(m.Control); err == nil {
		m.Control = p
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
		// The daemon itself starts in a mount namespace of its own where
		// the resource's shm is /dev/shm; commands run as they are.
		Cmd: func(ctx context.Context, env []string, args ...string) *exec.Cmd {
			if slices.Equal(args, []string{"-d"}) {
				return mps.Launch{Self: m.Self, Shm: paths.shm}.Cmd(ctx, env, m.Control, args...)
			}
			cmd := exec.CommandContext(ctx, m.Control, args...)
			cmd.Env = env
			return cmd
		},
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
	// The daemon's and its clients' /dev/shm: a tmpfs of this resource's
	// alone, bounded (kept when a daemon is adopted).
	if err := mps.MountShm(paths.shm, m.ShmSize); err != nil {
		return err
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
	// Its shm goes with it; a daemon that still serves clients (quit
	// waits for them) keeps it, for the manager that adopts it.
	paths := mpsPathsFor(m.Root, s.Resource)
	if waitGone(filepath.Join(paths.pipe, "control"), d.Timeout) {
		if err := mps.UnmountShm(paths.shm); err != nil {
			log.Warn("unmounting the daemon's shm", "err", err)
		}
	} else {
		log.Info("the MPS control daemon still runs (it waits for its clients); its shm stays mounted", "shm", paths.shm)
	}
	if m.ComputeMode != nil {
		if err := m.ComputeMode(ctx, gpuUUIDs(s), false); err != nil {
			log.Warn("restoring compute mode DEFAULT", "err", err)
		}
	}
}

// waitGone waits up to timeout (0: 10s) for p to be gone (a daemon
// removes its control socket as it exits).
func waitGone(p string, timeout time.Duration) bool {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			return true
		}
		if time.Now().After(deadline) {
			return false
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
	shmSize, err := mps.ParseShmSize("gantry.mpsShmSize", cfg.Gantry.MPSShmSize)
	if err != nil {
		fmt.Fprintf(stderr, "gantry-device-plugin mps-control-daemon: %v\n", err)
		return 1
	}
	m := &MPSManager{Root: cfg.MPSRoot(), Specs: specs, Control: control, Log: log, ShmSize: shmSize}
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
