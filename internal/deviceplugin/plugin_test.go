package deviceplugin

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/topology"
)

func deviceHealth(list []*pluginapi.Device) map[string]string {
	m := map[string]string{}
	for _, d := range list {
		m[d.ID] = d.Health
	}
	return m
}

func TestRegistrationListAndWatchAndHealth(t *testing.T) {
	h := startHarness(t, "h100x8", DefaultConfig())
	reg := h.kubelet.registration()
	want := &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: "nvidia-gpu.sock", ResourceName: "nvidia.com/gpu",
		Options: &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	}
	if !proto.Equal(reg, want) {
		t.Fatalf("registration = %v, want %v", reg, want)
	}
	if opts := h.kubelet.options["nvidia.com/gpu"]; !opts.GetPreferredAllocationAvailable || opts.PreStartRequired {
		t.Errorf("GetDevicePluginOptions = %v", opts)
	}

	list := h.kubelet.list("nvidia.com/gpu")
	if len(list) != 8 {
		t.Fatalf("initial list has %d devices, want 8", len(list))
	}
	for i, d := range list {
		g := h.sys.Devices[i]
		wantDev := &pluginapi.Device{ID: g.UUID, Health: pluginapi.Healthy,
			Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(g.NUMANode)}}}}
		if !proto.Equal(d, wantDev) {
			t.Errorf("device %d = %v, want %v", i, d, wantDev)
		}
	}

	// An application XID changes nothing; a critical one reaches the stream.
	bad := h.sys.Devices[3].UUID
	h.inject("xid " + bad + " 13")
	if ev := h.plugin.Health()[bad]; !ev.Healthy {
		t.Errorf("after ignored XID 13: %+v", ev)
	}
	h.inject("xid " + bad + " 79")
	list = h.kubelet.list("nvidia.com/gpu")
	for id, st := range deviceHealth(list) {
		want := pluginapi.Healthy
		if id == bad {
			want = pluginapi.Unhealthy
		}
		if st != want {
			t.Errorf("after XID 79 on %s: %s is %s, want %s", bad, id, st, want)
		}
	}
	ev := h.plugin.Health()[bad]
	if ev.Healthy || ev.XID != 79 || !strings.Contains(ev.Reason, "79") {
		t.Errorf("Health()[%s] = %+v, want unhealthy with XID 79", bad, ev)
	}
	if n := len(h.plugin.Health()); n != 8 {
		t.Errorf("Health() has %d entries, want 8", n)
	}

	// Recovery (a reset on the simulator) returns the device to Healthy.
	h.inject("reset " + bad)
	list = h.kubelet.list("nvidia.com/gpu")
	if st := deviceHealth(list)[bad]; st != pluginapi.Healthy {
		t.Errorf("after reset: %s is %s", bad, st)
	}
	if ev := h.plugin.Health()[bad]; !ev.Healthy || ev.Reason == "" {
		t.Errorf("Health() after reset = %+v", ev)
	}
}

func allocate(t *testing.T, c pluginapi.DevicePluginClient, ids ...[]string) (*pluginapi.AllocateResponse, error) {
	t.Helper()
	req := &pluginapi.AllocateRequest{}
	for _, l := range ids {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: l})
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	return c.Allocate(ctx, req)
}

