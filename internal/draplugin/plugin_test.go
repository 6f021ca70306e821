package draplugin

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/cdispec"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/edits/editstest"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
	"github.com/gantry-gpu/gantry/internal/health"
)

const (
	testNode = "node-a"
	testHook = "/usr/bin/gantry-cdi-hook"
)

// testEnv is a node as the kubelet sees it: simulated GPUs with real device
// nodes, a fake API server holding the claims, and the plugin serving the
// real kubeletplugin gRPC services on unix sockets.
type testEnv struct {
	t                                testing.TB
	sys                              *gpu.System
	devRoot, cdiRoot, pluginDir, reg string
	client                           *fake.Clientset
	health                           health.Source
	// The driver programs sharing runs (sharing_test.go); "" for none.
	smi, mpsControl string
	mpsInterval     time.Duration
	mpsShmSize      int64
	// hostRoot and inv, when set, replace the defaults (/, editstest's).
	hostRoot string
	inv      *driver.Inventory
	// sysRoot is sysfs for the vfio GPUs (default: an empty directory).
	sysRoot string

	drv  *Driver
	srv  *Server
	conn *grpc.ClientConn
	dra  drapb.DRAPluginClient
}

func newEnv(t testing.TB, profile string) *testEnv {
	t.Helper()
	return newEnvWith(t, profile, nil)
}

// newEnvWith is newEnv with a health source made for the env's directory.
func newEnvWith(t testing.TB, profile string, src func(dir string) health.Source) *testEnv {
	t.Helper()
	return newEnvSetup(t, profile, func(e *testEnv, base string) {
		if src != nil {
			e.health = src(base)
		}
	})
}

// newEnvSetup is newEnv with setup run on the env (and its base directory)
// before the plugin starts.
func newEnvSetup(t testing.TB, profile string, setup func(e *testEnv, base string)) *testEnv {
	t.Helper()
	sys, err := sim.Load(profile)
	if err != nil {
		t.Fatal(err)
	}
	// Unix socket paths are limited to 108 bytes: t.TempDir can be longer.
	base, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	e := &testEnv{
		t: t, sys: sys, devRoot: editstest.MakeDevRoot(t, sys),
		cdiRoot: filepath.Join(base, "cdi"), pluginDir: filepath.Join(base, "p"), reg: filepath.Join(base, "r"),
		client:  fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid"}}),
		sysRoot: filepath.Join(base, "sys"),
	}
	for _, d := range []string{e.pluginDir, e.reg} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if setup != nil {
		setup(e, base)
	}
	e.start()
	t.Cleanup(e.stop)
	return e
}

func (e *testEnv) options() Options {
	inv := e.inv
	if inv == nil {
		inv = editstest.Inventory()
	}
	return Options{
		HostRoot: e.hostRoot,
		NodeName: testNode, System: e.sys, Inventory: inv,
		CDIRoot: e.cdiRoot, Checkpoint: filepath.Join(e.pluginDir, CheckpointFile),
		HookPath: testHook, DevRoot: e.devRoot, SysRoot: e.sysRoot, Health: e.health,
		NvidiaSMI: e.smi, MPSControl: e.mpsControl, MPSCheckInterval: e.mpsInterval,
		// Generous: it bounds each run of a fake nvidia-smi or control
		// program, which a busy machine may take seconds to start.
		MPSTimeout: 2 * time.Minute,
		MPSShmSize: e.mpsShmSize,
	}
}

// start runs the plugin as gantry-dra-plugin does: New, then Start.
func (e *testEnv) start() {
	e.t.Helper()
	drv, err := New(e.options())
	if err != nil {
		e.t.Fatal(err)
	}
	srv, err := Start(context.Background(), drv, e.client, e.pluginDir, e.reg)
	if err != nil {
		e.t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(e.pluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.drv, e.srv, e.conn, e.dra = drv, srv, conn, drapb.NewDRAPluginClient(conn)
}

// stop is a plugin exit (or crash: nothing is flushed at stop).
func (e *testEnv) stop() {
	if e.srv == nil {
		return
	}
	e.conn.Close()
	e.srv.Stop()
	e.srv = nil
}

// claim stores an allocated ResourceClaim in the fake API server, one
// request per device, as the scheduler leaves it.
func (e *testEnv) claim(name string, devices ...string) *resourceapi.ResourceClaim {
	e.t.Helper()
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	for i, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "gpu" + string(rune('a'+i)), Driver: DefaultDriverName, Pool: testNode, Device: d,
		})
	}
	c, err := e.client.ResourceV1().ResourceClaims("default").Create(context.Background(), c, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func pbClaim(c *resourceapi.ResourceClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}

// prepare calls NodePrepareResources as the kubelet does.
func (e *testEnv) prepare(claims ...*resourceapi.ResourceClaim) *drapb.NodePrepareResourcesResponse {
	e.t.Helper()
	req := &drapb.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, pbClaim(c))
	}
	resp, err := e.dra.NodePrepareResources(context.Background(), req)
	if err != nil {
		e.t.Fatalf("NodePrepareResources: %v", err)
	}
	return resp
}

