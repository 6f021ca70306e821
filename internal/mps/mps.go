package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ControlBinary is the MPS control program: with -d it starts the control
// daemon; without, it sends the commands of its standard input to the
// daemon of CUDA_MPS_PIPE_DIRECTORY, one a line, and prints the replies.
const ControlBinary = "nvidia-cuda-mps-control"

// The variables the control program and MPS clients read.
const (
	EnvPipeDir       = "CUDA_MPS_PIPE_DIRECTORY"
	EnvLogDir        = "CUDA_MPS_LOG_DIRECTORY"
	EnvMemLimit      = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	EnvThreadPercent = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
)

// Daemon is one MPS control daemon.
type Daemon struct {
	// Pipe and Log are its pipe and log directories, as the process that
	// runs the control program sees them.
	Pipe, Log string
	// GPUs are the UUIDs it serves, in order: ordinal i of its clients'
	// and of set_default_device_pinned_mem_limit is GPUs[i].
	GPUs []string
	// Control is the control program; empty means ControlBinary in PATH.
	Control string
	// Env is added to the control program's environment, which is
	// otherwise only the MPS variables (pipe, log, CUDA_VISIBLE_DEVICES).
	Env []string
	// Timeout bounds each run of the control program, and the wait for a
	// started daemon to answer unless AnswerWait is set; 0 means 10s.
	Timeout time.Duration
	// AnswerWait, when set, bounds the wait for a started daemon to
	// answer instead of Timeout.
	AnswerWait time.Duration
	// Cmd, when set, makes the exec.Cmd that runs the control program with
	// args (["-d"] to start the daemon; none to send commands), for a
	// caller that runs it in another root or mount namespace. It must set
	// the command's Env to env.
	Cmd func(ctx context.Context, env []string, args ...string) *exec.Cmd
}

func (d *Daemon) control() string {
	if d.Control == "" {
		return ControlBinary
	}
	return d.Control
}

func (d *Daemon) timeout() time.Duration {
	if d.Timeout <= 0 {
		return 10 * time.Second
	}
	return d.Timeout
}

// Environ is the control program's (and the daemon's) environment.
func (d *Daemon) Environ() []string {
	env := []string{
		EnvPipeDir + "=" + d.Pipe,
		EnvLogDir + "=" + d.Log,
		"CUDA_VISIBLE_DEVICES=" + strings.Join(d.GPUs, ","),
	}
	return append(env, d.Env...)
}

func (d *Daemon) cmd(ctx context.Context, args ...string) *exec.Cmd {
	if d.Cmd != nil {
		return d.Cmd(ctx, d.Environ(), args...)
	}
	cmd := exec.CommandContext(ctx, d.control(), args...)
	cmd.Env = d.Environ()
	return cmd
}

// controlSocket checks that the pipe directory's control socket is one: a
// container writes the pipe directory (its clients' mount), and a link
// there to another daemon's socket would send this daemon's commands
// (quit) to that one.
func (d *Daemon) controlSocket() error {
	p := filepath.Join(d.Pipe, "control")
	fi, err := os.Lstat(p)
	if err != nil {
		return fmt.Errorf("the daemon's control socket: %w", err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("the daemon's control socket %s is not a socket (%v): left alone", p, fi.Mode().Type())
	}
	return nil
}

// Command runs the control program with lines as its input and returns
// what it printed.
func (d *Daemon) Command(ctx context.Context, lines ...string) (string, error) {
	if err := d.controlSocket(); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout())
	defer cancel()
	cmd := d.cmd(ctx)
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	reply := strings.TrimSpace(out.String())
	if err != nil {
		return reply, fmt.Errorf("%s < %q: %v: %s", d.control(), strings.Join(lines, "; "), err, reply)
	}
	return reply, nil
}

// Check asks the daemon a question it can only answer when it runs: its
// default active thread percentage (a number).
func (d *Daemon) Check(ctx context.Context) error {
	reply, err := d.Command(ctx, "get_default_active_thread_percentage")
	if err != nil {
		return err
	}
	if _, perr := strconv.ParseFloat(strings.TrimSpace(reply), 64); perr != nil {
		return fmt.Errorf("get_default_active_thread_percentage answered %q, not a number", reply)
	}
	return nil
}

