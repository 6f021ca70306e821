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
	// Log gets one line per step (the runtime's log file).
	Log func(msg string)
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
	rec.CUDAProcesses = len(pids)
	// The image holds the container's whole memory: a directory only root
	// can enter, made before CRIU writes into it.
	if err := os.MkdirAll(o.ImagePath, 0o700); err != nil {
		return 1, fmt.Errorf("checkpoint image directory: %w", err)
	}
	if err := os.Chmod(o.ImagePath, 0o700); err != nil {
		return 1, err
	}
	if len(pids) > 0 {
		start := time.Now()
		if err := o.suspend(pids); err != nil {
			return 1, err
		}
		o.log("CUDA lock and checkpoint of processes %v: %v", pids, time.Since(start).Round(time.Millisecond))
	}
	if err := refreeze(); err != nil {
		if len(pids) > 0 {
			if rerr := o.resume(pids, nil); rerr != nil {
				return 1, fmt.Errorf("%w; and the container goes on without its GPU state: %v", err, rerr)
			}
		}
		return 1, err
	}
	start := time.Now()
	code, rerr := o.runLowLevel(nil)
	o.log("%s checkpoint: exit %d, %v", filepath.Base(o.Runtime.Path), code, time.Since(start).Round(time.Millisecond))
	var errs []error
	if rerr != nil {
		errs = append(errs, rerr)
	}
	if code == 0 {
		if err := seal(o.ImagePath, rec); err != nil {
			errs = append(errs, err)
			code = 1
		}
	}
	if len(pids) > 0 && (code != 0 || o.LeaveRunning) {
		start := time.Now()
		if err := thaw(); err != nil {
			errs = append(errs, fmt.Errorf("the container's CUDA state stays checkpointed: %w", err))
			return 1, errors.Join(errs...)
		}
		if err := o.resume(pids, nil); err != nil {
			errs = append(errs, fmt.Errorf("the container goes on without its GPU state: %w", err))
			code = 1
		} else {
			o.log("CUDA restore and unlock of processes %v: %v", pids, time.Since(start).Round(time.Millisecond))
		}
	}
	if err := refreeze(); err != nil {
		errs = append(errs, err)
		code = 1
	}
	return code, errors.Join(errs...)
}

// suspend locks every process, then checkpoints each; on a failure it
// undoes what it did and returns why.
func (o *Options) suspend(pids []int) error {
	rs, err := o.Helper.run(cudackpt.OpLock, pids, nil)
	if err != nil {
		if locked := done(rs); len(locked) > 0 {
			if _, uerr := o.Helper.run(cudackpt.OpUnlock, locked, nil); uerr != nil {
				return fmt.Errorf("CUDA lock: %w; and unlocking those locked: %v", err, uerr)
			}
		}
		return fmt.Errorf("CUDA lock: %w (the container goes on)", err)
	}
	rs, err = o.Helper.run(cudackpt.OpCheckpoint, pids, nil)
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
func (o *Options) resume(pids []int, pairs []cudackpt.Pair) error {
	if _, err := o.Helper.run(cudackpt.OpRestore, pids, pairs); err != nil {
		return fmt.Errorf("CUDA restore: %w", err)
	}
	if _, err := o.Helper.run(cudackpt.OpUnlock, pids, nil); err != nil {
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
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, RecordFile), append(b, '\n'), atomicfile.Options{Mode: 0o600}); err != nil {
		return fmt.Errorf("writing %s: %w", RecordFile, err)
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
	rec, found, err := ReadRecord(o.ImagePath)
	if err != nil {
		return 1, err
	}
	var pairs []cudackpt.Pair
	if found && rec.CUDAProcesses > 0 {
		_, minors, err := SpecGPUs(bundleSpec)
		if err != nil {
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
			// The driver must remap, or nothing is started.
			if _, err := o.Helper.run(cudackpt.OpSupport, nil, pairs); err != nil {
				return 1, fmt.Errorf("refusing to restore onto other GPUs: %w", err)
			}
			o.log("restoring GPUs %s onto %s", uuids(rec.GPUs), uuids(now))
		}
	}
	if !found || rec.CUDAProcesses == 0 {
		return o.runLowLevel(nil)
	}
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
		o.log("%s restore: exit %d, %v", filepath.Base(o.Runtime.Path), code, time.Since(start).Round(time.Millisecond))
		if code != 0 || err != nil {
			return code, err
		}
		return 0, o.restoreCUDA(rec, pairs)
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
	if err := o.restoreCUDA(rec, pairs); err != nil {
		return 1, err
	}
	r := <-exited
	return r.code, r.err
}

// restoreCUDA restores and unlocks the CUDA state of the restored
// container's processes.
func (o *Options) restoreCUDA(rec Record, pairs []cudackpt.Pair) error {
	start := time.Now()
	st, err := o.Runtime.State(o.ID)
	if err != nil {
		return err
	}
	pids, err := o.cudaProcesses(st.PID, cudackpt.Checkpointed)
	if err != nil {
		return fmt.Errorf("after the restore: %w", err)
	}
	if len(pids) != rec.CUDAProcesses {
		o.log("restore: %d processes are CUDA-checkpointed, the checkpoint had %d", len(pids), rec.CUDAProcesses)
	}
	if len(pids) == 0 {
		return nil
	}
	if err := o.resume(pids, pairs); err != nil {
		return err
	}
	o.log("CUDA restore and unlock of processes %v: %v", pids, time.Since(start).Round(time.Millisecond))
	return nil
}