func (e *testEnv) unprepare(claims ...*resourceapi.ResourceClaim) *drapb.NodeUnprepareResourcesResponse {
	e.t.Helper()
	req := &drapb.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, pbClaim(c))
	}
	resp, err := e.dra.NodeUnprepareResources(context.Background(), req)
	if err != nil {
		e.t.Fatalf("NodeUnprepareResources: %v", err)
	}
	return resp
}

// cdiIDs are the CDI device IDs answered for a claim, failing on a
// per-claim error.
func cdiIDs(t testing.TB, resp *drapb.NodePrepareResourcesResponse, c *resourceapi.ResourceClaim) []string {
	t.Helper()
	r, ok := resp.Claims[string(c.UID)]
	if !ok {
		t.Fatalf("no answer for claim %s in %v", c.Name, resp.Claims)
	}
	if r.Error != "" {
		t.Fatalf("claim %s: %s", c.Name, r.Error)
	}
	var ids []string
	for _, d := range r.Devices {
		if d.PoolName != testNode {
			t.Errorf("device %s pool %q, want %q", d.DeviceName, d.PoolName, testNode)
		}
		ids = append(ids, d.CdiDeviceIds...)
	}
	return ids
}

// inject loads the CDI directory with the CDI library, as containerd and
// CRI-O do, and injects ids into an empty container.
func inject(t testing.TB, dir string, ids []string) *ocispecs.Spec {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("the CDI library rejected a spec: %v", errs)
	}
	oci := &ocispecs.Spec{Process: &ocispecs.Process{}, Linux: &ocispecs.Linux{}}
	if unresolved, err := cache.InjectDevices(oci, ids...); err != nil {
		t.Fatalf("injecting %v: %v (unresolved %v)", ids, err, unresolved)
	}
	return oci
}

func devicePaths(oci *ocispecs.Spec) []string {
	var out []string
	for _, d := range oci.Linux.Devices {
		out = append(out, d.Path)
	}
	slices.Sort(out)
	return out
}