// TestAllocateStrategies asks for GPUs 5 and 0 in that order: every
// answer names them in device order, 0 then 5.
func TestAllocateStrategies(t *testing.T) {
	sys := loadSim(t, "h100x8")
	u0, u5 := sys.Devices[0].UUID, sys.Devices[5].UUID
	mounts := func(ids ...string) []*pluginapi.Mount {
		var m []*pluginapi.Mount
		for _, id := range ids {
			m = append(m, &pluginapi.Mount{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/" + id, ReadOnly: true})
		}
		return m
	}
	annoKey := cdiAnnotationKey("cdi.k8s.io/", "nvidia.com/gpu", []string{u0, u5})
	tests := []struct {
		name   string
		config func(c *Config)
		want   *pluginapi.ContainerAllocateResponse
	}{
		{"envvar", func(c *Config) {},
			&pluginapi.ContainerAllocateResponse{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": u0 + "," + u5}}},
		{"envvar index", func(c *Config) { c.Flags.Plugin.DeviceIDStrategy = IDIndex },
			&pluginapi.ContainerAllocateResponse{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "0,5"}}},
		{"volume-mounts", func(c *Config) { c.Flags.Plugin.DeviceListStrategy = StrategyList{ListVolumeMounts} },
			&pluginapi.ContainerAllocateResponse{
				Envs:   map[string]string{"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
				Mounts: mounts(u0, u5)}},
		{"volume-mounts index with envvar", func(c *Config) {
			c.Flags.Plugin.DeviceListStrategy = StrategyList{ListEnvVar, ListVolumeMounts}
			c.Flags.Plugin.DeviceIDStrategy = IDIndex
		}, &pluginapi.ContainerAllocateResponse{
			Envs:   map[string]string{"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
			Mounts: mounts("0", "5")}},
		{"cdi-annotations", func(c *Config) { c.Flags.Plugin.DeviceListStrategy = StrategyList{ListCDIAnnotations} },
			&pluginapi.ContainerAllocateResponse{Annotations: map[string]string{annoKey: "nvidia.com/gpu=" + u0 + ",nvidia.com/gpu=" + u5}}},
		{"cdi-annotations custom prefix and kind", func(c *Config) {
			c.Flags.Plugin.DeviceListStrategy = StrategyList{ListCDIAnnotations}
			c.Flags.Plugin.CDIAnnotationPrefix = "example.com/"
			c.Flags.Plugin.DeviceIDStrategy = IDIndex
			c.Gantry.CDIKind = "example.com/gpu"
		}, &pluginapi.ContainerAllocateResponse{Annotations: map[string]string{
			cdiAnnotationKey("example.com/", "nvidia.com/gpu", []string{"0", "5"}): "example.com/gpu=0,example.com/gpu=5"}}},
		{"cdi-cri", func(c *Config) { c.Flags.Plugin.DeviceListStrategy = StrategyList{ListCDICRI} },
			&pluginapi.ContainerAllocateResponse{CdiDevices: []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + u0}, {Name: "nvidia.com/gpu=" + u5}}}},
		{"cdi-cri with envvar", func(c *Config) { c.Flags.Plugin.DeviceListStrategy = StrategyList{ListCDICRI, ListEnvVar} },
			&pluginapi.ContainerAllocateResponse{
				Envs:       map[string]string{"NVIDIA_VISIBLE_DEVICES": u0 + "," + u5},
				CdiDevices: []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + u0}, {Name: "nvidia.com/gpu=" + u5}}}},
		{"passDeviceSpecs", func(c *Config) {
			c.Flags.Plugin.PassDeviceSpecs = true
			c.Flags.NvidiaDevRoot = "/run/nvidia/driver"
		}, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": u0 + "," + u5},
			Devices: []*pluginapi.DeviceSpec{
				{ContainerPath: "/dev/nvidia0", HostPath: "/run/nvidia/driver/dev/nvidia0", Permissions: "rw"},
				{ContainerPath: "/dev/nvidia5", HostPath: "/run/nvidia/driver/dev/nvidia5", Permissions: "rw"},
			}}},
		{"gdrcopy gds mofed", func(c *Config) {
			c.Flags.GDRCopyEnabled, c.Flags.GDSEnabled, c.Flags.MOFEDEnabled = true, true, true
			c.Flags.Plugin.DeviceListStrategy = StrategyList{ListCDICRI}
		}, &pluginapi.ContainerAllocateResponse{
			Envs:       map[string]string{"NVIDIA_GDRCOPY": "enabled", "NVIDIA_GDS": "enabled", "NVIDIA_MOFED": "enabled"},
			CdiDevices: []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + u0}, {Name: "nvidia.com/gpu=" + u5}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.config(&cfg)
			h := startHarness(t, "h100x8", cfg)
			h.kubelet.registration()
			resp, err := allocate(t, h.kubelet.client("nvidia-gpu.sock"), []string{u5, u0}, []string{u5, u0})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.ContainerResponses) != 2 {
				t.Fatalf("%d container responses, want 2", len(resp.ContainerResponses))
			}
			for _, got := range resp.ContainerResponses {
				if !proto.Equal(got, tc.want) {
					t.Errorf("Allocate =\n  %v\nwant\n  %v", got, tc.want)
				}
			}
		})
	}
}

