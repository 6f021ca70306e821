// Package ctrckpt checkpoints and restores GPU containers: what
// gantry-runtime does for runc's checkpoint and restore commands.
//
// CRIU cannot dump a process that holds GPU state (device files, mappings
// of GPU memory). The CUDA driver's process checkpoint API (package
// cudackpt) moves that state into the process's host memory and releases
// the device files; then the low-level runtime's checkpoint (CRIU) dumps the
// container like any other. Checkpoint, for a container with GPUs:
//
//  1. finds the container's processes from its cgroup (the init's, as the
//     low-level runtime's own state names it), each checked to be in that
//     cgroup and the init's mount namespace (Processes); those that map
//     libcuda or hold /dev/nvidia* files are asked their CUDA state;
//  2. locks every CUDA process, then checkpoints each (in that order, so
//     that none runs CUDA work while another is being checkpointed);
//  3. runs the low-level runtime's checkpoint with the engine's arguments;
//  4. after --leave-running (or --pre-dump), or when anything failed,
//     restores and unlocks each process, so the container goes on.
//
// The image directory is made mode 0700 and every file in it 0600 (they
// hold the whole memory of the container), and Record (RecordFile) notes
// the GPUs the container had.
//
// Restore runs the low-level runtime's restore (the caller has injected
// the GPUs the restore's request names into config.json first), then
// restores and unlocks the CUDA state of every process the driver reports
// checkpointed. When the request names other GPUs than the checkpoint's,
// they must be as many and of the same model, and the driver must remap
// GPUs (r580): each old GPU is mapped onto a new one by the driver's GPU
// UUID pairs; otherwise the restore is refused before anything is done.
package ctrckpt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
	"github.com/gantry-gpu/gantry/internal/cudackpt"
	"github.com/gantry-gpu/gantry/internal/edits"
)

// RecordFile is Record's file in the checkpoint's image directory.
const RecordFile = "gantry-gpus.json"

// Record is what a checkpoint notes for its restore.
type Record struct {
	// GPUs the container had, by device minor.
	GPUs []GPU `json:"gpus"`
	// CUDAProcesses is how many processes were CUDA-checkpointed.
	CUDAProcesses int `json:"cudaProcesses"`
	// DriverVersion is the NVIDIA driver's.
	DriverVersion string `json:"driverVersion,omitempty"`
	// Timings are the checkpoint's phases; LastRestore the last restore's
	// from this image (written when the image directory can be written).
	Timings     *Timings `json:"timings,omitempty"`
	LastRestore *Timings `json:"lastRestore,omitempty"`
}

// Timings are the phases of a checkpoint or restore, in milliseconds (0:
// the phase did not run). Checkpoint: CUDALock, CUDACheckpoint (every CUDA
// process, in turn), Runtime (the low-level runtime's checkpoint: CRIU's
// dump), and after --leave-running (or a failure's undo) CUDARestore and
// CUDAUnlock; GPUIdle is from the start of the CUDA lock to the end of the
// CUDA unlock when the container goes on, else to the end of the dump (the
// container stopped). Restore: Probe (the driver's remap verdict, when
// the GPUs move), Runtime (the low-level runtime's restore), DevNodes (the
// restored /dev's GPU nodes), CUDARestore, CUDAUnlock; GPUIdle is 0. Total
// is the whole command as gantry-runtime ran it.
type Timings struct {
	CUDALockMS       float64 `json:"cudaLockMs,omitempty"`
	CUDACheckpointMS float64 `json:"cudaCheckpointMs,omitempty"`
	ProbeMS          float64 `json:"probeMs,omitempty"`
	RuntimeMS        float64 `json:"runtimeMs,omitempty"`
	DevNodesMS       float64 `json:"devNodesMs,omitempty"`
	CUDARestoreMS    float64 `json:"cudaRestoreMs,omitempty"`
	CUDAUnlockMS     float64 `json:"cudaUnlockMs,omitempty"`
	GPUIdleMS        float64 `json:"gpuIdleMs,omitempty"`
	TotalMS          float64 `json:"totalMs"`
}

