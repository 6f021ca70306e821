package draplugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/mps"
)

// Sharing a claim's devices (NVIDIA's GpuConfig and MigDeviceConfig
// sharing), applied at prepare and undone at unprepare:
//
//   - TimeSlicing: each whole GPU gets compute mode DEFAULT and the
//     interval's time-slice (`nvidia-smi compute-policy --set-timeslice`,
//     Intervals); unprepare gives it the default time-slice back. MIG
//     devices have no time-slice of their own: nothing is set for them.
//   - MPS: one MPS control daemon per configuration serves its devices,
//     with its pipe, log and shm directories in <state dir>/mps/<id>; the
//     whole GPUs get compute mode EXCLUSIVE_PROCESS while it runs, so that
//     only the MPS server opens them. The claim's CDI devices add what a
//     client needs: CUDA_MPS_PIPE_DIRECTORY and the pipe directory at
//     MPSContainerPipe, the daemon's shm directory at /dev/shm. The daemon
//     is checked every MPSCheckInterval and started again when it does not
//     answer; after a plugin restart the checkpoint's daemons are adopted
//     (or started again). Unprepare quits it and removes its directories.
//
// The programs are the host driver's own nvidia-smi and
// nvidia-cuda-mps-control, from the driver root, run in the host's root
// (chroot to --host-root) with an explicit environment (PATH and
// LD_LIBRARY_PATH of the driver's directories, the MPS variables): nothing
// of the plugin's container, nor of any claim's, runs on the host.

// MPSContainerPipe is where an MPS client finds the daemon's pipe
// directory (CUDA_MPS_PIPE_DIRECTORY), as with NVIDIA's DRA driver.
const MPSContainerPipe = "/tmp/nvidia-mps"

// mpsDirName is the directory of the MPS daemons under the state directory.
const mpsDirName = "mps"

// mpsRecord is the file in a daemon's directory that records it (a
// preparedSharing).
const mpsRecord = "sharing.json"

// maxSocketPath is the longest unix socket path (sun_path, less its NUL);
// the MPS server makes sockets in its pipe directory
// ("control_privileged" the longest name).
const maxSocketPath = 107

// preparedSharing is one applied sharing configuration, as the checkpoint
// records it: enough to undo it, and to restart an MPS daemon.
type preparedSharing struct {
	Strategy string   `json:"strategy"`
	Devices  []string `json:"devices"`
	// GPUs are the whole GPUs' UUIDs (time-slice and compute mode).
	GPUs     []string     `json:"gpus,omitempty"`
	Interval string       `json:"interval,omitempty"`
	MPS      *preparedMPS `json:"mps,omitempty"`
}

type preparedMPS struct {
	ID string `json:"id"`
	// Dir holds pipe, log and shm.
	Dir string `json:"dir"`
	// UUIDs are the daemon's devices, its CUDA_VISIBLE_DEVICES.
	UUIDs []string `json:"uuids"`
	// Threads is the default active thread percentage, -1 when unset.
	Threads   int            `json:"threads"`
	MemLimits map[int]string `json:"memLimits,omitempty"`
}

func (m *preparedMPS) pipe() string { return filepath.Join(m.Dir, "pipe") }
func (m *preparedMPS) log() string  { return filepath.Join(m.Dir, "log") }
func (m *preparedMPS) shm() string  { return filepath.Join(m.Dir, "shm") }