func TestAllocateUnknownIDs(t *testing.T) {
	h := startHarness(t, "h100x8", DefaultConfig())
	h.kubelet.registration()
	c := h.kubelet.client("nvidia-gpu.sock")
	_, err := allocate(t, c, []string{h.sys.Devices[0].UUID, "GPU-nope", "7"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Allocate with unknown IDs: %v, want InvalidArgument", err)
	}
	for _, id := range []string{"GPU-nope", "7"} {
		if !strings.Contains(status.Convert(err).Message(), id) {
			t.Errorf("error %q does not name %s", err, id)
		}
	}
	if strings.Contains(status.Convert(err).Message(), h.sys.Devices[0].UUID) {
		t.Errorf("error %q names a known device", err)
	}
	ctx := context.Background()
	_, err = c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"GPU-bogus"}, AllocationSize: 1}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "GPU-bogus") {
		t.Errorf("GetPreferredAllocation with an unknown ID: %v", err)
	}
	if _, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{h.sys.Devices[0].UUID}}); err != nil {
		t.Errorf("PreStartContainer: %v", err)
	}
}

func preferred(t *testing.T, c pluginapi.DevicePluginClient, available, must []string, size int) []string {
	t.Helper()
	resp, err := c.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: available, MustIncludeDeviceIDs: must, AllocationSize: int32(size)}}})
	if err != nil {
		t.Fatalf("GetPreferredAllocation(%d of %d, must %v): %v", size, len(available), must, err)
	}
	return resp.ContainerResponses[0].DeviceIDs
}

func TestPreferredAllocationH100x8(t *testing.T) {
	h := startHarness(t, "h100x8", DefaultConfig())
	h.kubelet.registration()
	c := h.kubelet.client("nvidia-gpu.sock")
	var all []string
	numa := map[string]int{}
	for _, d := range h.sys.Devices {
		all = append(all, d.UUID)
		numa[d.UUID] = d.NUMANode
	}
	for _, tc := range []struct {
		available, must []string
		size            int
	}{
		{all, nil, 1}, {all, nil, 2}, {all, nil, 4}, {all, nil, 8},
		{all, all[6:7], 4}, {all[1:], all[5:6], 2}, {all[3:], nil, 4},
	} {
		got := preferred(t, c, tc.available, tc.must, tc.size)
		want, err := topology.Preferred(h.sys, tc.available, tc.must, tc.size)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("preferred(%d, must %v) = %v, want the topology answer %v", tc.size, tc.must, got, want)
		}
		if len(got) != tc.size || !slices.Equal(got[:len(tc.must)], tc.must) {
			t.Errorf("preferred(%d, must %v) = %v: wrong size or must-include not first", tc.size, tc.must, got)
		}
	}
	// Four GPUs out of eight on two sockets: one socket's four.
	got := preferred(t, c, all, nil, 4)
	for _, u := range got {
		if numa[u] != numa[got[0]] {
			t.Errorf("4 of 8 spans NUMA nodes: %v", got)
		}
	}
}

// TestPreferredAllocationLogged: each answer is one log line naming what
// the kubelet offered, what the plugin chose and why (the topology sums),
// which the live cluster's TestPreferredAllocation reads.
func TestPreferredAllocationLogged(t *testing.T) {
	logs := &syncBuffer{}
	h := startHarnessLog(t, "h100x8", DefaultConfig(), 0, slog.New(slog.NewTextHandler(logs, nil)))
	h.kubelet.registration()
	c := h.kubelet.client("nvidia-gpu.sock")
	var all []string
	for _, d := range h.sys.Devices {
		all = append(all, d.UUID)
	}
	// GPUs 0-2 taken: of 3-7, the pair on one socket (4, 5), not 3 and 4.
	got := preferred(t, c, all[3:], nil, 2)
	if !slices.Equal(got, all[4:6]) {
		t.Fatalf("preferred 2 of GPUs 3-7 = %v, want GPUs 4 and 5 %v", got, all[4:6])
	}
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `msg="preferred allocation"`) {
			line = l
		}
	}
	for _, want := range []string{
		"resource=nvidia.com/gpu", "size=2",
		"available=" + strings.Join(all[3:], ","), "mustInclude=\"\"",
		"chosen=" + strings.Join(all[4:6], ","),
		`why="2 GPUs: NVLink links 18, pairs behind one PCIe switch 0, pairs on one NUMA node 1"`,
	} {
		if !strings.Contains(line, want) {
			t.Errorf("the preferred allocation log line lacks %s:\n%s", want, line)
		}
	}
}

