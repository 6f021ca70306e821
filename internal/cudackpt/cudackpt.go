// Package cudackpt drives the CUDA driver's process checkpoint API
// (cuCheckpointProcessLock, ...Checkpoint, ...Restore, ...Unlock and
// ...GetState in libcuda, driver r570 and later; GPU UUID remapping on
// restore from r580): it moves a process's GPU state into its host memory
// and releases its device files, so that CRIU can dump it like any process,
// and back.
//
// The calls need libcuda loaded in the calling process. gantry-runtime is a
// static binary that cannot dlopen, so it runs the gantry binary's hidden
// command `gantry cuda-checkpoint` (HelperCommand, HelperMain), which
// dlopens libcuda.so.1 (cgo) and answers in JSON; Run is the caller's side.
// The calls act on host PIDs: the caller must have checked that each
// belongs to the container it means (package ctrckpt does).
package cudackpt

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// HelperCommand is the hidden gantry command that makes the calls.
const HelperCommand = "cuda-checkpoint"

// Op is one call of the API, applied to every PID given.
type Op string

const (
	OpLock       Op = "lock"
	OpCheckpoint Op = "checkpoint"
	OpRestore    Op = "restore"
	OpUnlock     Op = "unlock"
	OpState      Op = "state"
	// OpSupport calls nothing: it checks that the driver has the API (and
	// GPU remapping, with pairs), for a refusal before anything changes.
	OpSupport Op = "support"
	// OpProbe finds whether the driver restores a CUDA process onto
	// another GPU (Probe), with --cache-dir and --driver-version.
	OpProbe Op = "probe"
	// OpProbeChild is the probe's own CUDA process.
	OpProbeChild Op = "probe-child"
)

var ops = map[Op]bool{OpLock: true, OpCheckpoint: true, OpRestore: true, OpUnlock: true, OpState: true, OpSupport: true, OpProbe: true, OpProbeChild: true}

// pidless are the operations that take no PID.
var pidless = map[Op]bool{OpSupport: true, OpProbe: true, OpProbeChild: true}

// State is a process's CUDA checkpoint state (CUprocessState).
type State string

const (
	Running      State = "running"
	Locked       State = "locked"
	Checkpointed State = "checkpointed"
	Failed       State = "failed"
)

func stateName(v int) State {
	switch v {
	case 0:
		return Running
	case 1:
		return Locked
	case 2:
		return Checkpointed
	case 3:
		return Failed
	}
	return State("state-" + strconv.Itoa(v))
}

