package deviceplugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
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
	if m.Interval <= 0 {
		m.Interval = 5 * time.Second
	}
	if m.Timeout <= 0 {
		m.Timeout = 10 * time.Second
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

// manage keeps one daemon running until ctx is done.
func (m *MPSManager) manage(ctx context.Context, s MPSDaemonSpec) {
	log := m.Log.With("resource", s.Resource)
	paths := mpsPathsFor(m.Root, s.Resource)
	backoff := time.Second
	tick := time.NewTicker(m.Interval)
	defer tick.Stop()
	for {
		if err := m.start(ctx, s); err != nil {
			if ctx.Err() != nil {
				break
			}
			log.Error("starting the MPS control daemon failed; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
				backoff = min(2*backoff, 30*time.Second)
				continue
			}
			break
		}
		backoff = time.Second
		log.Info("MPS control daemon ready", "pipe", paths.pipe, "gpus", len(s.GPUs), "replicas", s.Replicas,
			"activeThreadPercentage", s.ThreadPercentage())
		healthy := true
		for healthy {
			select {
			case <-ctx.Done():
				m.stop(s, log)
				return
			case <-tick.C:
			}
			if err := m.check(ctx, s); err != nil {
				if ctx.Err() != nil {
					break
				}
				log.Warn("MPS control daemon does not answer; restarting it", "err", err)
				os.Remove(paths.ready)
				// A hung daemon may still hold the pipe: ask it to go first.
				if _, err := m.command(ctx, s, "quit"); err != nil {
					log.Debug("quit of the failed daemon", "err", err)
				}
				healthy = false
				continue
			}
			now := time.Now()
			if err := os.Chtimes(paths.ready, now, now); err != nil {
				log.Warn("touching the ready file", "err", err)
				if errors.Is(err, fs.ErrNotExist) {
					healthy = false // someone removed it: start over, which writes it
				}
			}
		}
	}
	m.stop(s, log)
}

// env is the daemon's (and its clients', the control program's) environment.
func (m *MPSManager) env(s MPSDaemonSpec) []string {
	paths := mpsPathsFor(m.Root, s.Resource)
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		envMPSPipeDir + "=" + paths.pipe,
		envMPSLogDir + "=" + paths.log,
		"CUDA_VISIBLE_DEVICES=" + strings.Join(gpuUUIDs(s), ","),
	}
	return append(env, m.Env...)
}

// command runs the control program with lines as its input and returns
// what it printed.
func (m *MPSManager) command(ctx context.Context, s MPSDaemonSpec, lines ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.Control)
	cmd.Env = m.env(s)
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	reply := strings.TrimSpace(out.String())
	if err != nil {
		return reply, fmt.Errorf("%s < %q: %v: %s", m.Control, strings.Join(lines, "; "), err, reply)
	}
	return reply, nil
}

// check asks the daemon a question it can only answer when it runs: its
// default active thread percentage (a number).
func (m *MPSManager) check(ctx context.Context, s MPSDaemonSpec) error {
	if _, err := os.Stat(filepath.Join(mpsPathsFor(m.Root, s.Resource).pipe, "control")); err != nil {
		return fmt.Errorf("the daemon's control socket: %w", err)
	}
	reply, err := m.command(ctx, s, "get_default_active_thread_percentage")
	if err != nil {
		return err
	}
	if _, perr := strconv.ParseFloat(strings.TrimSpace(reply), 64); perr != nil {
		return fmt.Errorf("get_default_active_thread_percentage answered %q, not a number", reply)
	}
	return nil
}

// start starts the daemon (or adopts one that already answers on the pipe
// directory, as after a restart of the manager alone: quitting it would
// wait for its clients), applies the defaults and writes the ready file.
func (m *MPSManager) start(ctx context.Context, s MPSDaemonSpec) error {
	paths := mpsPathsFor(m.Root, s.Resource)
	os.Remove(paths.ready)
	for _, d := range []string{paths.pipe, paths.log} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	for _, d := range []string{paths.pipe, paths.shm} {
		if err := labelForContainers(d); err != nil {
			m.Log.Warn("cannot label the directory for containers; SELinux may keep clients out", "dir", d, "err", err)
		}
	}
	if m.check(ctx, s) == nil {
		m.Log.Info("an MPS control daemon already answers on the pipe directory; adopting it", "resource", s.Resource, "pipe", paths.pipe)
	} else {
		if m.ComputeMode != nil {
			if err := m.ComputeMode(ctx, gpuUUIDs(s), true); err != nil {
				return fmt.Errorf("setting compute mode EXCLUSIVE_PROCESS: %w", err)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, m.Timeout)
		cmd := exec.CommandContext(cctx, m.Control, "-d")
		cmd.Env = m.env(s)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			return fmt.Errorf("%s -d: %v: %s", m.Control, err, strings.TrimSpace(string(out)))
		}
		// -d returns once the daemon forked; it answers a moment later.
		deadline := time.Now().Add(m.Timeout)
		for {
			err := m.check(ctx, s)
			if err == nil {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("the daemon started but does not answer: %w (see %s)", err, paths.log)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for i, g := range s.GPUs {
		if g.MemoryMiB == 0 {
			continue
		}
		// Ordinal i: the daemon sees s.GPUs in order (CUDA_VISIBLE_DEVICES).
		if _, err := m.command(ctx, s, fmt.Sprintf("set_default_device_pinned_mem_limit %d %dM", i, s.MemLimitMiB(g))); err != nil {
			return fmt.Errorf("setting the memory limit of GPU %d: %w", g.Index, err)
		}
	}
	if _, err := m.command(ctx, s, fmt.Sprintf("set_default_active_thread_percentage %d", s.ThreadPercentage())); err != nil {
		return fmt.Errorf("setting the active thread percentage: %w", err)
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
func (m *MPSManager) stop(s MPSDaemonSpec, log *slog.Logger) {
	os.Remove(mpsPathsFor(m.Root, s.Resource).ready)
	// ctx is done: the quit gets its own time.
	ctx := context.Background()
	if _, err := m.command(ctx, s, "quit"); err != nil {
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

// containerFileLabel is the SELinux label of files that unprivileged
// containers may use (what NVIDIA's daemon gives its pipe directory).
const containerFileLabel = "system_u:object_r:container_file_t:s0"

// labelForContainers gives dir the SELinux label containers may use, when
// SELinux is on (selinuxfs mounted); files made in it later inherit it.
func labelForContainers(dir string) error {
	if _, err := os.Stat("/sys/fs/selinux/enforce"); err != nil {
		return nil
	}
	return unix.Lsetxattr(dir, "security.selinux", []byte(containerFileLabel), 0)
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