// programs finds the driver programs sharing runs, in the inventory, and
// the environment they run with, in host paths.
func (d *Driver) programs(inv *driver.Inventory, smi, control string) {
	d.smi, d.mpsControl = smi, control
	var libDirs []string
	if inv != nil {
		for _, f := range inv.Binaries {
			switch path.Base(f.ContainerPath) {
			case "nvidia-smi":
				if d.smi == "" {
					d.smi = f.HostPath
				}
			case mps.ControlBinary:
				if d.mpsControl == "" {
					d.mpsControl = f.HostPath
				}
			}
		}
		// A driver root other than the host's /: its libraries are not in
		// the host's ld.so.cache.
		if inv.Root != "" && filepath.Clean(inv.Root) != d.hostRoot {
			for _, f := range inv.Libraries {
				if dir := filepath.Dir(d.hostPath(f.HostPath)); f.Capability != driver.Compat32 && !slices.Contains(libDirs, dir) {
					libDirs = append(libDirs, dir)
				}
			}
		}
	}
	var bins []string
	for _, p := range []string{d.mpsControl, d.smi} {
		if dir := filepath.Dir(d.hostPath(p)); p != "" && !slices.Contains(bins, dir) {
			bins = append(bins, dir)
		}
	}
	d.progEnv = []string{"PATH=" + strings.Join(append(bins, "/usr/sbin", "/usr/bin", "/sbin", "/bin"), ":")}
	if len(libDirs) > 0 {
		d.progEnv = append(d.progEnv, "LD_LIBRARY_PATH="+strings.Join(libDirs, ":"))
	}
}

// hostPath is p, a path in the plugin's view, as the host sees it.
func (d *Driver) hostPath(p string) string {
	if d.hostRoot == "/" {
		return p
	}
	if rest, ok := strings.CutPrefix(p, d.hostRoot); ok && (rest == "" || rest[0] == '/') {
		return "/" + strings.TrimPrefix(rest, "/")
	}
	return p
}

// hostCmd runs the host program prog (a path in the plugin's view) in the
// host's root, with env only.
func (d *Driver) hostCmd(ctx context.Context, prog string, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, d.hostPath(prog), args...)
	cmd.Env = env
	cmd.WaitDelay = time.Second
	if d.hostRoot != "/" {
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: d.hostRoot}
		cmd.Dir = "/"
	}
	return cmd
}