// ms is d in milliseconds, to a tenth.
func ms(d time.Duration) float64 { return float64(d.Round(100*time.Microsecond)) / 1e6 }

// String is the timings in words, for the log and gantry checkpoint.
func (t Timings) String() string {
	var parts []string
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"CUDA lock", t.CUDALockMS}, {"CUDA checkpoint", t.CUDACheckpointMS}, {"probe", t.ProbeMS},
		{"runtime", t.RuntimeMS}, {"/dev nodes", t.DevNodesMS}, {"CUDA restore", t.CUDARestoreMS},
		{"CUDA unlock", t.CUDAUnlockMS}, {"GPU idle", t.GPUIdleMS}, {"total", t.TotalMS},
	} {
		if f.v > 0 || f.name == "total" {
			parts = append(parts, fmt.Sprintf("%s %.1f ms", f.name, f.v))
		}
	}
	return strings.Join(parts, ", ")
}

// GPU is one GPU of a container.
type GPU struct {
	Minor int    `json:"minor"`
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
}

// Runtime is the low-level runtime and the global flags the engine gave
// it (--root, --systemd-cgroup, ...).
type Runtime struct {
	Path   string
	Global []string
}

// RuncState is what `runc state` prints that is used here.
type RuncState struct {
	PID    int    `json:"pid"`
	Status string `json:"status"`
	Bundle string `json:"bundle"`
}

// State asks the low-level runtime for the container's state: its init
// process, from the runtime's own state directory.
func (r Runtime) State(id string) (RuncState, error) {
	args := append(append([]string{}, r.Global...), "state", id)
	var out, errOut bytes.Buffer
	cmd := exec.Command(r.Path, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return RuncState{}, fmt.Errorf("%s state %s: %v: %s", r.Path, id, err, strings.TrimSpace(errOut.String()))
	}
	var s RuncState
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		return s, fmt.Errorf("%s state %s: %w", r.Path, id, err)
	}
	return s, nil
}

