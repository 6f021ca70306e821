package discover

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/nvml"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

// A binary without NVML (gantry-runtime is built with the nonvml tag: a
// static binary, which go-nvml's dlopen of the host's libnvidia-ml cannot
// work in) asks the gantry binary for the GPUs when the light procfs
// discovery cannot answer: it runs `gantry gpus-json` (HelperCommand, a
// command gantry --help does not list) with an explicit environment, and
// reads the system or the error, with its class (ErrNoNVML,
// ErrDriverNotLoaded), from its standard output.

// HelperCommand is the hidden gantry command that prints the GPUs as JSON.
const HelperCommand = "gpus-json"

// DefaultHelperPath is where the gantry binary is looked for when there is
// none beside the running program and runtime.gantry-path is not set.
const DefaultHelperPath = "/usr/bin/gantry"

// helperEnvPath is the PATH the helper runs with; the rest of its
// environment is LD_LIBRARY_PATH, when set, which an in-process dlopen of
// NVML would have honoured too.
const helperEnvPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maxHelperReply bounds what is read from the helper (a few KB per GPU).
const maxHelperReply = 16 << 20

// helperReply is what HelperCommand prints: the GPUs, or the error.
type helperReply struct {
	GPUs  *gpu.System `json:"gpus,omitempty"`
	Error string      `json:"error,omitempty"`
	// Kind names the sentinel error it wraps, so errors.Is works across
	// the process boundary: "no-nvml", "driver-not-loaded" or "".
	Kind string `json:"kind,omitempty"`
}

var errorKinds = map[string]error{
	"no-nvml":           nvml.ErrNoNVML,
	"driver-not-loaded": nvml.ErrDriverNotLoaded,
}

// helperError is an error the helper reported, unwrapping to its class.
type helperError struct {
	msg  string
	kind error
}

func (e *helperError) Error() string { return e.msg }
func (e *helperError) Unwrap() error { return e.kind }

// HelperMain runs HelperCommand: --gpus (nvml or sim:...), --driver-root and
// --light, the same discovery GPUs does with NVML in this process. It reads
// no configuration. Exit code 0 with the GPUs, 1 with an error (also as
// JSON on stdout), 2 for a bad command line.
func HelperMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gantry "+HelperCommand, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	backend := fs.String("gpus", "nvml", "nvml or sim:PROFILE|FILE")
	root := fs.String("driver-root", "/", "where the driver is installed")
	light := fs.Bool("light", false, "skip the NVLinks")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gantry %s: usage: gantry %s [--gpus nvml|sim:...] [--driver-root DIR] [--light] (an internal command of gantry-runtime)\n", HelperCommand, HelperCommand)
		return 2
	}
	var sys *gpu.System
	var err error
	if spec, ok := strings.CutPrefix(*backend, "sim:"); ok {
		sys, err = sim.Load(spec)
	} else if *backend != "nvml" {
		err = fmt.Errorf("--gpus %q: %w", *backend, config.ValidateGPUs(*backend))
	} else {
		sys, err = nvml.Discover(nvml.Options{DriverRoot: *root, Light: *light})
	}
	reply := helperReply{GPUs: sys}
	code := 0
	if err != nil {
		reply = helperReply{Error: err.Error()}
		for name, kind := range errorKinds {
			if errors.Is(err, kind) {
				reply.Kind = name
			}
		}
		code = 1
	}
	if err := json.NewEncoder(stdout).Encode(reply); err != nil {
		fmt.Fprintf(stderr, "gantry %s: %v\n", HelperCommand, err)
		return 1
	}
	return code
}

// HelperPath is the gantry binary the gantry-runtime at self (its real
// path) asks for NVML's GPUs under configuration c, or the error that
// gantry-runtime would report: for gantry doctor.
func HelperPath(c config.Config, self string) (string, error) { return helperPath(c, self) }