// nvidiaSMI runs the driver's nvidia-smi with args.
func (d *Driver) nvidiaSMI(ctx context.Context, args ...string) error {
	if d.smi == "" {
		return errors.New("nvidia-smi is not among the driver's programs under the driver root (see --driver-root); time-slicing and MPS set the GPUs' compute mode and time-slice with it")
	}
	ctx, cancel := context.WithTimeout(ctx, d.mpsTimeout)
	defer cancel()
	out, err := d.hostCmd(ctx, d.smi, d.progEnv, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", d.hostPath(d.smi), strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (d *Driver) computeMode(ctx context.Context, gpus []string, mode string) error {
	for _, u := range gpus {
		if err := d.nvidiaSMI(ctx, "-i", u, "-c", mode); err != nil {
			return err
		}
	}
	return nil
}

// timeSlice gives the whole GPUs compute mode DEFAULT and the interval's
// time-slice.
func (d *Driver) timeSlice(ctx context.Context, gpus []string, interval string) error {
	n, ok := Intervals[interval]
	if !ok {
		return fmt.Errorf("time-slice interval %q is not one of Default, Short, Medium, Long", interval)
	}
	for _, u := range gpus {
		if err := d.nvidiaSMI(ctx, "-i", u, "-c", "DEFAULT"); err != nil {
			return err
		}
		if err := d.nvidiaSMI(ctx, "compute-policy", "-i", u, "--set-timeslice", strconv.Itoa(n)); err != nil {
			return err
		}
	}
	return nil
}

// mpsID names claim uid's k-th MPS daemon: short, so that the pipe
// directory's socket paths stay within the unix limit.
func mpsID(uid string, k int) string {
	sum := sha256.Sum256([]byte(uid + "/" + strconv.Itoa(k)))
	return hex.EncodeToString(sum[:6])
}

// planSharing turns plans into what prepare applies and records, and the
// CDI edits each device of an MPS daemon gets.
func (d *Driver) planSharing(uid string, plans []sharingPlan) ([]preparedSharing, map[string]specs.ContainerEdits, error) {
	var out []preparedSharing
	edits := map[string]specs.ContainerEdits{}
	k := 0
	for _, p := range plans {
		ps := preparedSharing{Strategy: p.strategy, Devices: p.devices, GPUs: p.gpus}
		switch p.strategy {
		case StrategyTimeSlicing:
			if len(p.gpus) == 0 {
				continue // MIG devices only: nothing to set
			}
			ps.Interval = p.interval
		case StrategyMPS:
			id := mpsID(uid, k)
			k++
			m := &preparedMPS{ID: id, Dir: filepath.Join(d.stateDir, mpsDirName, id), UUIDs: p.uuids, Threads: p.threads, MemLimits: p.memLimits}
			if n := len(m.pipe()) + len("/control_privileged"); n > maxSocketPath {
				return nil, nil, fmt.Errorf("%s: the MPS pipe directory %s makes socket paths of %d bytes, over the unix limit of %d: use a shorter --plugin-dir", p.where, m.pipe(), n, maxSocketPath)
			}
			ps.MPS = m
			ce := specs.ContainerEdits{
				Env: []string{mps.EnvPipeDir + "=" + MPSContainerPipe},
				Mounts: []*specs.Mount{
					{HostPath: m.pipe(), ContainerPath: MPSContainerPipe, Options: []string{"ro", "nosuid", "nodev", "noexec", "bind"}},
					{HostPath: m.shm(), ContainerPath: "/dev/shm", Options: []string{"rw", "nosuid", "nodev", "noexec", "bind"}},
				},
			}
			for _, dev := range p.devices {
				edits[dev] = ce
			}
		}
		out = append(out, ps)
	}
	return out, edits, nil
}

// applySharing applies shs in order; on failure it undoes what it applied.
func (d *Driver) applySharing(ctx context.Context, claim string, shs []preparedSharing) error {
	for i, sh := range shs {
		var err error
		switch {
		case sh.MPS != nil:
			err = d.startMPS(ctx, claim, sh)
		case sh.Strategy == StrategyTimeSlicing:
			err = d.timeSlice(ctx, sh.GPUs, sh.Interval)
		}
		if err != nil {
			if uerr := d.undoSharing(claim, shs[:i+1]); uerr != nil {
				d.log.Warn("undoing a claim's sharing after a failed prepare", "claim", claim, "err", uerr)
			}
			return fmt.Errorf("applying sharing strategy %s to %s: %w", sh.Strategy, strings.Join(sh.Devices, ", "), err)
		}
	}
	return nil
}

// undoSharing undoes shs: MPS daemons quit and their directories go, the
// GPUs get compute mode DEFAULT and the default time-slice back. It goes
// on past errors and returns them all.
func (d *Driver) undoSharing(claim string, shs []preparedSharing) error {
	ctx := context.Background()
	var errs []error
	for _, sh := range slices.Backward(shs) {
		switch {
		case sh.MPS != nil:
			errs = append(errs, d.stopMPS(ctx, claim, sh))
		case sh.Strategy == StrategyTimeSlicing:
			errs = append(errs, d.timeSlice(ctx, sh.GPUs, IntervalDefault))
		}
	}
	return errors.Join(errs...)
}

// mpsRun is a supervised MPS daemon.
type mpsRun struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// daemon is the mps.Daemon of m: the host's control program in the host's
// root; the daemon itself starts through the launcher (launch.go), which
// gives it the claim's shm directory as /dev/shm.
func (d *Driver) daemon(m *preparedMPS) *mps.Daemon {
	return &mps.Daemon{
		Pipe: m.pipe(), Log: m.log(), GPUs: m.UUIDs, Control: d.hostPath(d.mpsControl), Env: d.progEnv, Timeout: d.mpsTimeout, AnswerWait: d.mpsAnswerWait,
		Cmd: func(ctx context.Context, env []string, args ...string) *exec.Cmd {
			if slices.Equal(args, []string{"-d"}) {
				return d.launchCmd(ctx, m, env)
			}
			return d.hostCmd(ctx, d.mpsControl, env, args...)
		},
	}
}

// shmOnHost checks that the host sees the tmpfs mounted at shm (a path in
// the plugin's view, the same on the host): the runtime mounts it into the
// claim's containers from the host's mount table, which a mount made in
// the plugin's container reaches only through a Bidirectional volume.
func (d *Driver) shmOnHost(shm string) error {
	if d.hostRoot == "/" {
		return nil
	}
	var ours, host unix.Stat_t
	if err := unix.Stat(shm, &ours); err != nil {
		return err
	}
	hp := filepath.Join(d.hostRoot, shm)
	if err := unix.Stat(hp, &host); err != nil || host.Dev != ours.Dev {
		return fmt.Errorf("the MPS daemon's shm, a tmpfs mounted at %s, is not what the host sees there (%s): mount the plugin directory's volume with mountPropagation: Bidirectional", shm, hp)
	}
	return nil
}

// mpsUp makes m's directories, starts (or adopts) its daemon with the
// GPUs in compute mode EXCLUSIVE_PROCESS, and sets its defaults.
func (d *Driver) mpsUp(ctx context.Context, sh preparedSharing) error {
	if d.mpsControl == "" {
		return fmt.Errorf("%s is not among the driver's programs under the driver root (see --driver-root)", mps.ControlBinary)
	}
	m := sh.MPS
	// The state directory's mps/ is the host's business: 0711 lets the
	// runtime reach a claim's directories without listing the others.
	for _, dir := range []struct {
		path string
		mode os.FileMode
	}{
		{filepath.Dir(m.Dir), 0o711}, {m.Dir, 0o711},
		// Clients connect to the daemon's sockets here.
		{m.pipe(), 0o755},
		// Only the host reads the daemon's log.
		{m.log(), 0o700},
	} {
		if err := os.MkdirAll(dir.path, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", dir.path, err)
		}
		if err := os.Chmod(dir.path, dir.mode); err != nil {
			return fmt.Errorf("chmod %s: %w", dir.path, err)
		}
	}
	// The clients' and the daemon's /dev/shm: a tmpfs of this claim's
	// alone, bounded (kept when the daemon is adopted).
	if err := mps.MountShm(m.shm(), d.mpsShmSize); err != nil {
		return err
	}
	if err := d.shmOnHost(m.shm()); err != nil {
		_ = mps.UnmountShm(m.shm())
		return err
	}
	// What the daemon is, beside it: unprepare finds it by the claim's UID
	// even when a crash lost the claim before the checkpoint recorded it.
	rec, err := json.Marshal(sh)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(m.Dir, mpsRecord), append(rec, '\n'), atomicfile.Options{Mode: 0o600}); err != nil {
		return fmt.Errorf("recording the MPS daemon: %w", err)
	}
	for _, dir := range []string{m.pipe(), m.shm()} {
		if err := mps.LabelForContainers(dir); err != nil {
			d.log.Warn("cannot label the directory for containers; SELinux may keep MPS clients out", "dir", dir, "err", err)
		}
	}
	dm := d.daemon(m)
	adopted, err := dm.Start(ctx, func(ctx context.Context) error {
		if err := d.computeMode(ctx, sh.GPUs, "EXCLUSIVE_PROCESS"); err != nil {
			return fmt.Errorf("setting compute mode EXCLUSIVE_PROCESS: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := dm.SetDefaults(ctx, m.Threads, m.MemLimits); err != nil {
		return err
	}
	d.log.Info("MPS control daemon ready", "id", m.ID, "pipe", m.pipe(), "devices", len(m.UUIDs), "adopted", adopted,
		"activeThreadPercentage", m.Threads, "memLimits", len(m.MemLimits))
	return nil
}

// startMPS brings sh's daemon up now (prepare waits for it) and supervises
// it from then on.
func (d *Driver) startMPS(ctx context.Context, claim string, sh preparedSharing) error {
	if err := d.mpsUp(ctx, sh); err != nil {
		return err
	}
	d.superviseMPS(claim, sh, true)
	return nil
}

// superviseMPS keeps sh's daemon up until stopMPS or the plugin stops; up
// says it is up already. d.mu is held.
func (d *Driver) superviseMPS(claim string, sh preparedSharing, up bool) {
	if _, ok := d.mpsRuns[sh.MPS.ID]; ok {
		return
	}
	ctx, cancel := context.WithCancel(d.runCtx)
	r := &mpsRun{cancel: cancel, done: make(chan struct{})}
	d.mpsRuns[sh.MPS.ID] = r
	log := d.log.With("claim", claim, "mps", sh.MPS.ID)
	d.mpsWG.Go(func() {
		defer close(r.done)
		mps.Supervise(ctx, d.daemon(sh.MPS), d.mpsInterval, mps.Hooks{
			Up: func(ctx context.Context) error {
				if up {
					up = false
					return nil
				}
				return d.mpsUp(ctx, sh)
			},
		}, log)
	})
}

// stopMPS ends the supervision of sh's daemon, quits it, gives the GPUs
// compute mode DEFAULT back and removes the daemon's directories.
func (d *Driver) stopMPS(ctx context.Context, claim string, sh preparedSharing) error {
	m := sh.MPS
	if r, ok := d.mpsRuns[m.ID]; ok {
		r.cancel()
		<-r.done
		delete(d.mpsRuns, m.ID)
	}
	dm := d.daemon(m)
	if d.mpsControl != "" && dm.Check(ctx) == nil {
		if err := dm.Quit(ctx); err != nil {
			d.log.Warn("quitting the MPS control daemon", "claim", claim, "mps", m.ID, "err", err)
		}
		// The daemon removes its control socket as it exits.
		control := filepath.Join(m.pipe(), "control")
		for deadline := time.Now().Add(d.mpsTimeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(control); err != nil {
				break
			}
		}
	}
	var errs []error
	if err := d.computeMode(ctx, sh.GPUs, "DEFAULT"); err != nil {
		errs = append(errs, fmt.Errorf("restoring compute mode DEFAULT: %w", err))
	}
	if err := mps.UnmountShm(m.shm()); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(m.Dir); err != nil {
		errs = append(errs, fmt.Errorf("removing the MPS directories: %w", err))
	}
	if len(errs) == 0 {
		d.log.Info("MPS control daemon stopped", "claim", claim, "mps", m.ID)
	}
	return errors.Join(errs...)
}

// undoOrphans undoes the MPS daemons prepare started for claim uid that
// the checkpoint does not hold (the plugin stopped between the two):
// their directories are where mpsID puts them, with their record.
func (d *Driver) undoOrphans(claim, uid string) error {
	var errs []error
	for k := 0; ; k++ {
		rec, err := os.ReadFile(filepath.Join(d.stateDir, mpsDirName, mpsID(uid, k), mpsRecord))
		if err != nil {
			break
		}
		var sh preparedSharing
		if err := json.Unmarshal(rec, &sh); err != nil || sh.MPS == nil {
			errs = append(errs, fmt.Errorf("the record of MPS daemon %s: not a daemon's record (%v)", mpsID(uid, k), err))
			break
		}
		errs = append(errs, d.stopMPS(context.Background(), claim, sh))
	}
	return errors.Join(errs...)
}

// resumeSharing supervises the MPS daemons of the checkpoint's claims
// (kubelet does not prepare them again after a plugin restart): each is
// adopted when it still answers, else started again.
func (d *Driver) resumeSharing() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for uid, pc := range d.cp.Claims {
		for _, sh := range pc.Sharing {
			if sh.MPS != nil {
				d.superviseMPS(pc.Namespace+"/"+pc.Name+" uid "+uid, sh, false)
			}
		}
	}
}
