package deviceplugin

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// imexRoot is a device root holding IMEX channel 0 as a real character
// device (the null device's numbers), as the IMEX daemon creates it.
func imexRoot(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mknod of a character device needs root")
	}
	root := t.TempDir()
	dir := filepath.Join(root, imexChannelDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(dir, "channel0"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestIMEXChannelsInAllocate: NVIDIA's imex section (channelIDs: [0])
// gives every container channel 0 in the form of each device list
// strategy: NVIDIA_IMEX_CHANNELS, a volume mount under imex/, the CDI name
// nvidia.com/imex-channel=0 (CRI field and annotation), the node itself
// with passDeviceSpecs; over the plugin's real gRPC socket.
func TestIMEXChannelsInAllocate(t *testing.T) {
	root := imexRoot(t)
	for _, tc := range []struct {
		strategies StrategyList
		check      func(*pluginapi.ContainerAllocateResponse) bool
	}{
		{StrategyList{ListEnvVar}, func(r *pluginapi.ContainerAllocateResponse) bool { return r.Envs[envIMEXChannels] == "0" }},
		{StrategyList{ListVolumeMounts}, func(r *pluginapi.ContainerAllocateResponse) bool {
			return slices.ContainsFunc(r.Mounts, func(m *pluginapi.Mount) bool {
				return m.ContainerPath == "/var/run/nvidia-container-devices/imex/0" && m.HostPath == "/dev/null"
			}) && r.Envs[envIMEXChannels] == ""
		}},
		{StrategyList{ListCDICRI}, func(r *pluginapi.ContainerAllocateResponse) bool {
			return slices.ContainsFunc(r.CdiDevices, func(d *pluginapi.CDIDevice) bool { return d.Name == "nvidia.com/imex-channel=0" }) &&
				r.Envs[envIMEXChannels] == ""
		}},
		{StrategyList{ListCDIAnnotations}, func(r *pluginapi.ContainerAllocateResponse) bool {
			for _, v := range r.Annotations {
				return strings.HasSuffix(v, ",nvidia.com/imex-channel=0")
			}
			return false
		}},
	} {
		t.Run(string(tc.strategies[0]), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Flags.NvidiaDevRoot = root
			cfg.Flags.Plugin.DeviceListStrategy = tc.strategies
			cfg.Flags.Plugin.PassDeviceSpecs = true
			cfg.Imex = &Imex{ChannelIDs: []int{0}}
			h := startHarness(t, "h100x8", cfg)
			h.kubelet.registration()
			resp, err := allocate(t, h.kubelet.client("nvidia-gpu.sock"), []string{h.sys.Devices[1].UUID})
			if err != nil {
				t.Fatal(err)
			}
			r := resp.ContainerResponses[0]
			if !tc.check(r) {
				t.Errorf("answer without IMEX channel 0: %v", r)
			}
			wantSpec := !tc.strategies.allCDI()
			hasSpec := slices.ContainsFunc(r.Devices, func(d *pluginapi.DeviceSpec) bool {
				return d.ContainerPath == "/dev/nvidia-caps-imex-channels/channel0" && d.HostPath == filepath.Join(root, "/dev/nvidia-caps-imex-channels/channel0")
			})
			if hasSpec != wantSpec {
				t.Errorf("passDeviceSpecs: channel node in Devices = %v, want %v (%v)", hasSpec, wantSpec, r.Devices)
			}
		})
	}
}

// TestIMEXConfigNeverTakesGPUs: the section an admin copies from NVIDIA's
// docs (channelIDs: [0], required: false) starts the plugin on a node
// without the channel, serving every GPU and handing out no channel, with
// a warning; an unknown key beside it is a warning too. With
// required: true and no channel the plugin exits naming the fix, as
// NVIDIA's does, even with failOnInitError false.
func TestIMEXConfigNeverTakesGPUs(t *testing.T) {
	t.Setenv("GANTRY_CONFIG", "")
	noenv := func(string) string { return "" }
	write := func(body string) string {
		p := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	devRoot := t.TempDir()
	soft := write("version: v1\nimex:\n  channelIDs: [0]\n  required: false\n  futureKey: 1\nflags:\n  newerFlag: x\n")
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"--config", soft, "--gpus=sim:h100x8", "--nvidia-dev-root=" + devRoot, "--dry-run"}, noenv, &out, &errb)
	if code != 0 || !strings.Contains(out.String(), "nvidia.com/gpu (8 devices") {
		t.Fatalf("required: false without the channel: exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	for _, w := range []string{"flags.newerFlag", "imex.futureKey", "IMEX channel 0", "required is false"} {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("log does not warn about %s:\n%s", w, errb.String())
		}
	}

	hard := write("version: v1\nflags: {failOnInitError: false}\nimex: {channelIDs: [0], required: true}\n")
	out.Reset()
	errb.Reset()
	code = run(context.Background(), []string{"--config", hard, "--gpus=sim:h100x8", "--nvidia-dev-root=" + devRoot}, noenv, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "imex.required: false") || !strings.Contains(errb.String(), "channel0") {
		t.Errorf("required: true without the channel: exit %d, want 1 naming the channel and the fix:\n%s", code, errb.String())
	}
	if _, err := LoadEffective(write("version: v1\nimex: {channelIDs: [-1], required: true}\n"), noenv, nil); err == nil ||
		!strings.Contains(err.Error(), "imex.channelIDs") {
		t.Errorf("required channel -1: %v, want an error naming imex.channelIDs", err)
	}
	c, err := LoadEffective(write("version: v1\nimex: {channelIDs: [-1, 0, 0]}\n"), noenv, nil)
	if err != nil || !slices.Equal(c.Imex.ChannelIDs, []int{0}) || len(c.Warnings()) != 1 {
		t.Errorf("channels [-1, 0, 0] not required: %v %v %q, want [0] and one warning", err, c.Imex, c.Warnings())
	}
}