// helperPath is the gantry binary to ask: runtime.gantry-path, else the
// gantry beside the running program (make install, bin/ of make build and
// the image put them side by side), else DefaultHelperPath. self is the
// running program's path.
func helperPath(c config.Config, self string) (string, error) {
	if p := c.Runtime.GantryPath; p != "" {
		if !IsExecutable(p) {
			return "", fmt.Errorf("%w: runtime.gantry-path %s is not an executable file: fix the path (the gantry binary, which loads NVML for gantry-runtime)", nvml.ErrNoNVML, p)
		}
		return p, nil
	}
	var tried []string
	if self != "" {
		p, ok := GantryBeside(self)
		if ok {
			return p, nil
		}
		tried = append(tried, p)
	}
	if IsExecutable(DefaultHelperPath) {
		return DefaultHelperPath, nil
	}
	tried = append(tried, DefaultHelperPath)
	return "", fmt.Errorf("%w: this program (%s) has no NVML of its own and asks the gantry binary for the GPUs when /proc/driver/nvidia cannot answer (MIG devices, or no driver proc files), but found no gantry at %s: install gantry beside it or set runtime.gantry-path", nvml.ErrNoNVML, filepath.Base(self), strings.Join(tried, " nor "))
}

// GantryBeside is the gantry binary beside the program at self, where make
// install, make build and the image put it, and whether it is there (an
// executable file). gantry-runtime's NVML helper and its nvidia-ctk
// hand-over both look there first.
func GantryBeside(self string) (string, bool) {
	p := filepath.Join(filepath.Dir(self), "gantry")
	return p, IsExecutable(p)
}

// IsExecutable reports whether p is a regular file with an execute bit.
func IsExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// LookPathIn is exec.LookPath against a given PATH value (an engine's,
// read from its /proc/PID/environ), not this process's. Relative entries
// are passed over: a daemon runs from /, and such an entry is not one to
// trust.
func LookPathIn(file, path string) (string, bool) {
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		if p := filepath.Join(dir, file); IsExecutable(p) {
			return p, true
		}
	}
	return "", false
}

// HelperTimeout bounds the NVML helper's answer: NVML's first start on a
// host with many GPUs and persistence mode off takes seconds.
const HelperTimeout = 60 * time.Second

// viaHelper asks the gantry binary at path for the NVML GPUs of c.
func viaHelper(path string, c config.Config, light bool) (*gpu.System, error) {
	root := c.DriverRoot
	if root == "" {
		root = "/"
	}
	args := []string{HelperCommand, "--gpus", c.GPUs, "--driver-root", root}
	if light {
		args = append(args, "--light")
	}
	cmd := exec.Command(path, args...)
	// The helper dies with its caller (an engine's timeout kills the
	// runtime; NVML on a wedged driver may never return).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Env = []string{"PATH=" + helperEnvPath}
	if v, ok := os.LookupEnv("LD_LIBRARY_PATH"); ok {
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+v)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, left: 4096}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	// Pdeathsig fires when the thread that forked the helper ends, not
	// the process: in a long-running caller (the create server, whose
	// hook requests end their own locked threads) that thread must live
	// until the helper is done, or the helper dies with it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("running %s %s (the gantry binary, which loads NVML for this one): %w; fix runtime.gantry-path or install gantry beside this program", path, HelperCommand, err)
	}
	// NVML on a wedged driver may never return: the helper gets
	// HelperTimeout, then it is killed and the container fails with why.
	// (A helper stuck inside the kernel dies only when the call returns:
	// no bound can be had there.)
	var killed atomic.Bool
	timer := time.AfterFunc(HelperTimeout, func() {
		killed.Store(true)
		_ = cmd.Process.Kill()
	})
	b, rerr := io.ReadAll(io.LimitReader(out, maxHelperReply))
	werr := cmd.Wait()
	timer.Stop()
	if killed.Load() && werr != nil {
		return nil, fmt.Errorf("%s %s (the gantry binary, which loads NVML for this one) gave no answer in %v and was killed: NVML did not return (see nvidia-smi and the kernel log)", path, HelperCommand, HelperTimeout)
	}
	var r helperReply
	if rerr != nil || json.Unmarshal(b, &r) != nil || (r.GPUs == nil && r.Error == "") {
		why := strings.TrimSpace(stderr.String())
		if why == "" && werr != nil {
			why = werr.Error()
		}
		return nil, fmt.Errorf("%s %s (the gantry binary, which loads NVML for this one) gave no answer: %s; check that it is Gantry's gantry of the same version as this program", path, HelperCommand, why)
	}
	if r.Error != "" {
		return nil, &helperError{msg: r.Error, kind: errorKinds[r.Kind]}
	}
	return r.GPUs, nil
}

// limitedBuffer keeps the first left bytes written to it.
type limitedBuffer struct {
	buf  *bytes.Buffer
	left int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	n := min(len(p), l.left)
	l.buf.Write(p[:n])
	l.left -= n
	return len(p), nil
}
