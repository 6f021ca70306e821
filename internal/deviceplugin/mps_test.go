package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gantry-gpu/gantry/internal/labels"
	"github.com/gantry-gpu/gantry/internal/mps"
	"github.com/gantry-gpu/gantry/internal/mps/mpstest"
)

// NVIDIA's MPS file loads as is; failRequestsGreaterThanOne defaults to
// true for MPS (false for time-slicing), renameByDefault gives .shared.
func TestMPSConfig(t *testing.T) {
	c, err := ParseConfig([]byte(`version: v1
flags: {mpsRoot: /run/nvidia/mps}
sharing:
  mps:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
`), "mps.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !c.MPSEnabled() || c.MPSRoot() != "/run/nvidia/mps" || !c.failRequestsGreaterThanOne() {
		t.Errorf("MPSEnabled %v root %s failRequestsGreaterThanOne %v", c.MPSEnabled(), c.MPSRoot(), c.failRequestsGreaterThanOne())
	}
	if r := c.Sharing.MPS.Resources[0]; r.Rename != "nvidia.com/gpu.shared" || !r.Devices.All {
		t.Errorf("resource %+v", r)
	}
	res, err := BuildResources(loadSim(t, "h100x8"), &c, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Name != "nvidia.com/gpu.shared" || !res[0].MPS || res[0].Replicas != 4 || len(res[0].Devices) != 32 {
		t.Fatalf("resources %+v", res)
	}
	specs := MPSDaemonSpecs(res, loadSim(t, "h100x8"))
	if len(specs) != 1 || len(specs[0].GPUs) != 8 || specs[0].ThreadPercentage() != 25 || specs[0].MemLimitMiB(specs[0].GPUs[0]) != 81559/4 {
		t.Errorf("specs %+v", specs)
	}

	f := false
	c.Sharing.MPS.FailRequestsGreaterThanOne = &f
	if c.failRequestsGreaterThanOne() {
		t.Error("an explicit false is not honoured")
	}
	c = DefaultConfig()
	if c.MPSRoot() != DefaultMPSRoot || c.MPSEnabled() {
		t.Error("defaults")
	}
	c, err = LoadEffective("", func(k string) string {
		return map[string]string{"MPS_ROOT": "/var/mps"}[k]
	}, nil)
	if err != nil || c.MPSRoot() != "/var/mps" {
		t.Errorf("MPS_ROOT: %v %s", err, c.MPSRoot())
	}
}

func TestMPSConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"both sections", "version: v1\nsharing: {mps: {resources: [{name: gpu, replicas: 2}]}, timeSlicing: {resources: [{name: gpu, replicas: 2}]}}",
			[]string{"sharing.mps", "timeSlicing", "remove one"}},
		{"replicas 1", "version: v1\nsharing: {mps: {resources: [{name: gpu, replicas: 1}]}}",
			[]string{"sharing.mps.resources[0].replicas", "2 or more"}},
		{"no name", "version: v1\nsharing: {mps: {resources: [{replicas: 2}]}}",
			[]string{"sharing.mps.resources[0].name", "missing"}},
		{"mixed MIG", "version: v1\nflags: {migStrategy: mixed}\nsharing: {mps: {resources: [{name: gpu, replicas: 2}]}}",
			[]string{"flags.migStrategy", "MPS", "MIG"}},
		{"relative root", "version: v1\nflags: {mpsRoot: run/mps}\nsharing: {mps: {resources: [{name: gpu, replicas: 2}]}}",
			[]string{"flags.mpsRoot", "absolute"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.file), "cfg.yaml")
			if err == nil {
				err = c.Validate()
			}
			if err == nil || !errors.Is(err, ErrConfig) {
				t.Fatalf("err = %v, want an ErrConfig", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
		})
	}

	// What only the GPUs tell: MIG devices, and more replicas than the
	// clients an MPS server takes (48 from Volta on, 16 before).
	build := func(profile, file string, edit func(*Config)) error {
		c, err := ParseConfig([]byte(file), "cfg.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			edit(&c)
		}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		sys := loadSim(t, profile)
		for i := range sys.Devices { // single wants one profile
			for j := range sys.Devices[i].MIGDevices {
				sys.Devices[i].MIGDevices[j].Profile = "1g.5gb"
			}
		}
		if profile == "h100x1" && strings.Contains(file, "16") {
			sys.Devices[0].ComputeCapability = "6.1"
		}
		_, err = BuildResources(sys, &c, testLogger(t))
		return err
	}
	err := build("a100x2-mig", "version: v1\nflags: {migStrategy: single}\nsharing: {mps: {resources: [{name: gpu, replicas: 2}]}}", nil)
	if err == nil || !strings.Contains(err.Error(), "MIG device") || !strings.Contains(err.Error(), "sharing.mps.resources[0]") {
		t.Errorf("MIG devices: %v", err)
	}
	err = build("h100x1", "version: v1\nsharing: {mps: {resources: [{name: gpu, replicas: 49}]}}", nil)
	if err == nil || !strings.Contains(err.Error(), "48 clients") || !strings.Contains(err.Error(), "9.0") {
		t.Errorf("49 replicas on an H100: %v", err)
	}
	if err := build("h100x1", "version: v1\nsharing: {mps: {resources: [{name: gpu, replicas: 48}]}}", nil); err != nil {
		t.Errorf("48 replicas on an H100: %v", err)
	}
	err = build("h100x1", "version: v1\nsharing: {mps: {resources: [{name: gpu, replicas: 17}]}} # 16", nil)
	if err == nil || !strings.Contains(err.Error(), "16 clients") {
		t.Errorf("17 replicas before Volta: %v", err)
	}
}