// Start starts the daemon and waits until it answers, or adopts one that
// already answers on the pipe directory (adopted true; quitting it would
// wait for its clients). before, when set, runs just before a new daemon
// starts (compute modes). The pipe and log directories must exist.
func (d *Daemon) Start(ctx context.Context, before func(context.Context) error) (adopted bool, err error) {
	if d.Check(ctx) == nil {
		return true, nil
	}
	if before != nil {
		if err := before(ctx); err != nil {
			return false, err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, d.timeout())
	cmd := d.cmd(cctx, "-d")
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = time.Second
	}
	out, err := cmd.CombinedOutput()
	cancel()
	if errors.Is(err, exec.ErrWaitDelay) {
		// -d succeeded, but the daemon it forked kept its output open:
		// whether it runs, the checks below tell.
		err = nil
	}
	if err != nil {
		return false, fmt.Errorf("%s -d: %v: %s", d.control(), err, strings.TrimSpace(string(out)))
	}
	// -d returns once the daemon forked; it answers a moment later.
	wait := d.timeout()
	if d.AnswerWait > 0 {
		wait = d.AnswerWait
	}
	deadline := time.Now().Add(wait)
	for {
		err := d.Check(ctx)
		if err == nil {
			return false, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false, fmt.Errorf("the daemon started but does not answer within %v: %w (see its log in %s)", wait, err, d.Log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// SetDefaults sets the per-client defaults: the active thread percentage
// (when threads >= 0) and the pinned device memory limits, by ordinal
// (index into GPUs), in the control program's form ("40960M").
func (d *Daemon) SetDefaults(ctx context.Context, threads int, memLimits map[int]string) error {
	for i := range d.GPUs {
		l, ok := memLimits[i]
		if !ok {
			continue
		}
		if _, err := d.Command(ctx, fmt.Sprintf("set_default_device_pinned_mem_limit %d %s", i, l)); err != nil {
			return fmt.Errorf("setting the pinned memory limit of GPU %s: %w", d.GPUs[i], err)
		}
	}
	if threads >= 0 {
		if _, err := d.Command(ctx, fmt.Sprintf("set_default_active_thread_percentage %d", threads)); err != nil {
			return fmt.Errorf("setting the active thread percentage: %w", err)
		}
	}
	return nil
}

// Quit tells the daemon to quit (it does once its clients are gone).
func (d *Daemon) Quit(ctx context.Context) error {
	_, err := d.Command(ctx, "quit")
	return err
}

// Hooks are what Supervise calls around a daemon's life.
type Hooks struct {
	// Up brings the daemon up (Start, then the defaults); required.
	Up func(ctx context.Context) error
	// Beat runs after each check the daemon passed; an error starts over
	// (Up again).
	Beat func() error
	// Down runs when a check failed, before the daemon is asked to quit
	// and started again.
	Down func(err error)
	// Stop runs once ctx is done, as Supervise returns.
	Stop func()
}

// Supervise keeps d up until ctx is done: it calls Up (retrying with
// backoff until it succeeds), checks every interval that the daemon
// answers, and when it does not, asks it to quit (a hung daemon may still
// hold the pipe) and brings it up again.
func Supervise(ctx context.Context, d *Daemon, interval time.Duration, h Hooks, log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	if interval <= 0 {
		interval = 5 * time.Second
	}
	backoff := time.Second
	tick := time.NewTicker(interval)
	defer tick.Stop()
	defer func() {
		if h.Stop != nil {
			h.Stop()
		}
	}()
	for {
		if err := h.Up(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Error("starting the MPS control daemon failed; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
				backoff = min(2*backoff, 30*time.Second)
				continue
			}
		}
		backoff = time.Second
		for healthy := true; healthy; {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := d.Check(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				log.Warn("MPS control daemon does not answer; restarting it", "err", err)
				if h.Down != nil {
					h.Down(err)
				}
				if err := d.Quit(ctx); err != nil {
					log.Debug("quit of the failed daemon", "err", err)
				}
				healthy = false
				continue
			}
			if h.Beat != nil {
				if err := h.Beat(); err != nil {
					log.Warn("after a health check", "err", err)
					healthy = false
				}
			}
		}
	}
}

// containerFileLabel is the SELinux label of files that unprivileged
// containers may use (what NVIDIA's daemon gives its pipe directory).
const containerFileLabel = "system_u:object_r:container_file_t:s0"

// LabelForContainers gives dir the SELinux label containers may use, when
// SELinux is on (selinuxfs mounted); files made in it later inherit it.
func LabelForContainers(dir string) error {
	if _, err := os.Stat("/sys/fs/selinux/enforce"); err != nil {
		return nil
	}
	return unix.Lsetxattr(dir, "security.selinux", []byte(containerFileLabel), 0)
}

// MaxClients is how many clients one MPS server takes on a GPU of compute
// capability cc: 48 from Volta (7.0) on, 16 before.
func MaxClients(cc string) int {
	major, _, _ := strings.Cut(cc, ".")
	if n, err := strconv.Atoi(major); err == nil && n >= 7 {
		return 48
	}
	return 16
}