// Do runs one command of the low-level runtime on container id (pause,
// resume), its output in the error when it fails.
func (r Runtime) Do(command, id string) error {
	args := append(append([]string{}, r.Global...), command, id)
	out, err := exec.Command(r.Path, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s %s: %v: %s", r.Path, command, id, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// SpecGPUs reads a config.json: whether Gantry injected GPUs into it (or
// it has NVIDIA device nodes some other way, CDI through the engine), and
// the minors of its /dev/nvidiaN nodes.
func SpecGPUs(raw []byte) (gpu bool, minors []int, err error) {
	var spec struct {
		Annotations map[string]string `json:"annotations"`
		Linux       *struct {
			Devices []struct {
				Path  string `json:"path"`
				Minor *int64 `json:"minor"`
			} `json:"devices"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		return false, nil, fmt.Errorf("config.json: %w", err)
	}
	_, gpu = spec.Annotations[edits.InjectedAnnotation]
	if spec.Linux != nil {
		for _, d := range spec.Linux.Devices {
			if !strings.HasPrefix(d.Path, "/dev/nvidia") {
				continue
			}
			gpu = true
			if n, err := strconv.Atoi(strings.TrimPrefix(d.Path, "/dev/nvidia")); err == nil && d.Minor != nil && int64(n) == *d.Minor {
				minors = append(minors, n)
			}
		}
	}
	sort.Ints(minors)
	return gpu, minors, nil
}

// Helper runs the CUDA calls (package cudackpt).
type Helper struct {
	// Gantry is the gantry binary; Lib the driver's libcuda.so.1.
	Gantry, Lib string
	// LockTimeoutMS bounds the lock's wait for running CUDA work.
	LockTimeoutMS uint
}

func (h Helper) run(op cudackpt.Op, pids []int, pairs []cudackpt.Pair) ([]cudackpt.Result, error) {
	return cudackpt.Run(h.Gantry, cudackpt.Request{Lib: h.Lib, Op: op, PIDs: pids, Pairs: pairs, TimeoutMS: h.LockTimeoutMS})
}

// done lists the PIDs whose call succeeded.
func done(rs []cudackpt.Result) []int {
	var out []int
	for _, r := range rs {
		if r.Error == "" {
			out = append(out, r.PID)
		}
	}
	return out
}

// Options is one checkpoint or restore.
type Options struct {
	Runtime Runtime
	Helper  Helper
	// Args is the engine's command line (without the program name): the
	// low-level runtime gets it unchanged.
	Args []string
	ID   string
	// ImagePath is the image directory (absolute).
	ImagePath string
	// LeaveRunning: --leave-running or --pre-dump.
	LeaveRunning bool
	// Detach: restore's --detach; PIDFile its --pid-file.
	Detach  bool
	PIDFile string
	// GPUs maps the device minors of a config.json to the host's GPUs.
	GPUs func(minors []int) ([]GPU, error)
	// DriverVersion is noted in the record.
	DriverVersion string
	// CacheDir keeps the driver's probe verdict (runtime.cache-dir).
	CacheDir string
	// RequestGPUs is the GPUs a config.json's request names (env,
	// annotations, mounts, Gantry's CDI names), whatever it was given.
	RequestGPUs func(spec []byte) ([]GPU, error)
	// Log gets one line per step (the runtime's log file).
	Log func(msg string)
	// LogTimings gets the phases' timings at the end (the log file).
	LogTimings func(Timings)
	// Stdin, Stdout and Stderr are the low-level runtime's.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

func (o *Options) log(format string, a ...any) {
	if o.Log != nil {
		o.Log(fmt.Sprintf(format, a...))
	}
}

// cudaProcesses finds the processes of the container with init pid that
// hold CUDA state, and checks that each is running (not locked or
// checkpointed already). want is the state they must be in.
func (o *Options) cudaProcesses(initPID int, want cudackpt.State) ([]int, error) {
	procs, err := Processes(initPID)
	if err != nil {
		return nil, err
	}
	var cands []CUDAUse
	var pids []int
	for _, p := range procs {
		u, err := InspectCUDA(p)
		if err != nil || !u.Uses() {
			continue
		}
		cands = append(cands, u)
		pids = append(pids, p)
	}
	if len(pids) == 0 {
		return nil, nil
	}
	rs, err := o.Helper.run(cudackpt.OpState, pids, nil)
	if errors.Is(err, cudackpt.ErrNoAPI) || len(rs) != len(pids) {
		return nil, err
	}
	var out []int
	for i, r := range rs {
		u := cands[i]
		switch {
		case r.Error != "" && len(u.DeviceFiles) > 0:
			return nil, fmt.Errorf("process %d holds %s, but the driver reports no CUDA checkpoint state for it: %s (CUresult %d); it cannot be checkpointed", r.PID, strings.Join(u.DeviceFiles, ", "), r.Error, r.Code)
		case r.Error != "":
			// libcuda loaded, no context: nothing on the GPU.
			o.log("process %d maps libcuda but has no CUDA state (%s): left to CRIU", r.PID, r.Error)
		case r.State != want:
			return nil, fmt.Errorf("process %d is %s, not %s, for the CUDA driver", r.PID, r.State, want)
		default:
			out = append(out, r.PID)
		}
	}
	return out, nil
}

// Checkpoint checkpoints the GPU container o.ID: CUDA lock and checkpoint,
// the low-level runtime's checkpoint, and CUDA restore and unlock when the
// container goes on. It returns the exit code for the engine (the
// low-level runtime's), with an error when Gantry's part failed.
func Checkpoint(o Options) (int, error) {
	begin := time.Now()
	st, err := o.Runtime.State(o.ID)
	if err != nil {
		return 1, err
	}
	// containerd (ctr, CRI) pauses a container before its checkpoint, so
	// that its root file system, copied afterwards, matches the memory
	// image. The CUDA driver does its part through a thread of the process
	// itself, which a frozen cgroup never runs: the container is thawed for
	// the CUDA calls and paused again before the low-level runtime's
	// checkpoint (as CRIU's CUDA plugin does), and left paused.
	paused := st.Status == "paused"
	if st.Status != "running" && !paused {
		return 1, fmt.Errorf("container is %s: a GPU container is checkpointed running or paused", st.Status)
	}
	thawed := false
	thaw := func() error {
		if !paused || thawed {
			return nil
		}
		if err := o.Runtime.Do("resume", o.ID); err != nil {
			return fmt.Errorf("thawing the paused container for the CUDA calls: %w", err)
		}
		thawed = true
		return nil
	}
	refreeze := func() error {
		if !thawed {
			return nil
		}
		if err := o.Runtime.Do("pause", o.ID); err != nil {
			return fmt.Errorf("pausing the container again after the CUDA calls: %w", err)
		}
		thawed = false
		return nil
	}
	defer refreeze()
	if err := thaw(); err != nil {
		return 1, err
	}
	raw, err := os.ReadFile(filepath.Join(st.Bundle, "config.json"))
	if err != nil {
		return 1, fmt.Errorf("reading the container's config.json: %w", err)
	}
	_, minors, err := SpecGPUs(raw)
	if err != nil {
		return 1, err
	}
	rec := Record{DriverVersion: o.DriverVersion}
	if o.GPUs != nil && len(minors) > 0 {
		if rec.GPUs, err = o.GPUs(minors); err != nil {
			return 1, fmt.Errorf("the container's GPUs: %w", err)
		}
	}
	pids, err := o.cudaProcesses(st.PID, cudackpt.Running)
	if err != nil {
		return 1, err
	}
	if len(pids) > 0 {
		// What the driver cannot checkpoint is refused before the lock.
		var models []string
		for _, g := range rec.GPUs {
			models = append(models, g.Name)
		}
		fs, err := Assess(st.PID, models)
		if err != nil {
			return 1, err
		}
		if r := Refusals(fs); r != "" {
			return 1, fmt.Errorf("refusing to checkpoint (nothing was changed): %s", r)
		}
		for _, f := range fs {
			o.log("%s", f)
		}
	}
	rec.CUDAProcesses = len(pids)
	// The image holds the container's whole memory: a directory only root
	// can enter, made before CRIU writes into it.
	if err := os.MkdirAll(o.ImagePath, 0o700); err != nil {
		return 1, fmt.Errorf("checkpoint image directory: %w", err)
	}
	if err := os.Chmod(o.ImagePath, 0o700); err != nil {
		return 1, err
	}
	var tm Timings
	defer func() {
		tm.TotalMS = ms(time.Since(begin))
		if o.LogTimings != nil {
			o.LogTimings(tm)
		}
	}()
	lockStart := time.Now()
	if len(pids) > 0 {
		if err := o.suspend(pids, &tm); err != nil {
			tm.GPUIdleMS = ms(time.Since(lockStart))
			return 1, err
		}
		o.log("CUDA lock and checkpoint of processes %v: %.1f ms, %.1f ms", pids, tm.CUDALockMS, tm.CUDACheckpointMS)
	}
	if err := refreeze(); err != nil {
		if len(pids) > 0 {
			if rerr := o.resume(pids, nil, &tm); rerr != nil {
				return 1, fmt.Errorf("%w; and the container goes on without its GPU state: %v", err, rerr)
			}
		}
		return 1, err
	}
	start := time.Now()
	code, rerr := o.runLowLevel(nil)
	tm.RuntimeMS = ms(time.Since(start))
	if len(pids) > 0 {
		tm.GPUIdleMS = ms(time.Since(lockStart))
	}
	rec.Timings = &tm
	o.log("%s checkpoint: exit %d, %.1f ms", filepath.Base(o.Runtime.Path), code, tm.RuntimeMS)
	var errs []error
	if rerr != nil {
		errs = append(errs, rerr)
	}
	if code == 0 {
		tm.TotalMS = ms(time.Since(begin))
		if err := seal(o.ImagePath, rec); err != nil {
			errs = append(errs, err)
			code = 1
		}
	}
	if len(pids) > 0 && (code != 0 || o.LeaveRunning) {
		if err := thaw(); err != nil {
			errs = append(errs, fmt.Errorf("the container's CUDA state stays checkpointed: %w", err))
			return 1, errors.Join(errs...)
		}
		err := o.resume(pids, nil, &tm)
		tm.GPUIdleMS = ms(time.Since(lockStart))
		if err != nil {
			errs = append(errs, fmt.Errorf("the container goes on without its GPU state: %w", err))
			code = 1
		} else {
			o.log("CUDA restore and unlock of processes %v: %.1f ms, %.1f ms", pids, tm.CUDARestoreMS, tm.CUDAUnlockMS)
		}
		if code == 0 {
			// The record gets the resume's phases too.
			tm.TotalMS = ms(time.Since(begin))
			if err := writeRecord(o.ImagePath, rec); err != nil {
				errs = append(errs, err)
				code = 1
			}
		}
	}
	o.log("timings: %s", tm)
	if err := refreeze(); err != nil {
		errs = append(errs, err)
		code = 1
	}
	return code, errors.Join(errs...)
}

// suspend locks every process, then checkpoints each; on a failure it
// undoes what it did and returns why.
func (o *Options) suspend(pids []int, tm *Timings) error {
	start := time.Now()
	rs, err := o.Helper.run(cudackpt.OpLock, pids, nil)
	tm.CUDALockMS = ms(time.Since(start))
	if err != nil {
		if locked := done(rs); len(locked) > 0 {
			if _, uerr := o.Helper.run(cudackpt.OpUnlock, locked, nil); uerr != nil {
				return fmt.Errorf("CUDA lock: %w; and unlocking those locked: %v", err, uerr)
			}
		}
		return fmt.Errorf("CUDA lock: %w (the container goes on)", err)
	}
	start = time.Now()
	rs, err = o.Helper.run(cudackpt.OpCheckpoint, pids, nil)
	tm.CUDACheckpointMS = ms(time.Since(start))
	if err != nil {
		uerr := o.undo(done(rs), pids)
		if uerr != nil {
			return fmt.Errorf("CUDA checkpoint: %w; and undoing it: %v", err, uerr)
		}
		return fmt.Errorf("CUDA checkpoint: %w (the container goes on)", err)
	}
	return nil
}

// undo restores the checkpointed processes and unlocks all the locked ones.
func (o *Options) undo(checkpointed, locked []int) error {
	var errs []error
	if len(checkpointed) > 0 {
		if _, err := o.Helper.run(cudackpt.OpRestore, checkpointed, nil); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := o.Helper.run(cudackpt.OpUnlock, locked, nil); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// resume restores and unlocks the processes.
func (o *Options) resume(pids []int, pairs []cudackpt.Pair, tm *Timings) error {
	start := time.Now()
	_, err := o.Helper.run(cudackpt.OpRestore, pids, pairs)
	tm.CUDARestoreMS = ms(time.Since(start))
	if err != nil {
		return fmt.Errorf("CUDA restore: %w", err)
	}
	start = time.Now()
	_, err = o.Helper.run(cudackpt.OpUnlock, pids, nil)
	tm.CUDAUnlockMS = ms(time.Since(start))
	if err != nil {
		return fmt.Errorf("CUDA unlock: %w", err)
	}
	return nil
}

// runLowLevel runs the low-level runtime with the engine's arguments (plus
// extra after the subcommand) and waits for it. started, if set, is called
// while it runs and gets its process.
func (o *Options) runLowLevel(extra []string) (int, error) {
	args := o.Args
	if len(extra) > 0 {
		i := len(o.Runtime.Global)
		args = append(append(append([]string{}, o.Args[:i+1]...), extra...), o.Args[i+1:]...)
	}
	cmd := exec.Command(o.Runtime.Path, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = o.Stdin, o.Stdout, o.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	if err != nil {
		return 1, fmt.Errorf("running %s: %w", o.Runtime.Path, err)
	}
	return 0, nil
}

// seal writes the record and makes the image directory's files readable
// by root only: 0700 directories, 0600 files.
func seal(dir string, rec Record) error {
	if err := writeRecord(dir, rec); err != nil {
		return err
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			return nil
		case d.IsDir():
			return os.Chmod(p, 0o700)
		default:
			return os.Chmod(p, 0o600)
		}
	})
}

// ReadRecord reads the record a checkpoint left in dir; found is false
// when there is none (a checkpoint of a container without GPUs, or not
// made through Gantry).
func ReadRecord(dir string) (rec Record, found bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, RecordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, false, fmt.Errorf("%s: %w", filepath.Join(dir, RecordFile), err)
	}
	return rec, true, nil
}

// Pairs decides how the checkpoint's GPUs map onto the restore's: none
// when they are the same GPUs; else one pair per GPU, in minor order, when
// they are as many and each of the same model. An error says why the
// restore cannot have these GPUs.
func Pairs(old, new []GPU) ([]cudackpt.Pair, error) {
	if len(old) != len(new) {
		return nil, fmt.Errorf("the checkpoint ran on %d GPUs (%s) and the restore's request names %d (%s): restore onto as many GPUs of the same model", len(old), uuids(old), len(new), uuids(new))
	}
	same := true
	for i := range old {
		if old[i].UUID != new[i].UUID {
			same = false
		}
	}
	if same {
		return nil, nil
	}
	var pairs []cudackpt.Pair
	for i := range old {
		if old[i].Name != new[i].Name {
			return nil, fmt.Errorf("the checkpoint's GPU %s is a %s, the restore's %s a %s: the CUDA driver restores onto the same model only", old[i].UUID, old[i].Name, new[i].UUID, new[i].Name)
		}
		pairs = append(pairs, cudackpt.Pair{Old: old[i].UUID, New: new[i].UUID})
	}
	return pairs, nil
}

func uuids(g []GPU) string {
	var s []string
	for _, d := range g {
		s = append(s, d.UUID)
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// Restore restores container o.ID from o.ImagePath through the low-level
// runtime, then the CUDA state of its processes. bundleSpec is the
// restore's config.json (its GPUs already injected). ran reports whether
// the low-level runtime was run: when false, nothing was changed.
func Restore(o Options, bundleSpec []byte) (code int, err error) {
	begin := time.Now()
	var tm Timings
	rec, found, err := ReadRecord(o.ImagePath)
	if err != nil {
		return 1, err
	}
	if err := o.checkRequest(bundleSpec); err != nil {
		return 1, err
	}
	var pairs []cudackpt.Pair
	var nodes []DevNode
	if found && rec.CUDAProcesses > 0 {
		_, minors, err := SpecGPUs(bundleSpec)
		if err != nil {
			return 1, err
		}
		if nodes, err = SpecDevNodes(bundleSpec); err != nil {
			return 1, err
		}
		var now []GPU
		if len(minors) > 0 {
			if o.GPUs == nil {
				return 1, errors.New("no GPU list to map the restore's GPUs")
			}
			if now, err = o.GPUs(minors); err != nil {
				return 1, fmt.Errorf("the restore's GPUs: %w", err)
			}
		}
		if pairs, err = Pairs(rec.GPUs, now); err != nil {
			return 1, fmt.Errorf("refusing to restore: %w", err)
		}
		if len(pairs) > 0 {
			// The driver must remap, or nothing is started: its verdict,
			// probed once per driver version (cudackpt.Probe).
			pstart := time.Now()
			v, cached, err := cudackpt.Probe(o.Helper.Gantry, cudackpt.ProbeRequest{Lib: o.Helper.Lib, CacheDir: o.CacheDir, DriverVersion: o.DriverVersion})
			tm.ProbeMS = ms(time.Since(pstart))
			if err != nil {
				return 1, fmt.Errorf("refusing to restore GPUs %s onto %s: whether NVIDIA driver %s can is unknown: %w", uuids(rec.GPUs), uuids(now), o.DriverVersion, err)
			}
			if !v.Allows() {
				return 1, fmt.Errorf("refusing to restore GPUs %s onto %s: %s%s. Restore with the checkpoint's GPUs in the request (NVIDIA_VISIBLE_DEVICES=%s), or on a host whose driver can (gantry checkpoint --probe-remap says)", uuids(rec.GPUs), uuids(now), v, keptNote(o.CacheDir, v, cached), uuidList(rec.GPUs))
			}
			if v.Remap == cudackpt.RemapIdentityOnly {
				o.log("restoring GPUs %s onto %s: %s", uuids(rec.GPUs), uuids(now), v)
			} else {
				o.log("restoring GPUs %s onto %s", uuids(rec.GPUs), uuids(now))
			}
		}
	}
	if !found || rec.CUDAProcesses == 0 {
		code, err := o.runLowLevel(nil)
		if found && o.Detach && code == 0 && err == nil {
			// No CUDA state, but the container's /dev must still hold the
			// request's GPU nodes, not the checkpoint's.
			err = o.syncMoved(rec, bundleSpec)
		}
		return code, err
	}
	defer func() {
		tm.TotalMS = ms(time.Since(begin))
		o.log("timings: %s", tm)
		if o.LogTimings != nil {
			o.LogTimings(tm)
		}
		if code == 0 && err == nil {
			// Best effort: the image may be read-only (an imported archive).
			rec.LastRestore = &tm
			if werr := writeRecord(o.ImagePath, rec); werr != nil {
				o.log("the restore's timings are not in %s: %v", RecordFile, werr)
			}
		}
	}()
	start := time.Now()
	var extra []string
	pidFile := o.PIDFile
	if !o.Detach && pidFile == "" {
		// runc restore without --detach waits for the container: the
		// CUDA restore happens meanwhile, once runc wrote the pid file.
		dir, err := os.MkdirTemp("", "gantry-restore-")
		if err != nil {
			return 1, err
		}
		defer os.RemoveAll(dir)
		pidFile = filepath.Join(dir, "pid")
		extra = []string{"--pid-file", pidFile}
	}
	if o.Detach {
		code, err := o.runLowLevel(extra)
		tm.RuntimeMS = ms(time.Since(start))
		o.log("%s restore: exit %d, %.1f ms", filepath.Base(o.Runtime.Path), code, tm.RuntimeMS)
		if code != 0 || err != nil {
			return code, err
		}
		return 0, o.restoreCUDA(rec, pairs, nodes, &tm)
	}
	// Foreground: run it, wait for the pid file, restore CUDA, then wait
	// for the container's end.
	type result struct {
		code int
		err  error
	}
	exited := make(chan result, 1)
	go func() {
		c, e := o.runLowLevel(extra)
		exited <- result{c, e}
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-exited:
			return r.code, r.err
		case <-tick.C:
		}
		if b, err := os.ReadFile(pidFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
			break
		}
	}
	tm.RuntimeMS = ms(time.Since(start))
	if err := o.restoreCUDA(rec, pairs, nodes, &tm); err != nil {
		return 1, err
	}
	r := <-exited
	return r.code, r.err
}

// restoreCUDA restores and unlocks the CUDA state of the restored
// container's processes. When the GPUs move (pairs), the container's /dev
// first gets the nodes of the restore's GPUs (nodes) in place of the
// checkpoint's (SyncDevNodes).
func (o *Options) restoreCUDA(rec Record, pairs []cudackpt.Pair, nodes []DevNode, tm *Timings) error {
	st, err := o.Runtime.State(o.ID)
	if err != nil {
		return err
	}
	pids, err := o.cudaProcesses(st.PID, cudackpt.Checkpointed)
	if err != nil {
		return fmt.Errorf("after the restore: %w", err)
	}
	if len(pairs) > 0 {
		var stale []int
		for _, g := range rec.GPUs {
			stale = append(stale, g.Minor)
		}
		dstart := time.Now()
		err := SyncDevNodes(st.PID, nodes, stale)
		tm.DevNodesMS = ms(time.Since(dstart))
		if err != nil {
			return fmt.Errorf("after the restore: %w", err)
		}
		o.log("restored container's /dev: GPU nodes %v (the checkpoint's %v removed)", minorsOf(nodes), stale)
	}
	if len(pids) != rec.CUDAProcesses {
		o.log("restore: %d processes are CUDA-checkpointed, the checkpoint had %d", len(pids), rec.CUDAProcesses)
	}
	if len(pids) == 0 {
		return nil
	}
	if err := o.resume(pids, pairs, tm); err != nil {
		return err
	}
	o.log("CUDA restore and unlock of processes %v: %.1f ms, %.1f ms", pids, tm.CUDARestoreMS, tm.CUDAUnlockMS)
	return nil
}

func minorsOf(nodes []DevNode) []int {
	var out []int
	for _, n := range nodes {
		out = append(out, n.Minor)
	}
	return out
}

func uuidList(g []GPU) string {
	var s []string
	for _, d := range g {
		s = append(s, d.UUID)
	}
	return strings.Join(s, ",")
}

// keptNote says where a verdict is kept, and how to probe again.
func keptNote(dir string, v cudackpt.Verdict, cached bool) string {
	if dir == "" {
		return ""
	}
	p := cudackpt.CacheFile(dir, v.DriverVersion)
	if cached {
		return " (kept in " + p + "; gantry checkpoint --probe-remap probes again)"
	}
	return " (kept in " + p + ")"
}

// writeRecord writes the record (0600, atomically).
func writeRecord(dir string, rec Record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, RecordFile), append(b, '\n'), atomicfile.Options{Mode: 0o600}); err != nil {
		return fmt.Errorf("writing %s: %w", RecordFile, err)
	}
	return nil
}

// checkRequest refuses a restore whose config.json gives the container
// other GPUs than its request names. A config.json Gantry injected already
// (edits.InjectedAnnotation: an engine that hands the restore the spec of
// the create, or a retried restore) keeps the GPUs of that injection, and
// its request may since name others: the request at restore time decides,
// and a restore never gives the container GPUs its request does not name.
// A spec without Gantry's mark has the engine's devices (CDI), which are
// its request.
func (o *Options) checkRequest(spec []byte) error {
	var peek struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(spec, &peek); err != nil {
		return fmt.Errorf("config.json: %w", err)
	}
	mark, injected := peek.Annotations[edits.InjectedAnnotation]
	if !injected || o.RequestGPUs == nil {
		return nil
	}
	_, minors, err := SpecGPUs(spec)
	if err != nil {
		return err
	}
	var given []GPU
	if len(minors) > 0 {
		if o.GPUs == nil {
			return errors.New("no GPU list to check the restore's GPUs")
		}
		if given, err = o.GPUs(minors); err != nil {
			return fmt.Errorf("the restore's GPUs: %w", err)
		}
	}
	want, err := o.RequestGPUs(spec)
	if err != nil {
		return fmt.Errorf("the restore's GPU request: %w", err)
	}
	if sameUUIDs(given, want) {
		return nil
	}
	return fmt.Errorf("refusing to restore: config.json carries Gantry's injection (annotation %s=%q) of GPUs %s, but its request names %s: a restore gets only the GPUs its request names. Hand the restore the engine's config.json without Gantry's changes (its request is then injected), or make the request name %s", edits.InjectedAnnotation, mark, uuids(given), uuids(want), uuids(given))
}

func sameUUIDs(a, b []GPU) bool {
	if len(a) != len(b) {
		return false
	}
	set := map[string]bool{}
	for _, g := range a {
		set[g.UUID] = true
	}
	for _, g := range b {
		if !set[g.UUID] {
			return false
		}
	}
	return true
}

// syncMoved gives a restored container without CUDA state the request's
// GPU nodes when they differ from the checkpoint's.
func (o *Options) syncMoved(rec Record, spec []byte) error {
	nodes, err := SpecDevNodes(spec)
	if err != nil {
		return err
	}
	var stale []int
	same := len(nodes) == len(rec.GPUs)
	for i, g := range rec.GPUs {
		stale = append(stale, g.Minor)
		if same && nodes[i].Minor != g.Minor {
			same = false
		}
	}
	if same {
		return nil
	}
	st, err := o.Runtime.State(o.ID)
	if err != nil {
		return err
	}
	if _, err := Processes(st.PID); err != nil {
		return fmt.Errorf("after the restore: %w", err)
	}
	if err := SyncDevNodes(st.PID, nodes, stale); err != nil {
		return fmt.Errorf("after the restore: %w", err)
	}
	o.log("restored container's /dev: GPU nodes %v (the checkpoint's %v removed)", minorsOf(nodes), stale)
	return nil
}