// buildFakeMPS builds the stand-in for nvidia-cuda-mps-control.
func buildFakeMPS(t *testing.T) string { return mpstest.BuildFake(t) }

// mpsManager runs an MPSManager in the background; stop ends it and waits.
type mpsManagerRun struct {
	m      *MPSManager
	cancel context.CancelFunc
	done   chan error
}

func startMPSManager(t *testing.T, m *MPSManager) *mpsManagerRun {
	ctx, cancel := context.WithCancel(context.Background())
	r := &mpsManagerRun{m: m, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- m.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *mpsManagerRun) stop(t *testing.T) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("MPSManager.Run: %v", err)
		}
	case <-time.After(waitFor):
		t.Errorf("MPSManager.Run did not return within %v of cancellation", waitFor)
	}
}

// eventually polls cond until it holds or waitFor passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", waitFor, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readLines(path string) []string {
	b, _ := os.ReadFile(path)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// The daemon's lifecycle with a real process model: -d starts a detached
// daemon, the defaults reach it through the control program's standard
// input, a killed daemon is noticed and restarted (defaults again), and
// cancellation quits it. Compute modes go through a fake nvidia-smi.
func TestMPSManagerLifecycle(t *testing.T) {
	control := buildFakeMPS(t)
	root := shortTempDir(t)
	smiDir := t.TempDir()
	smiLog := filepath.Join(smiDir, "calls")
	if err := os.WriteFile(filepath.Join(smiDir, "nvidia-smi"), []byte("#!/bin/sh\necho \"$*\" >> "+smiLog+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", smiDir+":"+os.Getenv("PATH"))

	sys := loadSim(t, "h100x8")
	c := DefaultConfig()
	c.Sharing.MPS = &ReplicatedResources{Resources: []ReplicatedResource{{Name: "gpu", Replicas: 3, Devices: ReplicatedDevices{List: []string{"2", "5"}}}}}
	c.Sharing.MPS.Resources[0].Rename = "gpu.mps"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	res, err := BuildResources(sys, &c, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	specs := MPSDaemonSpecs(res, sys)
	if len(specs) != 1 || specs[0].Resource != "nvidia.com/gpu.mps" || len(specs[0].GPUs) != 2 {
		t.Fatalf("specs %+v", specs)
	}
	paths := mpsPathsFor(root, "nvidia.com/gpu.mps")
	run := startMPSManager(t, &MPSManager{Root: root, Specs: specs, Control: control, Interval: 50 * time.Millisecond,
		ComputeMode: NvidiaSMIComputeMode, Log: testLogger(t)})

	eventually(t, "ready file", func() bool { return mpsReady(root, "nvidia.com/gpu.mps") })
	mem := 81559 / 3
	want := []string{
		"start " + sys.Devices[2].UUID + "," + sys.Devices[5].UUID,
		fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", mem),
		fmt.Sprintf("set_default_device_pinned_mem_limit 1 %dM", mem),
		"set_default_active_thread_percentage 33",
	}
	logFile := filepath.Join(paths.log, "control.log")
	got := slices.DeleteFunc(readLines(logFile), func(l string) bool { return l == "get_default_active_thread_percentage" })
	if !slices.Equal(got, want) {
		t.Errorf("daemon got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if calls := readLines(smiLog); !slices.Equal(calls, []string{
		"-i " + sys.Devices[2].UUID + " -c EXCLUSIVE_PROCESS", "-i " + sys.Devices[5].UUID + " -c EXCLUSIVE_PROCESS"}) {
		t.Errorf("nvidia-smi calls %q", calls)
	}
	if st, err := os.Stat(paths.shm); err != nil || st.Mode().Perm() != 0o777 || st.Mode()&os.ModeSticky == 0 {
		t.Errorf("the clients' /dev/shm (%s): %v %v, want drwxrwxrwt", paths.shm, st.Mode(), err)
	}
	if !sameShm(t, pidOfDaemon(paths), paths.shm) {
		t.Errorf("the daemon's /dev/shm is not the resource's %s", paths.shm)
	}
	// The ready file is touched on every health check.
	st0, _ := os.Stat(paths.ready)
	eventually(t, "heartbeat", func() bool {
		st, err := os.Stat(paths.ready)
		return err == nil && st.ModTime().After(st0.ModTime())
	})

	// Kill the daemon: the manager starts another and sets it up again.
	pidOf := func() int {
		b, _ := os.ReadFile(filepath.Join(paths.pipe, "fake.pid"))
		n, _ := strconv.Atoi(string(b))
		return n
	}
	first := pidOf()
	if first == 0 {
		t.Fatal("no daemon pid")
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a new daemon", func() bool { p := pidOf(); return p != 0 && p != first })
	eventually(t, "ready again", func() bool {
		return mpsReady(root, "nvidia.com/gpu.mps") &&
			strings.Count(strings.Join(readLines(logFile), "\n"), "set_default_active_thread_percentage 33") == 2
	})
	second := pidOf()

	// Stop: quit reaches the daemon, which exits; no ready file is left.
	run.stop(t)
	lines := readLines(logFile)
	if lines[len(lines)-1] != "quit" {
		t.Errorf("last command %q, want quit", lines[len(lines)-1])
	}
	eventually(t, "daemon exit", func() bool { return syscall.Kill(second, 0) != nil })
	if m, err := mps.IsShmMounted(paths.shm); m || err != nil {
		t.Errorf("the daemon's shm is still mounted after it stopped: %v %v", m, err)
	}
	if _, err := os.Stat(paths.ready); !os.IsNotExist(err) {
		t.Errorf("ready file after stop: %v", err)
	}
	if calls := readLines(smiLog); len(calls) != 6 || !strings.HasSuffix(calls[5], "-c DEFAULT") {
		t.Errorf("nvidia-smi calls %q (want exclusive twice for 2 GPUs, then DEFAULT)", calls)
	}
}

// pidOfDaemon is the fake daemon's pid (0 when none).
func pidOfDaemon(paths mpsPaths) int {
	b, _ := os.ReadFile(filepath.Join(paths.pipe, "fake.pid"))
	n, _ := strconv.Atoi(string(b))
	return n
}

// sameShm reports whether process pid's /dev/shm (seen through its root,
// in its mount namespace) is the file system at shm.
func sameShm(t *testing.T, pid int, shm string) bool {
	t.Helper()
	var theirs, want syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/root/dev/shm", pid), &theirs); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(shm, &want); err != nil {
		t.Fatal(err)
	}
	return theirs.Dev == want.Dev && theirs.Ino == want.Ino
}

// TestMPSShmPerResource: the attack was a client of one shared resource
// filling, or reading, the /dev/shm every MPS client of the node shared (a
// plain 1777 host directory, <root>/shm). Each resource's daemon now has a
// tmpfs of its own at <root>/<resource>/shm: nosuid, nodev, noexec, of
// gantry.mpsShmSize (a write past it fails with ENOSPC), the daemon's
// /dev/shm (it runs in a mount namespace of its own) and what Allocate
// gives the resource's clients; two resources' are different file
// systems; it is unmounted when the daemon stops.
func TestMPSShmPerResource(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: each daemon's shm is a tmpfs mount")
	}
	control := buildFakeMPS(t)
	root := shortTempDir(t)
	specs := []MPSDaemonSpec{
		{Resource: "nvidia.com/gpu.a", Replicas: 2, GPUs: []MPSGPU{{UUID: "GPU-a", MemoryMiB: 1000}}},
		{Resource: "nvidia.com/gpu.b", Replicas: 2, GPUs: []MPSGPU{{UUID: "GPU-b", MemoryMiB: 1000}}},
	}
	run := startMPSManager(t, &MPSManager{Root: root, Specs: specs, Control: control, Interval: 50 * time.Millisecond,
		ShmSize: 4 << 20, Log: testLogger(t)})
	var devs []uint64
	for _, s := range specs {
		paths := mpsPathsFor(root, s.Resource)
		eventually(t, s.Resource+" ready", func() bool { return mpsReady(root, s.Resource) })
		mo, typ, so, ok := mpstest.ShmOptions(t, paths.shm)
		if !ok || typ != "tmpfs" || !mpstest.HasOptions(mo, "nosuid", "nodev", "noexec") || !mpstest.HasOptions(so, "size=4096k") {
			t.Errorf("%s: shm mounted %v: %s %s %s; want a tmpfs nosuid,nodev,noexec of size=4096k", s.Resource, ok, typ, mo, so)
		}
		if !sameShm(t, pidOfDaemon(paths), paths.shm) {
			t.Errorf("%s: the daemon's /dev/shm is not %s", s.Resource, paths.shm)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(paths.shm, &st); err != nil {
			t.Fatal(err)
		}
		devs = append(devs, st.Dev)
		big := filepath.Join(paths.shm, "fill")
		if err := os.WriteFile(big, make([]byte, 5<<20), 0o600); !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("%s: writing 5 MiB into its 4 MiB shm: %v, want ENOSPC", s.Resource, err)
		}
		os.Remove(big)
	}
	if devs[0] == devs[1] {
		t.Error("two resources' daemons share one shm")
	}
	if err := os.WriteFile(filepath.Join(mpsPathsFor(root, specs[0].Resource).shm, "seg"), []byte("a"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mpsPathsFor(root, specs[1].Resource).shm, "seg")); err == nil {
		t.Error("one resource's segment is in the other's shm")
	}
	run.stop(t)
	for _, s := range specs {
		if m, err := mps.IsShmMounted(mpsPathsFor(root, s.Resource).shm); m || err != nil {
			t.Errorf("%s: shm still mounted after the daemon stopped: %v %v", s.Resource, m, err)
		}
	}
}

// A control program that cannot start the daemon: retried, never ready,
// and the manager still stops promptly.
func TestMPSManagerStartFailure(t *testing.T) {
	root := shortTempDir(t)
	bad := filepath.Join(t.TempDir(), "mps-control")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho 'cannot start' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf syncBuffer
	m := &MPSManager{Root: root, Control: bad, Interval: 20 * time.Millisecond, Log: slog.New(slog.NewTextHandler(&buf, nil)),
		Specs: []MPSDaemonSpec{{Resource: "nvidia.com/gpu", Replicas: 2, GPUs: []MPSGPU{{UUID: "GPU-x", MemoryMiB: 1000}}}}}
	run := startMPSManager(t, m)
	eventually(t, "a logged failure", func() bool { return strings.Contains(buf.String(), "cannot start") })
	if mpsReady(root, "nvidia.com/gpu") {
		t.Error("ready without a daemon")
	}
	run.stop(t)
}

// waitHealth reads device lists of resource until every device has health want.
func waitHealth(t *testing.T, k *fakeKubelet, resource, want string) []*pluginapi.Device {
	t.Helper()
	for {
		l := k.list(resource)
		if !slices.ContainsFunc(l, func(d *pluginapi.Device) bool { return d.Health != want }) {
			return l
		}
	}
}

// The plugin with a real manager and the fake daemon: replicas are
// offered only while the daemon is ready, and Allocate answers, over the
// plugin's gRPC socket, the pipe directory, the daemon's shm and the limits.
func TestMPSPluginAllocate(t *testing.T) {
	control := buildFakeMPS(t)
	root := shortTempDir(t)
	cfg := DefaultConfig()
	cfg.Flags.MpsRoot = root
	f := false
	cfg.Sharing.MPS = &ReplicatedResources{RenameByDefault: true, FailRequestsGreaterThanOne: &f,
		Resources: []ReplicatedResource{{Name: "gpu", Replicas: 4}}}
	oldPoll := mpsPoll
	mpsPoll = 20 * time.Millisecond
	t.Cleanup(func() { mpsPoll = oldPoll })
	h := startHarness(t, "h100x8", cfg)
	const res = "nvidia.com/gpu.shared"
	if reg := h.kubelet.registration(); reg.ResourceName != res {
		t.Fatalf("registration %v", reg)
	}
	// No daemon yet: every replica unhealthy, Allocate refused.
	l := waitHealth(t, h.kubelet, res, pluginapi.Unhealthy)
	if len(l) != 32 {
		t.Fatalf("%d devices, want 32", len(l))
	}
	c := h.kubelet.client("nvidia-gpu.shared.sock")
	u1 := h.sys.Devices[1].UUID
	if _, err := allocate(t, c, []string{u1 + "::0"}); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "MPS control daemon") {
		t.Errorf("Allocate without a daemon: %v", err)
	}

	run := startMPSManager(t, &MPSManager{Root: root, Specs: MPSDaemonSpecs(h.plugin.Resources(), h.sys), Control: control,
		Interval: 50 * time.Millisecond, Log: testLogger(t)})
	waitHealth(t, h.kubelet, res, pluginapi.Healthy)

	resp, err := allocate(t, c, []string{u1 + "::2"}, []string{u1 + "::3", u1 + "::1"}, []string{u1 + "::0", h.sys.Devices[4].UUID + "::0"})
	if err != nil {
		t.Fatal(err)
	}
	pipe := "/mps/" + res + "/pipe"
	wantMounts := []*pluginapi.Mount{
		{ContainerPath: pipe, HostPath: filepath.Join(root, res, "pipe"), ReadOnly: true},
		{ContainerPath: "/dev/shm", HostPath: filepath.Join(root, res, "shm")},
	}
	quarter := 81559 / 4
	for i, want := range []map[string]string{
		{"NVIDIA_VISIBLE_DEVICES": u1, envMPSPipeDir: pipe, envMPSThreadPercent: "25", envMPSMemLimit: fmt.Sprintf("0=%dM", quarter)},
		{"NVIDIA_VISIBLE_DEVICES": u1, envMPSPipeDir: pipe, envMPSThreadPercent: "50", envMPSMemLimit: fmt.Sprintf("0=%dM", 2*quarter)},
		// Two GPUs: the daemon's per-client defaults apply.
		{"NVIDIA_VISIBLE_DEVICES": u1 + "," + h.sys.Devices[4].UUID, envMPSPipeDir: pipe},
	} {
		cr := resp.ContainerResponses[i]
		if fmt.Sprint(cr.Envs) != fmt.Sprint(want) {
			t.Errorf("container %d envs %v, want %v", i, cr.Envs, want)
		}
		if fmt.Sprint(cr.Mounts) != fmt.Sprint(wantMounts) {
			t.Errorf("container %d mounts %v, want %v", i, cr.Mounts, wantMounts)
		}
	}
	// The pipe directory the containers get is the daemon's.
	if _, err := os.Stat(filepath.Join(root, res, "pipe", "control")); err != nil {
		t.Errorf("the daemon's control socket is not in the mounted pipe directory: %v", err)
	}

	// The daemon's manager stops: the replicas are withdrawn.
	run.stop(t)
	waitHealth(t, h.kubelet, res, pluginapi.Unhealthy)

	// A stale ready file (a manager killed without cleaning up) is not ready.
	ready := filepath.Join(root, res, mpsReadyFile)
	if err := os.WriteFile(ready, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, h.kubelet, res, pluginapi.Healthy)
	old := time.Now().Add(-2 * mpsReadyMaxAge)
	if err := os.Chtimes(ready, old, old); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, h.kubelet, res, pluginapi.Unhealthy)
}