func TestKubeletRestartReregisters(t *testing.T) {
	h := startHarness(t, "h100x1", DefaultConfig())
	h.kubelet.registration()
	h.kubelet.stop()
	// A restarting kubelet clears its directory, plugin sockets included.
	os.Remove(filepath.Join(h.dir, "nvidia-gpu.sock"))
	k2 := startKubelet(t, h.dir)
	reg := k2.registration()
	if reg.ResourceName != "nvidia.com/gpu" || reg.Endpoint != "nvidia-gpu.sock" {
		t.Errorf("re-registration = %v", reg)
	}
	if l := k2.list("nvidia.com/gpu"); len(l) != 1 || l[0].ID != h.sys.Devices[0].UUID {
		t.Errorf("list after kubelet restart = %v", l)
	}
	resp, err := allocate(t, k2.client("nvidia-gpu.sock"), []string{h.sys.Devices[0].UUID})
	if err != nil || resp.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"] != h.sys.Devices[0].UUID {
		t.Errorf("Allocate after kubelet restart: %v, %v", resp, err)
	}
	// Only the kubelet restarting, the plugin's socket untouched: still re-registers.
	k2.stop()
	k3 := startKubelet(t, h.dir)
	k3.registration()
}

func TestPluginSocketDeletedIsRecreated(t *testing.T) {
	h := startHarness(t, "h100x1", DefaultConfig())
	h.kubelet.registration()
	sock := filepath.Join(h.dir, "nvidia-gpu.sock")
	before, err := fileID(sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	reg := h.kubelet.registration()
	if reg.Endpoint != "nvidia-gpu.sock" {
		t.Errorf("re-registration endpoint %s", reg.Endpoint)
	}
	after, err := fileID(sock)
	if err != nil || after == before {
		t.Fatalf("socket not recreated: %v (%v -> %v)", err, before, after)
	}
	// The kubelet's new stream works.
	if l := h.kubelet.list("nvidia.com/gpu"); len(l) != 1 {
		t.Errorf("list after recreation: %v", l)
	}
}

func TestRunRemovesSocketsOnStop(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Flags.MigStrategy = MIGMixed
	h := startHarness(t, "a100x2-mig", cfg)
	regs := h.kubelet.registrations(3)
	for _, r := range []string{"nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb"} {
		if regs[r] == nil {
			t.Errorf("no registration of %s (got %v)", r, regs)
		}
	}
	h.stop()
	left, _ := filepath.Glob(filepath.Join(h.dir, "nvidia-*.sock"))
	if len(left) > 0 {
		t.Errorf("sockets left after stop: %v", left)
	}
}

func TestMIGHealthMarksMIGDevices(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Flags.MigStrategy = MIGMixed
	h := startHarness(t, "a100x2-mig", cfg)
	h.kubelet.registrations(3)
	h.kubelet.list("nvidia.com/mig-1g.5gb")
	// A fault on GPU 1 as a whole takes all its MIG devices out.
	h.inject("xid " + h.sys.Devices[1].UUID + " 48")
	var unhealthy int
	for _, d := range h.kubelet.list("nvidia.com/mig-1g.5gb") {
		if d.Health == pluginapi.Unhealthy {
			unhealthy++
		}
	}
	if unhealthy != 7 {
		t.Errorf("%d unhealthy 1g.5gb devices after an XID on GPU 1, want its 7", unhealthy)
	}
}

func TestTimeSlicing(t *testing.T) {
	cfg := DefaultConfig()
	fail := true
	cfg.Sharing.TimeSlicing = &ReplicatedResources{RenameByDefault: true, FailRequestsGreaterThanOne: &fail,
		Resources: []ReplicatedResource{{Name: "gpu", Replicas: 4}}}
	h := startHarness(t, "h100x8", cfg)
	reg := h.kubelet.registration()
	if reg.ResourceName != "nvidia.com/gpu.shared" || reg.Endpoint != "nvidia-gpu.shared.sock" {
		t.Fatalf("registration = %v", reg)
	}
	list := h.kubelet.list("nvidia.com/gpu.shared")
	if len(list) != 32 {
		t.Fatalf("%d shared devices, want 32", len(list))
	}
	u2 := h.sys.Devices[2].UUID
	if list[8].ID != u2+"::0" || list[11].ID != u2+"::3" {
		t.Errorf("replica IDs: %s, %s", list[8].ID, list[11].ID)
	}
	c := h.kubelet.client("nvidia-gpu.shared.sock")
	resp, err := allocate(t, c, []string{u2 + "::3"})
	if err != nil || resp.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"] != u2 {
		t.Errorf("Allocate of a replica: %v, %v", resp, err)
	}
	if _, err := allocate(t, c, []string{u2 + "::0", u2 + "::1"}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "failRequestsGreaterThanOne") {
		t.Errorf("two replicas with failRequestsGreaterThanOne: %v", err)
	}

	// Three replicas land on three GPUs, of one NUMA node, avoiding the used ones.
	var avail []string
	for _, d := range list {
		avail = append(avail, d.ID)
	}
	got := preferred(t, c, avail, nil, 3)
	gpus := map[string]bool{}
	for _, id := range got {
		gpus[strings.Split(id, "::")[0]] = true
	}
	if len(gpus) != 3 {
		t.Errorf("3 replicas on %d GPUs: %v", len(gpus), got)
	}
	// GPU 0 and 1 busy (one replica each in use): the next 2 go elsewhere.
	busy := slices.DeleteFunc(slices.Clone(avail), func(id string) bool {
		return id == h.sys.Devices[0].UUID+"::0" || id == h.sys.Devices[1].UUID+"::0"
	})
	got = preferred(t, c, busy, nil, 2)
	for _, id := range got {
		if strings.HasPrefix(id, h.sys.Devices[0].UUID) || strings.HasPrefix(id, h.sys.Devices[1].UUID) {
			t.Errorf("replica on a busy GPU: %v", got)
		}
	}
	// More replicas than GPUs: every GPU once, then again.
	got = preferred(t, c, avail, []string{u2 + "::1"}, 10)
	count := map[string]int{}
	for _, id := range got {
		count[strings.Split(id, "::")[0]]++
	}
	if len(count) != 8 || got[0] != u2+"::1" {
		t.Errorf("10 replicas: %v", got)
	}
}