// Result is one PID's answer.
type Result struct {
	PID int `json:"pid"`
	// State is the process's state after the call (OpState), or empty.
	State State `json:"state,omitempty"`
	// Code and Error are the CUresult of a failed call and its name.
	Code  int    `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
}

// Reply is what the helper prints: one result per PID it got to (it stops
// at the first failure, except for OpState), or the error that stopped it
// before any call.
type Reply struct {
	Results []Result `json:"results,omitempty"`
	Error   string   `json:"error,omitempty"`
	// NoAPI reports that libcuda has no checkpoint API (driver < r570),
	// or no GPU remapping when pairs were asked for (< r580).
	NoAPI bool `json:"noAPI,omitempty"`
	// Probe is OpProbe's verdict.
	Probe *Verdict `json:"probe,omitempty"`
}

// ErrNoAPI is what Run's error wraps when the driver lacks the API.
var ErrNoAPI = errors.New("the NVIDIA driver has no CUDA process checkpoint API (driver r570 or later; r580 or later to restore onto other GPUs)")

// Pair maps a checkpointed GPU onto the GPU to restore it on, by UUID
// ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx").
type Pair struct{ Old, New string }

// UUIDBytes is the 16 bytes of a "GPU-..." UUID (CUuuid).
func UUIDBytes(uuid string) ([16]byte, error) {
	var b [16]byte
	s, ok := strings.CutPrefix(uuid, "GPU-")
	if !ok {
		return b, fmt.Errorf("GPU UUID %q: want GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", uuid)
	}
	s = strings.ReplaceAll(s, "-", "")
	raw, err := hex.DecodeString(s)
	if err != nil || len(raw) != 16 {
		return b, fmt.Errorf("GPU UUID %q: want GPU- and 32 hex digits", uuid)
	}
	copy(b[:], raw)
	return b, nil
}

// Request is one helper call.
type Request struct {
	// Lib is the libcuda to load (a path); empty loads libcuda.so.1 by
	// the loader's rules.
	Lib string
	Op  Op
	// TimeoutMS bounds OpLock's wait for running CUDA work (0: none).
	TimeoutMS uint
	// Pairs remap GPUs on OpRestore; every checkpointed GPU must be in it.
	Pairs []Pair
	PIDs  []int
}

func (r Request) args() []string {
	a := []string{HelperCommand}
	if r.Lib != "" {
		a = append(a, "--lib", r.Lib)
	}
	if r.TimeoutMS > 0 {
		a = append(a, "--timeout-ms", strconv.FormatUint(uint64(r.TimeoutMS), 10))
	}
	for _, p := range r.Pairs {
		a = append(a, "--map", p.Old+"="+p.New)
	}
	a = append(a, string(r.Op))
	for _, p := range r.PIDs {
		a = append(a, strconv.Itoa(p))
	}
	return a
}

// HelperTimeout bounds one helper call: a checkpoint copies the GPU memory
// to the host (64 GiB at a few GB/s: tens of seconds).
const HelperTimeout = 10 * time.Minute

// helperEnvPath is the PATH the helper runs with.
const helperEnvPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Run runs gantry (the gantry binary's path) for req. It returns the
// results the helper printed, and an error if any call failed or the
// helper could not answer (wrapping ErrNoAPI when the driver lacks the API).
func Run(gantry string, req Request) ([]Result, error) {
	cmd := exec.Command(gantry, req.args()...)
	// An explicit environment: the helper loads the driver's library as
	// root, and the caller's environment may come from an engine.
	cmd.Env = []string{"PATH=" + helperEnvPath}
	if v, ok := os.LookupEnv("LD_LIBRARY_PATH"); ok {
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("running %s %s (the gantry binary, which loads libcuda for gantry-runtime): %w", gantry, HelperCommand, err)
	}
	timer := time.AfterFunc(HelperTimeout, func() { _ = cmd.Process.Kill() })
	werr := cmd.Wait()
	timer.Stop()
	var r Reply
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		why := strings.TrimSpace(stderr.String())
		if why == "" && werr != nil {
			why = werr.Error()
		}
		return nil, fmt.Errorf("%s %s %s gave no answer: %s", gantry, HelperCommand, req.Op, why)
	}
	if r.Error != "" {
		if r.NoAPI {
			return r.Results, fmt.Errorf("%w: %s", ErrNoAPI, r.Error)
		}
		return r.Results, errors.New(r.Error)
	}
	for _, res := range r.Results {
		if res.Error != "" {
			return r.Results, fmt.Errorf("cuCheckpointProcess %s of process %d: %s (CUresult %d)", req.Op, res.PID, res.Error, res.Code)
		}
	}
	if len(r.Results) != len(req.PIDs) {
		return r.Results, fmt.Errorf("%s %s %s answered for %d of %d processes", gantry, HelperCommand, req.Op, len(r.Results), len(req.PIDs))
	}
	return r.Results, nil
}

// api is libcuda's checkpoint API, loaded (lib_cgo.go) or not.
type api interface {
	lock(pid int, timeoutMS uint) (int, string)
	checkpoint(pid int) (int, string)
	restore(pid int, pairs [][2][16]byte) (int, string)
	unlock(pid int) (int, string)
	state(pid int) (int, int, string)
	close()
}

const usage = "usage: gantry " + HelperCommand + " [--lib PATH] [--timeout-ms N] [--map OLD-UUID=NEW-UUID]... lock|checkpoint|restore|unlock|state PID... | support | [--cache-dir DIR --driver-version V] [--fresh] probe (an internal command of gantry-runtime)"

// HelperMain runs HelperCommand: the call named by its argument on each
// PID, in order, stopping at the first failure (state asks every PID).
// It prints a Reply; exit code 0 when every call succeeded, 1 otherwise,
// 2 for a bad command line.
func HelperMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gantry "+HelperCommand, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	lib := fs.String("lib", "", "the libcuda to load")
	timeout := fs.Uint("timeout-ms", 0, "lock timeout")
	cacheDir := fs.String("cache-dir", "", "probe: where the verdict is kept")
	driverVersion := fs.String("driver-version", "", "probe: the NVIDIA driver's version")
	fresh := fs.Bool("fresh", false, "probe: even when a verdict is kept")
	var pairs [][2][16]byte
	fs.Func("map", "OLD=NEW GPU UUIDs", func(s string) error {
		o, n, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("--map %q: want OLD-UUID=NEW-UUID", s)
		}
		ob, err := UUIDBytes(o)
		if err != nil {
			return err
		}
		nb, err := UUIDBytes(n)
		if err != nil {
			return err
		}
		pairs = append(pairs, [2][16]byte{ob, nb})
		return nil
	})
	bad := func(err error) int {
		fmt.Fprintf(stderr, "gantry %s: %v\n%s\n", HelperCommand, err, usage)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		return bad(err)
	}
	op := Op(fs.Arg(0))
	if !ops[op] || (fs.NArg() < 2) != pidless[op] {
		return bad(errors.New("want an operation and at least one PID (support, probe: none)"))
	}
	switch op {
	case OpProbeChild:
		return probeChildMain(*lib, os.Stdin, stdout)
	case OpProbe:
		if *cacheDir != "" && *driverVersion == "" {
			return bad(errors.New("probe: --cache-dir needs --driver-version"))
		}
		reply := probeMain(*lib, *cacheDir, *driverVersion, *fresh)
		if err := json.NewEncoder(stdout).Encode(reply); err != nil || reply.Probe == nil {
			return 1
		}
		return 0
	}
	var pids []int
	for _, a := range fs.Args()[1:] {
		p, err := strconv.Atoi(a)
		if err != nil || p <= 0 {
			return bad(fmt.Errorf("PID %q: not a positive number", a))
		}
		pids = append(pids, p)
	}
	if len(pairs) > 0 && op != OpRestore && op != OpSupport {
		return bad(errors.New("--map goes with restore and support only"))
	}
	reply := run(*lib, op, uint(*timeout), pairs, pids)
	if err := json.NewEncoder(stdout).Encode(reply); err != nil {
		fmt.Fprintf(stderr, "gantry %s: %v\n", HelperCommand, err)
		return 1
	}
	if reply.Error != "" {
		return 1
	}
	for _, r := range reply.Results {
		if r.Error != "" {
			return 1
		}
	}
	return 0
}

func run(lib string, op Op, timeout uint, pairs [][2][16]byte, pids []int) Reply {
	a, noAPI, err := load(lib, op == OpRestore, len(pairs) > 0)
	if err != nil {
		return Reply{Error: err.Error(), NoAPI: noAPI}
	}
	defer a.close()
	var out Reply
	for _, pid := range pids {
		r := Result{PID: pid}
		var code int
		var name string
		switch op {
		case OpLock:
			code, name = a.lock(pid, timeout)
		case OpCheckpoint:
			code, name = a.checkpoint(pid)
		case OpRestore:
			code, name = a.restore(pid, pairs)
		case OpUnlock:
			code, name = a.unlock(pid)
		case OpState:
			var st int
			st, code, name = a.state(pid)
			if code == 0 {
				r.State = stateName(st)
			}
		}
		if code != 0 {
			r.Code, r.Error = code, name
		}
		out.Results = append(out.Results, r)
		if code != 0 && op != OpState {
			break
		}
	}
	return out
}

// Supported reports whether the libcuda at lib (empty: libcuda.so.1 by the
// loader's rules) has the process checkpoint API, and GPU remapping on
// restore when pairs is set, in this process (gantry doctor). noAPI
// distinguishes a driver without it from a library that cannot be loaded.
func Supported(lib string, pairs bool) (noAPI bool, err error) {
	a, noAPI, err := load(lib, false, pairs)
	if err != nil {
		return noAPI, err
	}
	a.close()
	return false, nil
}

// uuidString is the "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" form of a CUuuid.
func uuidString(b [16]byte) string {
	h := hex.EncodeToString(b[:])
	return "GPU-" + h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