// The mps-control-daemon mode of the binary's front end, on simulated GPUs.
func TestMPSControlDaemonMode(t *testing.T) {
	control := buildFakeMPS(t)
	t.Setenv("GANTRY_CONFIG", "")
	root := shortTempDir(t)
	file := filepath.Join(t.TempDir(), "cfg.yaml")
	if err := os.WriteFile(file, []byte("version: v1\nsharing: {mps: {resources: [{name: gpu, replicas: 2}]}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	env := map[string]string{"MPS_ROOT": root, "MPS_CONTROL": control}
	go func() {
		done <- run(ctx, []string{"mps-control-daemon", "--gpus=sim:h100x1", "--config", file, "--log-level=error"},
			func(k string) string { return env[k] }, &out, &errb)
	}()
	eventually(t, "ready file", func() bool { return mpsReady(root, "nvidia.com/gpu") })
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d: %s", code, errb.String())
	}
	if lines := readLines(filepath.Join(root, "nvidia.com/gpu", "log", "control.log")); lines[len(lines)-1] != "quit" ||
		!slices.Contains(lines, "set_default_active_thread_percentage 50") || !slices.Contains(lines, "set_default_device_pinned_mem_limit 0 40779M") {
		t.Errorf("daemon got %q", lines)
	}

	// Without sharing.mps it has nothing to run and waits.
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		done <- run(ctx, []string{"mps-control-daemon", "--gpus=sim:h100x1"}, func(string) string { return "" }, &out, &errb)
	}()
	select {
	case code := <-done:
		t.Fatalf("exited (%d) with nothing to run: %s", code, errb.String())
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d", code)
	}
}