func readSpec(t testing.TB, path string) *specs.Spec {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func TestPrepareWritesClaimSpec(t *testing.T) {
	e := newEnv(t, "h100x8")
	c := e.claim("two", "gpu-3", "gpu-5")
	ids := cdiIDs(t, e.prepare(c), c)
	want := []string{"k8s.gpu.nvidia.com/claim=uid-two-gpu-3", "k8s.gpu.nvidia.com/claim=uid-two-gpu-5"}
	if !reflect.DeepEqual(ids, want) {
		t.Fatalf("CDI IDs %v, want %v", ids, want)
	}
	specPath := e.drv.SpecPath(c.UID)
	if filepath.Dir(specPath) != e.cdiRoot {
		t.Fatalf("spec %s is not in the CDI root %s", specPath, e.cdiRoot)
	}

	// What a runtime makes of it: exactly GPUs 3 and 5, the control
	// nodes, the driver files, and hooks with the fixed environment.
	oci := inject(t, e.cdiRoot, ids)
	wantDevs := []string{"/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia3", "/dev/nvidia5", "/dev/nvidiactl"}
	if got := devicePaths(oci); !reflect.DeepEqual(got, wantDevs) {
		t.Errorf("injected devices %v, want %v", got, wantDevs)
	}
	for _, d := range oci.Linux.Devices {
		if d.Path == "/dev/nvidia3" && (d.Major != editstest.MajNvidia || d.Minor != 3) {
			t.Errorf("/dev/nvidia3 is %d:%d, want %d:3 (the node under the dev root)", d.Major, d.Minor, editstest.MajNvidia)
		}
	}
	if !slices.Contains(oci.Process.Env, edits.VisibleDevicesVoid) {
		t.Errorf("env %v lacks %s", oci.Process.Env, edits.VisibleDevicesVoid)
	}
	if !slices.ContainsFunc(oci.Mounts, func(m ocispecs.Mount) bool {
		return m.Destination == "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
	}) {
		t.Errorf("libcuda is not mounted: %v", oci.Mounts)
	}
	if oci.Hooks == nil || len(oci.Hooks.CreateContainer) == 0 {
		t.Fatal("no createContainer hooks")
	}
	for _, h := range oci.Hooks.CreateContainer {
		if h.Path != testHook || !reflect.DeepEqual(h.Env, edits.HookEnv()) {
			t.Errorf("hook %s %v env %v, want %s with %v", h.Path, h.Args, h.Env, testHook, edits.HookEnv())
		}
	}

	// The same edits as `gantry cdi generate` writes for those GPUs.
	full, err := cdispec.Generate(e.sys, editstest.Inventory(), cdispec.Options{HookPath: testHook, DevRoot: e.devRoot})
	if err != nil {
		t.Fatal(err)
	}
	got := readSpec(t, specPath)
	if got.Kind != "k8s.gpu.nvidia.com/claim" {
		t.Errorf("kind %s", got.Kind)
	}
	if !reflect.DeepEqual(got.ContainerEdits, full.ContainerEdits) {
		t.Errorf("spec-wide edits differ from cdi generate's:\n%+v\n%+v", got.ContainerEdits, full.ContainerEdits)
	}
	for i, idx := range []string{"3", "5"} {
		j := slices.IndexFunc(full.Devices, func(d specs.Device) bool { return d.Name == idx })
		if !reflect.DeepEqual(got.Devices[i].ContainerEdits, full.Devices[j].ContainerEdits) {
			t.Errorf("device %s edits differ from cdi generate's for GPU %s", got.Devices[i].Name, idx)
		}
	}
}

func TestPrepareMIGDevice(t *testing.T) {
	e := newEnv(t, "a100x2-mig")
	var mig Device
	for _, d := range e.drv.Devices() {
		if d.ID == "1:2" {
			mig = d
		}
	}
	if mig.Slice.Name != "gpu-1-mig-1g5gb-9-0" {
		t.Fatalf("MIG device 1:2 is published as %q, want gpu-1-mig-1g5gb-9-0", mig.Slice.Name)
	}
	c := e.claim("mig", mig.Slice.Name)
	oci := inject(t, e.cdiRoot, cdiIDs(t, e.prepare(c), c))
	m := e.sys.Devices[1].MIGDevices[2]
	var caps []string
	for _, p := range devicePaths(oci) {
		if strings.HasPrefix(p, "/dev/nvidia-caps/") {
			caps = append(caps, p)
		}
		if p == "/dev/nvidia0" {
			t.Error("the other A100 was injected")
		}
	}
	wantCaps := []string{"/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(m.GICapMinor), "/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(m.CICapMinor)}
	slices.Sort(wantCaps)
	if !reflect.DeepEqual(caps, wantCaps) || !slices.Contains(devicePaths(oci), "/dev/nvidia1") {
		t.Errorf("injected %v, want the parent /dev/nvidia1 and caps %v", devicePaths(oci), wantCaps)
	}
}

func statID(t testing.TB, path string) [2]int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	return [2]int64{int64(sys.Ino), st.ModTime().UnixNano()}
}

