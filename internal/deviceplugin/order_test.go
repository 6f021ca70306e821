package deviceplugin

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// TestAllocateOrderIndependent asks for the same devices in many orders, as
// the kubelet may (it keeps them in a set): every answer is the same, the
// devices in index order (MIG: GPU, then MIG device), so
// NVIDIA_VISIBLE_DEVICES, the mounts, the CDI names and the CDI annotation
// key do not depend on the order of the request.
func TestAllocateOrderIndependent(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	all := StrategyList{ListEnvVar, ListCDIAnnotations, ListCDICRI}
	tests := []struct {
		name, profile, resource, socket string
		config                          func(c *Config)
		ids                             func(h *harness) []string // the request, in order
		wantEnv                         func(h *harness) string   // NVIDIA_VISIBLE_DEVICES
	}{
		{"whole GPUs", "h100x8", "nvidia.com/gpu", "nvidia-gpu.sock",
			func(c *Config) { c.Flags.Plugin.DeviceListStrategy = all; c.Flags.Plugin.PassDeviceSpecs = true },
			func(h *harness) []string {
				return []string{h.sys.Devices[0].UUID, h.sys.Devices[2].UUID, h.sys.Devices[3].UUID, h.sys.Devices[6].UUID, h.sys.Devices[7].UUID}
			},
			func(h *harness) string {
				return strings.Join([]string{h.sys.Devices[0].UUID, h.sys.Devices[2].UUID, h.sys.Devices[3].UUID, h.sys.Devices[6].UUID, h.sys.Devices[7].UUID}, ",")
			}},
		{"whole GPUs by index, volume mounts", "h100x8", "nvidia.com/gpu", "nvidia-gpu.sock",
			func(c *Config) {
				c.Flags.Plugin.DeviceListStrategy = StrategyList{ListVolumeMounts, ListCDIAnnotations}
				c.Flags.Plugin.DeviceIDStrategy = IDIndex
			},
			func(h *harness) []string {
				var ids []string
				for _, d := range h.sys.Devices {
					ids = append(ids, d.UUID)
				}
				return ids
			},
			func(*harness) string { return volumeMountsRoot }},
		{"MIG devices by index", "a100x2-mig", "nvidia.com/mig-1g.5gb", "nvidia-mig-1g.5gb.sock",
			func(c *Config) {
				c.Flags.MigStrategy = MIGMixed
				c.Flags.Plugin.DeviceListStrategy = all
				c.Flags.Plugin.DeviceIDStrategy = IDIndex
				c.Flags.Plugin.PassDeviceSpecs = true
			},
			func(h *harness) []string {
				ids := []string{h.sys.Devices[0].MIGDevices[2].UUID}
				for _, m := range h.sys.Devices[1].MIGDevices {
					ids = append(ids, m.UUID)
				}
				return ids
			},
			func(*harness) string { return "0:2,1:0,1:1,1:2,1:3,1:4,1:5,1:6" }},
		{"replicas", "h100x8", "nvidia.com/gpu", "nvidia-gpu.sock",
			func(c *Config) {
				c.Flags.Plugin.DeviceListStrategy = all
				c.Sharing.TimeSlicing = &ReplicatedResources{Resources: []ReplicatedResource{{Name: "gpu", Replicas: 4}}}
			},
			func(h *harness) []string {
				u1, u4 := h.sys.Devices[1].UUID, h.sys.Devices[4].UUID
				return []string{u1 + "::0", u1 + "::3", u4 + "::1", u4 + "::2"}
			},
			func(h *harness) string { return h.sys.Devices[1].UUID + "," + h.sys.Devices[4].UUID }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.config(&cfg)
			h := startHarness(t, tc.profile, cfg)
			n := len(h.plugin.servers)
			h.kubelet.registrations(n)
			c := h.kubelet.client(tc.socket)
			ids := tc.ids(h)
			var first *pluginapi.ContainerAllocateResponse
			for i := range 20 {
				req := slices.Clone(ids)
				if i > 0 { // the first in order, the rest shuffled
					rng.Shuffle(len(req), func(a, b int) { req[a], req[b] = req[b], req[a] })
				}
				resp, err := allocate(t, c, req)
				if err != nil {
					t.Fatal(err)
				}
				got := resp.ContainerResponses[0]
				if first == nil {
					first = got
					if env := got.Envs[envVisibleDevices]; env != tc.wantEnv(h) {
						t.Errorf("%s = %q, want %q", envVisibleDevices, env, tc.wantEnv(h))
					}
					continue
				}
				if !proto.Equal(got, first) {
					t.Fatalf("request in order %v answered\n  %v\nin order %v\n  %v", req, got, ids, first)
				}
			}
			// The lists inside the answer are in that order too.
			if len(first.CdiDevices) > 0 {
				var names []string
				for _, d := range first.CdiDevices {
					names = append(names, strings.TrimPrefix(d.Name, "nvidia.com/gpu="))
				}
				if got := strings.Join(names, ","); got != tc.wantEnv(h) {
					t.Errorf("CDI devices %s, want %s", got, tc.wantEnv(h))
				}
			}
			for i, m := range first.Mounts {
				if want := volumeMountsRoot + "/" + strconv.Itoa(h.sys.Devices[i].Index); m.ContainerPath != want {
					t.Errorf("mount %d = %s, want %s", i, m.ContainerPath, want)
				}
			}
		})
	}
}

// TestCDIAnnotationKeyStable pins the CDI annotation key of a request: the
// same resource and devices give the same key in every version of the
// plugin, so a container's annotations do not change under an upgrade.
func TestCDIAnnotationKeyStable(t *testing.T) {
	for _, tc := range []struct {
		prefix, resource string
		ids              []string
		want             string
	}{
		{"cdi.k8s.io/", "nvidia.com/gpu", []string{"GPU-a", "GPU-b"}, "cdi.k8s.io/nvidia-device-plugin_06a5dd91e44faa1489cefa61e55ea2a4"},
	} {
		if got := cdiAnnotationKey(tc.prefix, tc.resource, tc.ids); got != tc.want {
			t.Errorf("cdiAnnotationKey(%q, %q, %q) = %s, want %s", tc.prefix, tc.resource, tc.ids, got, tc.want)
		}
	}
}