// GPU Feature Discovery's labels say MPS: mps.capable and the shared
// resource's sharing-strategy and replicas.
func TestMPSLabels(t *testing.T) {
	c := DefaultConfig()
	c.Sharing.MPS = &ReplicatedResources{Resources: []ReplicatedResource{{Name: "gpu", Replicas: 4}}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	set, err := labels.Generate(loadSim(t, "h100x8"), labelConfig(c), labels.Catalog{Simulated: true})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"nvidia.com/mps.capable": "true", "nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "4"} {
		if set[k] != v {
			t.Errorf("label %s = %q, want %q", k, set[k], v)
		}
	}
}

// devices: [0] without a rename: GPU 0's replicas and the other GPUs whole
// are one resource; only the replicas wait for the daemon, and only they
// get the MPS answer.
func TestMPSSomeDevicesNoRename(t *testing.T) {
	root := shortTempDir(t)
	cfg := DefaultConfig()
	cfg.Flags.MpsRoot = root
	cfg.Sharing.MPS = &ReplicatedResources{Resources: []ReplicatedResource{{Name: "gpu", Replicas: 2, Devices: ReplicatedDevices{List: []string{"0"}}}}}
	oldPoll := mpsPoll
	mpsPoll = 20 * time.Millisecond
	t.Cleanup(func() { mpsPoll = oldPoll })
	h := startHarness(t, "h100x8", cfg)
	const res = "nvidia.com/gpu"
	h.kubelet.registration()
	u0, u3 := h.sys.Devices[0].UUID, h.sys.Devices[3].UUID
	l := h.kubelet.list(res)
	if len(l) != 9 {
		t.Fatalf("%d devices, want 2 replicas + 7 GPUs", len(l))
	}
	for _, d := range l {
		want := pluginapi.Healthy
		if strings.HasPrefix(d.ID, u0) {
			want = pluginapi.Unhealthy
		}
		if d.Health != want {
			t.Errorf("%s is %s without a daemon, want %s", d.ID, d.Health, want)
		}
	}
	c := h.kubelet.client("nvidia-gpu.sock")
	resp, err := allocate(t, c, []string{u3})
	if err != nil {
		t.Fatalf("a whole GPU without a daemon: %v", err)
	}
	if _, ok := resp.ContainerResponses[0].Envs[envMPSPipeDir]; ok || len(resp.ContainerResponses[0].Mounts) != 0 {
		t.Errorf("a whole GPU got the MPS answer: %v", resp.ContainerResponses[0])
	}
	if _, err := allocate(t, c, []string{u0 + "::1"}); status.Code(err) != codes.Unavailable {
		t.Errorf("a replica without a daemon: %v", err)
	}
	specs := MPSDaemonSpecs(h.plugin.Resources(), h.sys)
	if len(specs) != 1 || len(specs[0].GPUs) != 1 || specs[0].GPUs[0].UUID != u0 {
		t.Errorf("daemon specs %+v, want GPU 0 only", specs)
	}
}

// With deviceListStrategy volume-mounts (the deny-by-default setup), an MPS
// client still gets the daemon's pipe directory and shm beside the mounts
// that list its devices.
func TestMPSVolumeMounts(t *testing.T) {
	sys := loadSim(t, "h100x8")
	cfg := DefaultConfig()
	cfg.Flags.MpsRoot = "/run/mps-test"
	cfg.Flags.Plugin.DeviceListStrategy = StrategyList{ListVolumeMounts}
	cfg.Sharing.MPS = &ReplicatedResources{Resources: []ReplicatedResource{{Name: "gpu", Replicas: 2}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{Config: cfg, System: sys, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	s := p.servers[0]
	devs, err := s.lookup([]string{sys.Devices[1].UUID + "::0"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.containerResponse(devs)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range r.Mounts {
		got = append(got, m.ContainerPath)
	}
	want := []string{"/mps/nvidia.com/gpu/pipe", "/dev/shm", filepath.Join(volumeMountsRoot, sys.Devices[1].UUID)}
	if !slices.Equal(got, want) {
		t.Errorf("mounts %v, want %v", got, want)
	}
}