func TestPrepareUnprepareIdempotent(t *testing.T) {
	e := newEnv(t, "h100x8")
	c := e.claim("idem", "gpu-0")
	first := cdiIDs(t, e.prepare(c), c)
	spec := e.drv.SpecPath(c.UID)
	before := statID(t, spec)
	time.Sleep(10 * time.Millisecond) // a rewrite would change the mtime
	if again := cdiIDs(t, e.prepare(c), c); !reflect.DeepEqual(again, first) {
		t.Errorf("second prepare answered %v, first %v", again, first)
	}
	if after := statID(t, spec); after != before {
		t.Error("a second prepare of the same claim rewrote its CDI spec")
	}
	// The kubelet prepares a claim shared by two pods once per pod.
	if got := e.drv.Prepared(); !reflect.DeepEqual(got, []string{"uid-idem"}) {
		t.Errorf("prepared %v", got)
	}

	for i := range 2 {
		resp := e.unprepare(c)
		if r := resp.Claims[string(c.UID)]; r == nil || r.Error != "" {
			t.Fatalf("unprepare %d: %+v", i, resp.Claims)
		}
		if _, err := os.Stat(spec); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("unprepare %d left the spec: %v", i, err)
		}
	}
	if got := e.drv.Prepared(); len(got) != 0 {
		t.Errorf("still prepared after unprepare: %v", got)
	}
	// A claim this plugin never prepared unprepares without error.
	never := e.claim("never", "gpu-1")
	if r := e.unprepare(never).Claims[string(never.UID)]; r == nil || r.Error != "" {
		t.Errorf("unprepare of an unprepared claim: %+v", r)
	}
	// Nor one whose spec a crash left behind before the checkpoint was
	// written: its spec goes.
	orphan := e.claim("orphan", "gpu-1")
	cdiIDs(t, e.prepare(orphan), orphan)
	b, err := os.ReadFile(e.drv.SpecPath(orphan.UID))
	if err != nil {
		t.Fatal(err)
	}
	e.unprepare(orphan)
	if err := os.WriteFile(e.drv.SpecPath(orphan.UID), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := e.unprepare(orphan).Claims[string(orphan.UID)]; r == nil || r.Error != "" {
		t.Errorf("unprepare of an orphaned spec: %+v", r)
	}
	if _, err := os.Stat(e.drv.SpecPath(orphan.UID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphaned spec left behind: %v", err)
	}
	// The device is free again.
	other := e.claim("next", "gpu-0")
	cdiIDs(t, e.prepare(other), other)
}

func TestRestartFromCheckpoint(t *testing.T) {
	e := newEnv(t, "h100x8")
	a := e.claim("a", "gpu-2")
	idsA := cdiIDs(t, e.prepare(a), a)
	spec := e.drv.SpecPath(a.UID)
	before := statID(t, spec)

	e.stop()
	e.start()
	time.Sleep(10 * time.Millisecond)

	// The kubelet re-prepares after a restart: same answer, no new spec.
	if got := cdiIDs(t, e.prepare(a), a); !reflect.DeepEqual(got, idsA) {
		t.Errorf("after restart %v, before %v", got, idsA)
	}
	if statID(t, spec) != before {
		t.Error("the restarted plugin prepared claim a again")
	}
	// It still knows gpu-2 is taken.
	b := e.claim("b", "gpu-2")
	r := e.prepare(b).Claims[string(b.UID)]
	if r == nil || !strings.Contains(r.Error, ErrDeviceInUse.Error()) || !strings.Contains(r.Error, "default/a") {
		t.Errorf("claim b on claim a's GPU: %+v, want an in-use error naming default/a", r)
	}
	// Unprepare needs nothing from the API server: the claim may be gone.
	if err := e.client.ResourceV1().ResourceClaims("default").Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.stop()
	e.start()
	if r := e.unprepare(a).Claims[string(a.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare after restart: %+v", r)
	}
	if _, err := os.Stat(spec); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("spec of claim a left behind: %v", err)
	}
	cdiIDs(t, e.prepare(b), b)
}

func TestPrepareRecreatesLostSpec(t *testing.T) {
	e := newEnv(t, "h100x1")
	c := e.claim("lost", "gpu-0")
	ids := cdiIDs(t, e.prepare(c), c)
	if err := os.Remove(e.drv.SpecPath(c.UID)); err != nil { // a reboot empties /var/run
		t.Fatal(err)
	}
	if got := cdiIDs(t, e.prepare(c), c); !reflect.DeepEqual(got, ids) {
		t.Errorf("%v, want %v", got, ids)
	}
	inject(t, e.cdiRoot, ids)
}

func TestPrepareRefuses(t *testing.T) {
	e := newEnv(t, "h100x8")
	taken := e.claim("taken", "gpu-7")
	cdiIDs(t, e.prepare(taken), taken)

	unknown := e.claim("unknown", "gpu-9")
	twice := e.claim("twice", "gpu-6", "gpu-7")
	elsewhere := e.claim("elsewhere")
	elsewhere.Status.Allocation.Devices.Results = []resourceapi.DeviceRequestAllocationResult{{Request: "r", Driver: DefaultDriverName, Pool: "node-b", Device: "gpu-1"}}
	if _, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), elsewhere, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	resp := e.prepare(unknown, twice, elsewhere)
	for c, want := range map[*resourceapi.ResourceClaim]string{
		unknown:   `device "gpu-9" is not a device this plugin publishes`,
		twice:     "gpu-7: " + ErrDeviceInUse.Error(),
		elsewhere: `pool "node-b"`,
	} {
		r := resp.Claims[string(c.UID)]
		if r == nil || !strings.Contains(r.Error, want) {
			t.Errorf("claim %s: %+v, want an error containing %q", c.Name, r, want)
		}
		if _, err := os.Stat(e.drv.SpecPath(c.UID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("claim %s: a spec was written for a refused claim", c.Name)
		}
	}
	// gpu-6 of the refused claim is still free.
	free := e.claim("free", "gpu-6")
	cdiIDs(t, e.prepare(free), free)

	// Admin access (monitoring) may share a device with another admin.
	admin := func(name string) *resourceapi.ResourceClaim {
		c := e.claim(name, "gpu-4")
		c.Status.Allocation.Devices.Results[0].AdminAccess = new(true)
		c, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	m1, m2 := admin("mon1"), admin("mon2")
	cdiIDs(t, e.prepare(m1, m2), m1)

	// A claim that is not allocated is refused by the helper as a whole.
	pending, err := e.client.ResourceV1().ResourceClaims("default").Create(context.Background(),
		&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pending", UID: "uid-pending"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.dra.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{pbClaim(pending)}}); err == nil || !strings.Contains(err.Error(), "not allocated") {
		t.Errorf("unallocated claim: %v", err)
	}
}

func TestCheckpointRefusesBadFile(t *testing.T) {
	e := newEnv(t, "h100x1")
	e.stop()
	cp := filepath.Join(e.pluginDir, CheckpointFile)
	for name, content := range map[string]string{
		"torn":    `{"version":1,"driver":"gpu.nvidia.com","claims":{"uid-a":`,
		"version": `{"version":2,"driver":"gpu.nvidia.com","claims":{}}`,
		"driver":  `{"version":1,"driver":"other.example.com","claims":{}}`,
	} {
		if err := os.WriteFile(cp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := New(e.options()); err == nil || !strings.Contains(err.Error(), cp) {
			t.Errorf("%s checkpoint: %v, want an error naming %s", name, err, cp)
		}
	}
}

func TestRegistration(t *testing.T) {
	e := newEnv(t, "h100x1")
	conn, err := grpc.NewClient("unix://"+filepath.Join(e.reg, DefaultDriverName+"-reg.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != DefaultDriverName || info.Endpoint != filepath.Join(e.pluginDir, "dra.sock") {
		t.Errorf("GetInfo %+v", info)
	}
	if !slices.Contains(info.SupportedVersions, drapb.DRAPluginService) {
		t.Errorf("v1 DRA service not offered: %v", info.SupportedVersions)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestHostRoot: with the host's / mounted at HostRoot, the spec names host
// paths, which the runtime reads on the host.
func TestHostRoot(t *testing.T) {
	e := newEnv(t, "h100x1")
	e.stop()
	o := e.options()
	o.HostRoot = e.devRoot // the dev root is the "host" here
	drv, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	c := e.claim("hr", "gpu-0")
	res, err := drv.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatal(err, res[c.UID].Err)
	}
	spec := readSpec(t, drv.SpecPath(c.UID))
	n := spec.Devices[0].ContainerEdits.DeviceNodes[0]
	if n.Path != "/dev/nvidia0" || n.HostPath != "" {
		t.Errorf("device node %s host path %q, want /dev/nvidia0 with no host path", n.Path, n.HostPath)
	}

	d := &Driver{hostRoot: "/host"}
	ce := specs.ContainerEdits{
		Mounts: []*specs.Mount{{HostPath: "/host/usr/lib/libcuda.so.1"}, {HostPath: "/hostile/lib.so"}, {HostPath: "/run/x"}},
		DeviceNodes: []*specs.DeviceNode{{Path: "/dev/nvidia0", HostPath: "/host/dev/nvidia0"},
			{Path: "/dev/nvidiactl", HostPath: "/host/run/nvidia/driver/dev/nvidiactl"}},
	}
	d.unroot(&ce)
	var got []string
	for _, m := range ce.Mounts {
		got = append(got, m.HostPath)
	}
	for _, n := range ce.DeviceNodes {
		got = append(got, n.HostPath)
	}
	want := []string{"/usr/lib/libcuda.so.1", "/hostile/lib.so", "/run/x", "", "/run/nvidia/driver/dev/nvidiactl"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("host paths %q, want %q", got, want)
	}
}

// TestCheckpointWriteFails: a prepare or unprepare whose checkpoint cannot
// be written fails as a whole and leaves the plugin's view as the disk's,
// so that the kubelet's retry and a restart agree.
func TestCheckpointWriteFails(t *testing.T) {
	e := newEnv(t, "h100x1")
	c := e.claim("cpfail", "gpu-0")
	cp := filepath.Join(e.pluginDir, CheckpointFile)
	block := func() { // a directory in its place: the rename over it fails
		t.Helper()
		os.Remove(cp)
		if err := os.Mkdir(cp, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	unblock := func() {
		t.Helper()
		if err := os.Remove(cp); err != nil {
			t.Fatal(err)
		}
	}
	block()
	if _, err := e.dra.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{pbClaim(c)}}); err == nil || !strings.Contains(err.Error(), cp) {
		t.Errorf("prepare with an unwritable checkpoint: %v, want an error naming %s", err, cp)
	}
	if got := e.drv.Prepared(); len(got) != 0 {
		t.Errorf("a claim not in the checkpoint counts as prepared: %v", got)
	}
	unblock()
	cdiIDs(t, e.prepare(c), c)

	b, err := os.ReadFile(cp)
	if err != nil {
		t.Fatal(err)
	}
	block()
	if _, err := e.dra.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{pbClaim(c)}}); err == nil {
		t.Error("unprepare with an unwritable checkpoint succeeded")
	}
	if got := e.drv.Prepared(); !slices.Equal(got, []string{string(c.UID)}) {
		t.Errorf("after a failed unprepare, prepared %v; the checkpoint on disk still holds %s", got, c.UID)
	}
	unblock()
	if err := os.WriteFile(cp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := e.unprepare(c).Claims[string(c.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare retry: %+v", r)
	}
	if got := e.drv.Prepared(); len(got) != 0 {
		t.Errorf("prepared after unprepare: %v", got)
	}
}

// A pod deleted: the kubelet unprepares its claims only once the pod is gone
// from the API server, and the scheduler may give the device to a new claim
// before that. The plugin asks the API server about the claim holding the
// device: deleted (or no longer allocated it), it is released and the new
// claim prepared at once; still allocated, the device stays taken.
func TestPrepareReleasesStaleClaim(t *testing.T) {
	e := newEnv(t, "h100x8")
	old := e.claim("old", "gpu-3")
	cdiIDs(t, e.prepare(old), old)
	oldSpec := e.drv.SpecPath(old.UID)

	// Still allocated in the API: refused.
	early := e.claim("early", "gpu-3")
	if r := e.prepare(early).Claims[string(early.UID)]; r == nil || !strings.Contains(r.Error, ErrDeviceInUse.Error()) {
		t.Fatalf("claim on a device another live claim holds: %+v, want in use", r)
	}
	// Deallocated (its pods gone, the claim kept): released.
	old.Status.Allocation = nil
	if _, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ids := cdiIDs(t, e.prepare(early), early)
	inject(t, e.cdiRoot, ids)
	if _, err := os.Stat(oldSpec); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the released claim's spec is still there: %v", err)
	}
	// The kubelet's late unprepare of the old claim is no error and leaves
	// the new claim alone.
	if r := e.unprepare(old).Claims[string(old.UID)]; r == nil || r.Error != "" {
		t.Fatalf("late unprepare of the released claim: %+v", r)
	}
	if _, err := os.Stat(e.drv.SpecPath(early.UID)); err != nil {
		t.Fatalf("the new claim's spec went with the old claim's unprepare: %v", err)
	}

	// Deleted from the API server: released too; and the release outlives
	// a restart (the checkpoint no longer has it).
	if err := e.client.ResourceV1().ResourceClaims("default").Delete(context.Background(), "early", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next := e.claim("next", "gpu-3")
	cdiIDs(t, e.prepare(next), next)
	e.stop()
	e.start()
	if got := e.drv.Prepared(); slices.Contains(got, string(early.UID)) {
		t.Errorf("after a restart the released claim is prepared again: %v", got)
	}
}
