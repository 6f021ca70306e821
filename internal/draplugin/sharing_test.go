package draplugin

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/mps"
	"github.com/gantry-gpu/gantry/internal/mps/mpstest"
)

// TestMain runs the MPS launcher when the test binary is started as one
// (the plugin starts MPS daemons through its own binary), and quiets the
// default logger unless -v.
func TestMain(m *testing.M) {
	LaunchMain()
	// The MPS tests mount each daemon's shm: in a mount namespace of the
	// tests' own.
	mpstest.PrivateMounts()
	flag.Parse()
	if !testing.Verbose() {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	os.Exit(m.Run())
}

// fakeSMI is a stand-in for the driver's nvidia-smi: a script that appends
// its arguments to a file, and its environment to another, and fails
// (exit 3) while the file fail exists.
type fakeSMI struct{ dir, path string }

func newFakeSMI(t testing.TB) *fakeSMI {
	t.Helper()
	f := &fakeSMI{dir: t.TempDir()}
	f.path = filepath.Join(f.dir, "bin", "nvidia-smi")
	script := fmt.Sprintf("#!/bin/sh\nenv > %[1]s/env\nif [ -e %[1]s/fail ]; then echo 'Unable to set: Insufficient Permissions' >&2; exit 3; fi\necho \"$*\" >> %[1]s/calls\n", f.dir)
	if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fakeSMI) calls() string {
	b, _ := os.ReadFile(filepath.Join(f.dir, "calls"))
	return string(b)
}

func (f *fakeSMI) reset() { os.Remove(filepath.Join(f.dir, "calls")) }

func (f *fakeSMI) failing(on bool) {
	p := filepath.Join(f.dir, "fail")
	if on {
		os.WriteFile(p, nil, 0o644)
	} else {
		os.Remove(p)
	}
}

func (e *testEnv) checkpoint() *checkpoint {
	e.t.Helper()
	cp, err := readCheckpoint(filepath.Join(e.pluginDir, CheckpointFile), DefaultDriverName)
	if err != nil {
		e.t.Fatal(err)
	}
	return cp
}

// Time-slicing: each whole GPU of the claim gets compute mode DEFAULT and
// the interval's time-slice from the driver's nvidia-smi (run with its own
// environment only), recorded in the checkpoint; unprepare gives the
// default time-slice back. A MIG device gets nothing.
func TestTimeSlicing(t *testing.T) {
	t.Setenv("GANTRY_LEAK", "1")
	f := newFakeSMI(t)
	e := newEnvSetup(t, "h100x8", func(e *testEnv, _ string) { e.smi = f.path })
	u3, u6 := e.sys.Devices[3].UUID, e.sys.Devices[6].UUID
	c := e.configure(e.claim("ts", "gpu-6", "gpu-3"),
		opaque(resourceapi.AllocationConfigSourceClass, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Short"}}}`),
		opaque(resourceapi.AllocationConfigSourceClaim, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`))
	cdiIDs(t, e.prepare(c), c)
	lo, hi := min(u3, u6), max(u3, u6)
	want := fmt.Sprintf("-i %[1]s -c DEFAULT\ncompute-policy -i %[1]s --set-timeslice 3\n-i %[2]s -c DEFAULT\ncompute-policy -i %[2]s --set-timeslice 3\n", lo, hi)
	if got := f.calls(); got != want {
		t.Errorf("nvidia-smi calls (the claim's Long over the class's Short):\n%s\nwant\n%s", got, want)
	}
	env, _ := os.ReadFile(filepath.Join(f.dir, "env"))
	if strings.Contains(string(env), "GANTRY_LEAK") || !strings.Contains(string(env), filepath.Dir(f.path)+":/usr/sbin:/usr/bin:/sbin:/bin\n") {
		t.Errorf("nvidia-smi ran with the plugin's environment, or without the driver's PATH:\n%s", env)
	}
	sh := e.checkpoint().Claims[string(c.UID)].Sharing
	if len(sh) != 1 || sh[0].Strategy != StrategyTimeSlicing || sh[0].Interval != IntervalLong || !slices.Equal(sh[0].GPUs, []string{lo, hi}) {
		t.Errorf("checkpoint sharing %+v", sh)
	}
	// Prepared already: a repeat applies nothing.
	f.reset()
	cdiIDs(t, e.prepare(c), c)
	if got := f.calls(); got != "" {
		t.Errorf("a repeated prepare ran nvidia-smi: %s", got)
	}
	// A restart keeps it: unprepare after it gives the default back.
	e.stop()
	e.start()
	e.unprepare(c)
	want = fmt.Sprintf("-i %[1]s -c DEFAULT\ncompute-policy -i %[1]s --set-timeslice 0\n-i %[2]s -c DEFAULT\ncompute-policy -i %[2]s --set-timeslice 0\n", lo, hi)
	if got := f.calls(); got != want {
		t.Errorf("unprepare's nvidia-smi calls:\n%s\nwant\n%s", got, want)
	}

	// nvidia-smi fails: the claim fails with its message, no spec.
	f.reset()
	f.failing(true)
	c2 := e.configure(e.claim("ts-fail", "gpu-1"),
		opaque(resourceapi.AllocationConfigSourceClaim, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Medium"}}}`))
	r := e.prepare(c2).Claims[string(c2.UID)]
	if r == nil || !strings.Contains(r.Error, "Insufficient Permissions") || !strings.Contains(r.Error, "compute-policy") && !strings.Contains(r.Error, "-c DEFAULT") {
		t.Errorf("prepare with a failing nvidia-smi: %+v", r)
	}
	if _, err := os.Stat(e.drv.SpecPath(c2.UID)); err == nil {
		t.Error("spec written although the time-slice was not set")
	}
	if _, ok := e.checkpoint().Claims[string(c2.UID)]; ok {
		t.Error("failed claim checkpointed")
	}
	f.failing(false)
	cdiIDs(t, e.prepare(c2), c2) // the kubelet's retry
	if !strings.Contains(f.calls(), "--set-timeslice 2") {
		t.Errorf("retry: %s", f.calls())
	}
}

// No nvidia-smi in the driver: a time-slice cannot be set, and the claim
// says so.
func TestTimeSlicingWithoutSMI(t *testing.T) {
	e := newEnv(t, "h100x8")
	e.drv.smi = "" // a driver without it
	c := e.configure(e.claim("nosmi", "gpu-0"),
		opaque(resourceapi.AllocationConfigSourceClaim, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`))
	r := e.prepare(c).Claims[string(c.UID)]
	if r == nil || !strings.Contains(r.Error, "nvidia-smi is not among the driver's programs") || !strings.Contains(r.Error, "--driver-root") {
		t.Errorf("prepare: %+v", r)
	}
}

// MIG devices: time-slicing (NVIDIA's MigDeviceConfig) sets nothing.
func TestTimeSlicingMIG(t *testing.T) {
	f := newFakeSMI(t)
	e := newEnvSetup(t, "a100x2-mig", func(e *testEnv, _ string) { e.smi = f.path })
	c := e.configure(e.claim("tsmig", "gpu-1-mig-1g5gb-9-0"),
		opaque(resourceapi.AllocationConfigSourceClaim, DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"TimeSlicing"}}`))
	cdiIDs(t, e.prepare(c), c)
	e.unprepare(c)
	if got := f.calls(); got != "" {
		t.Errorf("nvidia-smi ran for a MIG device: %s", got)
	}
}

// mpsEnv is a node with the fake nvidia-smi and MPS control program.
func mpsEnv(t *testing.T, profile string) (*testEnv, *fakeSMI) {
	t.Helper()
	f := newFakeSMI(t)
	control := mpstest.BuildFake(t)
	e := newEnvSetup(t, profile, func(e *testEnv, _ string) {
		e.smi, e.mpsControl, e.mpsInterval = f.path, control, 50*time.Millisecond
	})
	return e, f
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // however busy the machine
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within a minute: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readLines(path string) []string {
	b, _ := os.ReadFile(path)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// sameShm reports whether process pid's /dev/shm (seen through its root,
// in its mount namespace) is the file system at shm.
func sameShm(t *testing.T, pid int, shm string) bool {
	t.Helper()
	var theirs, want unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/root/dev/shm", pid), &theirs); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(shm, &want); err != nil {
		t.Fatal(err)
	}
	return theirs.Dev == want.Dev && theirs.Ino == want.Ino
}

// MPS: prepare starts one control daemon for the claim's GPUs with their
// compute mode EXCLUSIVE_PROCESS, its own pipe, log and shm directories
// (the daemon sees the claim's shm as /dev/shm), the claim's defaults;
// the CDI devices give clients the pipe and shm. A killed daemon is
// started again; a plugin restart adopts the running one; unprepare quits
// it, restores compute mode DEFAULT and removes its directories.
func TestMPSClaim(t *testing.T) {
	e, f := mpsEnv(t, "h100x8")
	u2, u5 := e.sys.Devices[2].UUID, e.sys.Devices[5].UUID
	uuids := []string{u2, u5}
	slices.Sort(uuids)
	c := e.configure(e.claim("mps", "gpu-5", "gpu-2"),
		opaque(resourceapi.AllocationConfigSourceClaim, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi","defaultPerDevicePinnedMemoryLimit":{"`+uuids[1]+`":"5Gi"}}}}`))
	ids := cdiIDs(t, e.prepare(c), c)

	sh := e.checkpoint().Claims[string(c.UID)].Sharing
	if len(sh) != 1 || sh[0].MPS == nil {
		t.Fatalf("checkpoint sharing %+v", sh)
	}
	m := sh[0].MPS
	if filepath.Dir(m.Dir) != filepath.Join(e.pluginDir, "mps") || !slices.Equal(m.UUIDs, uuids) || m.Threads != 50 {
		t.Errorf("checkpointed daemon %+v", m)
	}
	logFile := filepath.Join(m.log(), "control.log")
	want := []string{"start " + strings.Join(uuids, ","), "set_default_device_pinned_mem_limit 0 10240M", "set_default_device_pinned_mem_limit 1 5120M", "set_default_active_thread_percentage 50"}
	if got := slices.DeleteFunc(readLines(logFile), func(l string) bool { return l == "get_default_active_thread_percentage" }); !slices.Equal(got, want) {
		t.Errorf("daemon got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := f.calls(); got != fmt.Sprintf("-i %s -c EXCLUSIVE_PROCESS\n-i %s -c EXCLUSIVE_PROCESS\n", uuids[0], uuids[1]) {
		t.Errorf("nvidia-smi calls:\n%s", got)
	}
	for dir, mode := range map[string]os.FileMode{m.Dir: 0o711, m.pipe(): 0o755, m.log(): 0o700, m.shm(): 0o777 | os.ModeSticky} {
		if st, err := os.Stat(dir); err != nil || st.Mode()&(os.ModePerm|os.ModeSticky) != mode {
			t.Errorf("%s: %v %v, want %v", dir, st.Mode(), err, mode)
		}
	}
	pidOf := func() int {
		b, _ := os.ReadFile(filepath.Join(m.pipe(), "fake.pid"))
		n, _ := strconv.Atoi(string(b))
		return n
	}
	first := pidOf()
	if first == 0 {
		t.Fatal("no daemon pid")
	}
	if !sameShm(t, first, m.shm()) {
		t.Errorf("the daemon's /dev/shm is not the claim's %s", m.shm())
	}
	if sameShm(t, os.Getpid(), m.shm()) {
		t.Error("the claim's shm was mounted over the plugin's own /dev/shm")
	}

	// What the runtime makes of the claim's devices: the MPS client's view.
	oci := inject(t, e.cdiRoot, ids)
	if !slices.Contains(oci.Process.Env, "CUDA_MPS_PIPE_DIRECTORY="+MPSContainerPipe) {
		t.Errorf("env %v", oci.Process.Env)
	}
	mounts := map[string]string{}
	for _, mt := range oci.Mounts {
		mounts[mt.Destination] = mt.Source
		// Clients only connect to the daemon's sockets: the pipe directory
		// is read-only to them (no client plants a link where the daemon,
		// root in the host's root, creates its files).
		if mt.Destination == MPSContainerPipe && !slices.Contains(mt.Options, "ro") {
			t.Errorf("the pipe directory is mounted %v, want read-only", mt.Options)
		}
	}
	if mounts[MPSContainerPipe] != m.pipe() || mounts["/dev/shm"] != m.shm() {
		t.Errorf("mounts %v", mounts)
	}

	// A killed daemon is started again, defaults again.
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new daemon", func() bool { p := pidOf(); return p != 0 && p != first })
	waitFor(t, "its defaults", func() bool {
		return strings.Count(strings.Join(readLines(logFile), "\n"), "set_default_active_thread_percentage 50") == 2
	})
	second := pidOf()

	// A plugin restart adopts the running daemon and supervises it.
	e.stop()
	e.start()
	time.Sleep(200 * time.Millisecond)
	if p := pidOf(); p != second {
		t.Errorf("daemon %d after the restart, want %d adopted", p, second)
	}
	syscall.Kill(second, syscall.SIGKILL)
	waitFor(t, "a daemon started by the restarted plugin", func() bool { p := pidOf(); return p != 0 && p != second })
	third := pidOf()

	// Unprepare: quit, compute mode DEFAULT, directories gone.
	f.reset()
	if r := e.unprepare(c).Claims[string(c.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	waitFor(t, "daemon exit", func() bool { return syscall.Kill(third, 0) != nil })
	if _, err := os.Stat(m.Dir); !os.IsNotExist(err) {
		t.Errorf("%s after unprepare: %v", m.Dir, err)
	}
	if got := f.calls(); got != fmt.Sprintf("-i %s -c DEFAULT\n-i %s -c DEFAULT\n", uuids[0], uuids[1]) {
		t.Errorf("unprepare's nvidia-smi calls:\n%s", got)
	}
	if _, ok := e.checkpoint().Claims[string(c.UID)]; ok {
		t.Error("still checkpointed")
	}
}

// A plugin restart whose daemon died meanwhile starts it again from the
// checkpoint; a MIG device's daemon serves the MIG UUID and sets no
// compute mode.
func TestMPSRestartAndMIG(t *testing.T) {
	e, f := mpsEnv(t, "a100x2-mig")
	c := e.configure(e.claim("mpsmig", "gpu-1-mig-1g5gb-9-0"),
		opaque(resourceapi.AllocationConfigSourceClass, DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS"}}`))
	cdiIDs(t, e.prepare(c), c)
	m := e.checkpoint().Claims[string(c.UID)].Sharing[0].MPS
	if mig := e.drv.byName["gpu-1-mig-1g5gb-9-0"]; !slices.Equal(m.UUIDs, []string{mig.UUID}) {
		t.Errorf("daemon devices %v, want the MIG device's UUID %s", m.UUIDs, mig.UUID)
	}
	if got := f.calls(); got != "" {
		t.Errorf("nvidia-smi ran for a MIG device: %s", got)
	}
	b, _ := os.ReadFile(filepath.Join(m.pipe(), "fake.pid"))
	pid, _ := strconv.Atoi(string(b))
	e.stop()
	syscall.Kill(pid, syscall.SIGKILL)
	waitFor(t, "daemon death", func() bool { return syscall.Kill(pid, 0) != nil })
	e.start()
	waitFor(t, "a daemon started from the checkpoint", func() bool {
		b, _ := os.ReadFile(filepath.Join(m.pipe(), "fake.pid"))
		n, _ := strconv.Atoi(string(b))
		return n != 0 && n != pid && syscall.Kill(n, 0) == nil
	})
	e.unprepare(c)
	if _, err := os.Stat(m.Dir); !os.IsNotExist(err) {
		t.Errorf("%s after unprepare: %v", m.Dir, err)
	}
}

// A daemon that cannot start, or does not answer: the claim fails with a
// clear error, and nothing is left behind (directories, compute mode).
func TestMPSStartFailures(t *testing.T) {
	f := newFakeSMI(t)
	dir := t.TempDir()
	broken := filepath.Join(dir, "broken")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\necho 'cannot start: no GPUs' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Starts "fine" and never answers.
	silent := filepath.Join(dir, "silent")
	if err := os.WriteFile(silent, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ control, want string }{
		{broken, "cannot start: no GPUs"},
		{silent, "does not answer within"},
	} {
		t.Run(filepath.Base(tc.control), func(t *testing.T) {
			f.reset()
			e := newEnvSetup(t, "h100x8", func(e *testEnv, _ string) { e.smi, e.mpsControl = f.path, tc.control })
			// Only the wait for an answer is short (the silent daemon
			// never gives one); each run of the scripts keeps the
			// generous bound, so a busy machine changes no outcome.
			e.drv.mpsAnswerWait = 500 * time.Millisecond
			c := e.configure(e.claim("mpsfail", "gpu-4"),
				opaque(resourceapi.AllocationConfigSourceClaim, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"MPS"}}`))
			r := e.prepare(c).Claims[string(c.UID)]
			if r == nil || !strings.Contains(r.Error, tc.want) || !strings.Contains(r.Error, "MPS") {
				t.Fatalf("prepare: %+v, want an error with %q", r, tc.want)
			}
			if ents, _ := os.ReadDir(filepath.Join(e.pluginDir, "mps")); len(ents) != 0 {
				t.Errorf("left behind: %v", ents)
			}
			u := e.sys.Devices[4].UUID
			if got := f.calls(); got != "-i "+u+" -c EXCLUSIVE_PROCESS\n-i "+u+" -c DEFAULT\n" {
				t.Errorf("nvidia-smi calls:\n%s", got)
			}
			if _, err := os.Stat(e.drv.SpecPath(c.UID)); err == nil {
				t.Error("spec written")
			}
		})
	}
}

// The checkpoint records sharing in a form a restarted plugin reads back.
func TestSharingCheckpointForm(t *testing.T) {
	in := preparedSharing{Strategy: StrategyMPS, Devices: []string{"gpu-0"}, GPUs: []string{"GPU-a"},
		MPS: &preparedMPS{ID: "abc", Dir: "/x/mps/abc", UUIDs: []string{"GPU-a"}, Threads: -1, MemLimits: map[int]string{0: "10M"}}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out preparedSharing
	if err := json.Unmarshal(b, &out); err != nil || out.MPS.MemLimits[0] != "10M" || out.MPS.Threads != -1 {
		t.Errorf("%s -> %+v %v", b, out, err)
	}
}

// The path a real node takes: the host's / mounted elsewhere (--host-root),
// the driver's own programs (those of `gantry sim driver-root`, whose
// nvidia-cuda-mps-control is a working fake) found in the inventory and
// run in the host's root. The daemon runs chrooted there, with the
// claim's shm as its /dev/shm, and writes its pipe and log into the
// claim's directory (bound in, the host mount being read-only on a node).
func TestMPSHostRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chroot and bind mounts")
	}
	host := t.TempDir()
	drv := filepath.Join(host, "drv")
	res, err := fakedriver.Build(drv, fakedriver.Options{Version: "580.159.04", GPUs: 1})
	if err != nil {
		t.Skipf("building a fake driver: %v", err)
	}
	inv := &driver.Inventory{Root: drv}
	for _, b := range res.Binaries {
		inv.Binaries = append(inv.Binaries, driver.File{HostPath: filepath.Join(drv, b), ContainerPath: b, Kind: driver.KindBinary})
	}
	if err := os.MkdirAll(filepath.Join(host, "dev", "shm"), 0o755); err != nil {
		t.Fatal(err)
	}
	e := newEnvSetup(t, "h100x1", func(e *testEnv, _ string) {
		e.hostRoot, e.inv, e.mpsInterval = host, inv, 50*time.Millisecond
		// On a node the plugin directory is the host's: the same
		// directory at the same path under the host root.
		in := filepath.Join(host, e.pluginDir)
		if err := os.MkdirAll(in, 0o755); err != nil {
			t.Fatal(err)
		}
		sharedBind(t, e.pluginDir, in)
	})
	c := e.configure(e.claim("mpshost", "gpu-0"),
		opaque(resourceapi.AllocationConfigSourceClaim, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":25}}}`))
	cdiIDs(t, e.prepare(c), c)
	m := e.checkpoint().Claims[string(c.UID)].Sharing[0].MPS
	want := []string{"start " + e.sys.Devices[0].UUID, "get_default_active_thread_percentage", "set_default_active_thread_percentage 25"}
	if got := readLines(filepath.Join(m.log(), "control.log")); !slices.Equal(got[:3], want) {
		t.Errorf("daemon log %q, want it to start with %q", got, want)
	}
	// Find the daemon: the fake control program whose pipe is the claim's.
	pid := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if slices.Contains(strings.Split(string(b), "\x00"), "CUDA_MPS_PIPE_DIRECTORY="+m.pipe()) {
			n, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			if exe, _ := os.Readlink(filepath.Join(filepath.Dir(p), "exe")); strings.HasSuffix(exe, mps.ControlBinary) {
				pid = n
			}
		}
	}
	if pid == 0 {
		t.Fatal("no daemon process found")
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if root, _ := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); root != host {
		t.Errorf("daemon root %q, want the host root %s", root, host)
	}
	if !sameShm(t, pid, m.shm()) {
		t.Errorf("the daemon's /dev/shm is not the claim's %s", m.shm())
	}
	e.unprepare(c)
	waitFor(t, "daemon exit", func() bool { return syscall.Kill(pid, 0) != nil })
	if _, err := os.Stat(m.Dir); !os.IsNotExist(err) {
		t.Errorf("%s after unprepare: %v", m.Dir, err)
	}
}

// sharedBind binds dir at in as a volume with Bidirectional propagation
// does: mounts made under dir later (the daemons' shm) show at in too.
func sharedBind(t *testing.T, dir, in string) {
	t.Helper()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, in, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(in, unix.MNT_DETACH) })
}

// TestMPSShmPerClaim: the attack was a client filling, or reading, an
// unbounded /dev/shm shared beyond its claim (a plain 1777 directory).
// Each claim's daemon now has a tmpfs of its own at <dir>/shm: nosuid,
// nodev, noexec, of --mps-shm-size (a write past it fails with ENOSPC), the
// daemon's /dev/shm and what the claim's CDI devices mount at /dev/shm
// (nosuid, nodev, noexec too); two claims' are different file systems;
// unprepare unmounts it.
func TestMPSShmPerClaim(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: each daemon's shm is a tmpfs mount")
	}
	f := newFakeSMI(t)
	control := mpstest.BuildFake(t)
	e := newEnvSetup(t, "h100x8", func(e *testEnv, _ string) {
		e.smi, e.mpsControl, e.mpsInterval, e.mpsShmSize = f.path, control, 50*time.Millisecond, 4<<20
	})
	var claims []*resourceapi.ResourceClaim
	var dirs []*preparedMPS
	var devs []uint64
	for i, gpu := range []string{"gpu-1", "gpu-2"} {
		c := e.configure(e.claim(fmt.Sprintf("shm%d", i), gpu),
			opaque(resourceapi.AllocationConfigSourceClaim, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"MPS"}}`))
		ids := cdiIDs(t, e.prepare(c), c)
		m := e.checkpoint().Claims[string(c.UID)].Sharing[0].MPS
		claims, dirs = append(claims, c), append(dirs, m)
		mo, typ, so, ok := mpstest.ShmOptions(t, m.shm())
		if !ok || typ != "tmpfs" || !mpstest.HasOptions(mo, "nosuid", "nodev", "noexec") || !mpstest.HasOptions(so, "size=4096k") {
			t.Errorf("claim %d: shm mounted %v: %s %s %s; want a tmpfs nosuid,nodev,noexec of size=4096k", i, ok, typ, mo, so)
		}
		b, _ := os.ReadFile(filepath.Join(m.pipe(), "fake.pid"))
		pid, _ := strconv.Atoi(string(b))
		if pid == 0 || !sameShm(t, pid, m.shm()) {
			t.Errorf("claim %d: the daemon's (%d) /dev/shm is not %s", i, pid, m.shm())
		}
		for _, mt := range inject(t, e.cdiRoot, ids).Mounts {
			if mt.Destination == "/dev/shm" && (mt.Source != m.shm() || !slices.Contains(mt.Options, "noexec") || !slices.Contains(mt.Options, "nodev") || !slices.Contains(mt.Options, "nosuid")) {
				t.Errorf("claim %d: the clients' /dev/shm is %s %v, want %s nosuid,nodev,noexec", i, mt.Source, mt.Options, m.shm())
			}
		}
		var st unix.Stat_t
		if err := unix.Stat(m.shm(), &st); err != nil {
			t.Fatal(err)
		}
		devs = append(devs, st.Dev)
		big := filepath.Join(m.shm(), "fill")
		if err := os.WriteFile(big, make([]byte, 5<<20), 0o600); !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("claim %d: writing 5 MiB into its 4 MiB shm: %v, want ENOSPC", i, err)
		}
		os.Remove(big)
	}
	if devs[0] == devs[1] {
		t.Error("two claims' daemons share one shm")
	}
	e.unprepare(claims...)
	for i, m := range dirs {
		if mounted, err := mps.IsShmMounted(m.shm()); mounted || err != nil {
			t.Errorf("claim %d: shm still mounted after unprepare: %v %v", i, mounted, err)
		}
	}
}

// TestMPSShmNotOnHost: with the host's / elsewhere (--host-root), a shm
// tmpfs the host does not see (the plugin directory's volume without
// Bidirectional propagation) would give the clients another /dev/shm
// than the daemon's: prepare fails, saying so, and leaves nothing mounted.
func TestMPSShmNotOnHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: bind mounts")
	}
	f := newFakeSMI(t)
	control := mpstest.BuildFake(t)
	host := t.TempDir()
	e := newEnvSetup(t, "h100x1", func(e *testEnv, _ string) {
		e.smi, e.mpsControl, e.hostRoot = f.path, control, host
		in := filepath.Join(host, e.pluginDir)
		if err := os.MkdirAll(in, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(e.pluginDir, in, "", unix.MS_BIND, ""); err != nil {
			t.Skipf("bind mount: %v", err)
		}
		t.Cleanup(func() { unix.Unmount(in, unix.MNT_DETACH) })
	})
	c := e.configure(e.claim("nohost", "gpu-0"),
		opaque(resourceapi.AllocationConfigSourceClaim, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"MPS"}}`))
	resp := e.prepare(c)
	r := resp.Claims[string(c.UID)]
	if r == nil || !strings.Contains(r.Error, "Bidirectional") {
		t.Fatalf("prepare: %+v, want an error naming Bidirectional propagation", r)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), filepath.Join(e.pluginDir, "mps")) {
		t.Errorf("a shm is left mounted after the failed prepare:\n%s", mounts)
	}
}

// A daemon started by a prepare whose claim the checkpoint lost (the
// plugin stopped before writing it) is still stopped by the claim's
// unprepare, from the record beside it.
func TestMPSOrphanUnprepared(t *testing.T) {
	e, f := mpsEnv(t, "h100x8")
	c := e.configure(e.claim("orphan", "gpu-7"),
		opaque(resourceapi.AllocationConfigSourceClaim, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"MPS"}}`))
	cdiIDs(t, e.prepare(c), c)
	m := e.checkpoint().Claims[string(c.UID)].Sharing[0].MPS
	b, _ := os.ReadFile(filepath.Join(m.pipe(), "fake.pid"))
	pid, _ := strconv.Atoi(string(b))
	e.stop()
	cp := e.checkpoint()
	delete(cp.Claims, string(c.UID))
	if err := cp.write(filepath.Join(e.pluginDir, CheckpointFile)); err != nil {
		t.Fatal(err)
	}
	e.start()
	f.reset()
	if r := e.unprepare(c).Claims[string(c.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	waitFor(t, "daemon exit", func() bool { return syscall.Kill(pid, 0) != nil })
	if _, err := os.Stat(m.Dir); !os.IsNotExist(err) {
		t.Errorf("%s after unprepare: %v", m.Dir, err)
	}
	if got, u := f.calls(), e.sys.Devices[7].UUID; got != "-i "+u+" -c DEFAULT\n" {
		t.Errorf("nvidia-smi calls %q", got)
	}
}

// Undoing fails (nvidia-smi cannot give the default time-slice back): the
// unprepare fails and the claim stays recorded, so that the kubelet's
// retry undoes it.
func TestUnprepareRetriesSharing(t *testing.T) {
	f := newFakeSMI(t)
	e := newEnvSetup(t, "h100x8", func(e *testEnv, _ string) { e.smi = f.path })
	c := e.configure(e.claim("undo", "gpu-2"),
		opaque(resourceapi.AllocationConfigSourceClaim, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Medium"}}}`))
	cdiIDs(t, e.prepare(c), c)
	f.failing(true)
	if r := e.unprepare(c).Claims[string(c.UID)]; r == nil || !strings.Contains(r.Error, "Insufficient Permissions") || !strings.Contains(r.Error, "undoing its sharing") {
		t.Fatalf("unprepare with a failing nvidia-smi: %+v", r)
	}
	if _, ok := e.checkpoint().Claims[string(c.UID)]; !ok {
		t.Fatal("the claim was forgotten though its sharing was not undone")
	}
	f.failing(false)
	f.reset()
	if r := e.unprepare(c).Claims[string(c.UID)]; r == nil || r.Error != "" {
		t.Fatalf("retry: %+v", r)
	}
	if _, ok := e.checkpoint().Claims[string(c.UID)]; ok || !strings.Contains(f.calls(), "--set-timeslice 0") {
		t.Errorf("retry: still recorded %v, calls %q", ok, f.calls())
	}
}

// Configurations map onto requests: the class's time-slicing applies to
// every GPU, the claim's MPS for request gpub overrides it there. Only
// gpub's CDI device is an MPS client.
func TestSharingPerRequest(t *testing.T) {
	e, f := mpsEnv(t, "h100x8")
	u1, u2 := e.sys.Devices[1].UUID, e.sys.Devices[2].UUID
	c := e.configure(e.claim("mixed", "gpu-1", "gpu-2"), // requests gpua, gpub
		opaque(resourceapi.AllocationConfigSourceClass, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`),
		opaque(resourceapi.AllocationConfigSourceClaim, DefaultDriverName, gpuConfig+`,"sharing":{"strategy":"MPS"}}`, "gpub"))
	ids := cdiIDs(t, e.prepare(c), c)
	sh := e.checkpoint().Claims[string(c.UID)].Sharing
	if len(sh) != 2 || sh[0].Strategy != StrategyTimeSlicing || !slices.Equal(sh[0].GPUs, []string{u1}) ||
		sh[1].MPS == nil || !slices.Equal(sh[1].MPS.UUIDs, []string{u2}) {
		t.Fatalf("sharing %+v", sh)
	}
	if got, want := f.calls(), "-i "+u1+" -c DEFAULT\ncompute-policy -i "+u1+" --set-timeslice 3\n-i "+u2+" -c EXCLUSIVE_PROCESS\n"; got != want {
		t.Errorf("nvidia-smi calls:\n%s\nwant\n%s", got, want)
	}
	for _, id := range ids {
		oci := inject(t, e.cdiRoot, []string{id})
		client := slices.Contains(oci.Process.Env, "CUDA_MPS_PIPE_DIRECTORY="+MPSContainerPipe)
		if want := strings.HasSuffix(id, "-gpu-2"); client != want {
			t.Errorf("%s: MPS client %v, want %v", id, client, want)
		}
	}
	e.unprepare(c)
	if _, err := os.Stat(sh[1].MPS.Dir); !os.IsNotExist(err) {
		t.Errorf("%s after unprepare: %v", sh[1].MPS.Dir, err)
	}
}