func TestTimeSlicingSomeDevicesNoRename(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Sharing.TimeSlicing = &ReplicatedResources{Resources: []ReplicatedResource{
		{Name: "nvidia.com/gpu", Replicas: 2, Devices: ReplicatedDevices{List: []string{"1", "3"}}}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	sys := loadSim(t, "h100x8")
	res, err := BuildResources(sys, &cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Name != "nvidia.com/gpu" {
		t.Fatalf("resources: %+v", res)
	}
	var ids []string
	for _, d := range res[0].Devices {
		ids = append(ids, d.ID)
	}
	want := []string{sys.Devices[0].UUID, sys.Devices[1].UUID + "::0", sys.Devices[1].UUID + "::1", sys.Devices[2].UUID,
		sys.Devices[3].UUID + "::0", sys.Devices[3].UUID + "::1", sys.Devices[4].UUID, sys.Devices[5].UUID, sys.Devices[6].UUID, sys.Devices[7].UUID}
	if !slices.Equal(ids, want) {
		t.Errorf("IDs = %v\nwant %v", ids, want)
	}
}

func resourceSummary(res []Resource) map[string][]string {
	m := map[string][]string{}
	for _, r := range res {
		for _, d := range r.Devices {
			m[r.Name] = append(m[r.Name], d.Index)
		}
	}
	return m
}

func TestMIGStrategies(t *testing.T) {
	sys := loadSim(t, "a100x2-mig")
	for _, tc := range []struct {
		strategy MIGStrategy
		patterns []ResourcePattern
		want     map[string][]string
		err      string
	}{
		{strategy: MIGNone, want: map[string][]string{"nvidia.com/gpu": {"0", "1"}}},
		{strategy: MIGMixed, want: map[string][]string{
			"nvidia.com/mig-3g.20gb": {"0:0"}, "nvidia.com/mig-2g.10gb": {"0:1"},
			"nvidia.com/mig-1g.5gb": {"0:2", "1:0", "1:1", "1:2", "1:3", "1:4", "1:5", "1:6"}}},
		{strategy: MIGMixed, patterns: []ResourcePattern{{Pattern: "1g.*", Name: "small"}, {Pattern: "*", Name: "nvidia.com/big"}},
			want: map[string][]string{"nvidia.com/big": {"0:0", "0:1"},
				"nvidia.com/small": {"0:2", "1:0", "1:1", "1:2", "1:3", "1:4", "1:5", "1:6"}}},
		{strategy: MIGSingle, err: "different profiles"},
	} {
		cfg := DefaultConfig()
		cfg.Flags.MigStrategy = tc.strategy
		cfg.Resources.MIGs = tc.patterns
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		res, err := BuildResources(sys, &cfg, testLogger(t))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v, want %q", tc.strategy, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.strategy, err)
		}
		got := resourceSummary(res)
		if len(got) != len(tc.want) {
			t.Errorf("%s: resources %v, want %v", tc.strategy, got, tc.want)
		}
		for name, idx := range tc.want {
			if !slices.Equal(got[name], idx) {
				t.Errorf("%s: %s = %v, want %v", tc.strategy, name, got[name], idx)
			}
		}
	}

	// single on a host whose MIG devices are all alike: GPU 1 alone, as a file.
	one := *sys
	one.Devices = sys.Devices[1:]
	cfg := DefaultConfig()
	cfg.Flags.MigStrategy = MIGSingle
	res, err := BuildResources(&one, &cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := resourceSummary(res); len(got) != 1 || len(got["nvidia.com/gpu"]) != 7 {
		t.Errorf("single: %v", got)
	}
	if d := res[0].Devices[0]; len(d.Paths) != 3 || d.Paths[0] != "/dev/nvidia1" || !strings.HasPrefix(d.Paths[1], "/dev/nvidia-caps/nvidia-cap") {
		t.Errorf("MIG device paths: %v", d.Paths)
	}
	// single with a mix of MIG and whole GPUs.
	mixed := *sys
	mixed.Devices = slices.Clone(sys.Devices)
	mixed.Devices[0].MIGEnabled, mixed.Devices[0].MIGDevices = false, nil
	if _, err := BuildResources(&mixed, &cfg, testLogger(t)); err == nil || !strings.Contains(err.Error(), "mixed") {
		t.Errorf("single with whole and MIG GPUs: %v", err)
	}
	// mixed with that host: nvidia.com/gpu for GPU 0.
	cfg.Flags.MigStrategy = MIGMixed
	res, err = BuildResources(&mixed, &cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := resourceSummary(res); !slices.Equal(got["nvidia.com/gpu"], []string{"0"}) || len(got["nvidia.com/mig-1g.5gb"]) != 7 {
		t.Errorf("mixed with one whole GPU: %v", got)
	}
}

func TestMIGAllocateAndPreferred(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Flags.MigStrategy = MIGMixed
	cfg.Flags.Plugin.DeviceListStrategy = StrategyList{ListVolumeMounts}
	cfg.Flags.Plugin.DeviceIDStrategy = IDIndex
	h := startHarness(t, "a100x2-mig", cfg)
	h.kubelet.registrations(3)
	c := h.kubelet.client("nvidia-mig-1g.5gb.sock")
	m := h.sys.Devices[1].MIGDevices
	resp, err := allocate(t, c, []string{m[0].UUID, m[4].UUID})
	if err != nil {
		t.Fatal(err)
	}
	want := &pluginapi.ContainerAllocateResponse{
		Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
		Mounts: []*pluginapi.Mount{
			{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/1:0", ReadOnly: true},
			{HostPath: "/dev/null", ContainerPath: "/var/run/nvidia-container-devices/1:4", ReadOnly: true}}}
	if !proto.Equal(resp.ContainerResponses[0], want) {
		t.Errorf("Allocate = %v, want %v", resp.ContainerResponses[0], want)
	}
	var avail []string
	for _, d := range h.kubelet.list("nvidia.com/mig-1g.5gb") {
		avail = append(avail, d.ID)
	}
	got := preferred(t, c, avail, []string{m[2].UUID}, 3)
	if len(got) != 3 || got[0] != m[2].UUID {
		t.Fatalf("preferred MIG = %v", got)
	}
	for _, id := range got {
		if !slices.ContainsFunc(m, func(x gpu.MIGDevice) bool { return x.UUID == id }) {
			t.Errorf("preferred MIG %v: %s is not on GPU 1 with the must-include device", got, id)
		}
	}
}

func TestHealthEventBeforeStreamIsKept(t *testing.T) {
	h := startHarness(t, "h100x8", DefaultConfig())
	h.kubelet.registration()
	h.kubelet.list("nvidia.com/gpu")
	bad := h.sys.Devices[0].UUID
	h.inject("ecc " + bad + " dbe")
	h.kubelet.list("nvidia.com/gpu")
	// A kubelet that connects later sees the device unhealthy at once.
	h.kubelet.stop()
	k2 := startKubelet(t, h.dir)
	k2.registration()
	if st := deviceHealth(k2.list("nvidia.com/gpu"))[bad]; st != pluginapi.Unhealthy {
		t.Errorf("initial list of a new kubelet: %s is %s", bad, st)
	}
}
