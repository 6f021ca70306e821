package deviceplugin

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// nvidiaStyleConfig is a config file as NVIDIA's documentation and Helm chart
// write them, with keys Gantry reads but does not act on.
const nvidiaStyleConfig = `
version: v1
flags:
  migStrategy: "mixed"
  failOnInitError: true
  nvidiaDriverRoot: "/run/nvidia/driver"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: ["envvar", "cdi-annotations"]
    deviceIDStrategy: "uuid"
    cdiAnnotationPrefix: cdi.k8s.io/
    nvidiaCTKPath: /usr/bin/nvidia-ctk
    containerDriverRoot: /driver-root
  gfd:
    oneshot: false
    noTimestamp: false
    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd
    sleepInterval: 60s
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: false
    resources:
    - name: nvidia.com/gpu
      replicas: 10
    - name: nvidia.com/mig-1g.5gb
      replicas: 2
      devices: 2
`

func TestParseNVIDIAConfig(t *testing.T) {
	c, err := ParseConfig([]byte(nvidiaStyleConfig), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Flags.MigStrategy != MIGMixed || !slices.Equal(c.Flags.Plugin.DeviceListStrategy, StrategyList{ListEnvVar, ListCDIAnnotations}) ||
		c.Flags.NvidiaDriverRoot != "/run/nvidia/driver" || c.DevRoot() != "/run/nvidia/driver" {
		t.Errorf("flags: %+v", c.Flags)
	}
	rs := c.Sharing.TimeSlicing.Resources
	if rs[0].Rename != "nvidia.com/gpu.shared" || rs[1].Rename != "nvidia.com/mig-1g.5gb.shared" || rs[1].Devices.Count != 2 || !rs[0].Devices.All {
		t.Errorf("timeSlicing: %+v", rs)
	}
	// JSON works too, and a single strategy as a string.
	c, err = ParseConfig([]byte(`{"version":"v1","flags":{"plugin":{"deviceListStrategy":"volume-mounts"}}}`), "test.json")
	if err != nil || c.Validate() != nil || !slices.Equal(c.Flags.Plugin.DeviceListStrategy, StrategyList{ListVolumeMounts}) {
		t.Errorf("JSON config: %+v, %v", c.Flags.Plugin, err)
	}
	// The file's example in --help parses.
	var help bytes.Buffer
	writeHelp(&help)
	_, example, _ := strings.Cut(help.String(), "Config file (keys as NVIDIA's version v1; gantry: holds Gantry's own):\n")
	example, _, _ = strings.Cut(example, "\nDeny by default")
	if c, err := ParseConfig([]byte(example), "help"); err != nil || c.Validate() != nil {
		t.Errorf("the --help example does not load: %v / %v\n%s", err, c.Validate(), example)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		env        map[string]string
		flags      map[string]string
		want       []string // all in the error
	}{
		{name: "unknown MIG strategy in file", file: "version: v1\nflags: {migStrategy: half}",
			want: []string{"flags.migStrategy", "half", "none, single, mixed", "cfg.yaml"}},
		{name: "unknown MIG strategy in env", env: map[string]string{"MIG_STRATEGY": "all"},
			want: []string{"flags.migStrategy", "MIG_STRATEGY=all", "none, single, mixed"}},
		{name: "unknown list strategy by flag", flags: map[string]string{"device-list-strategy": "envvar,mounts"},
			want: []string{"flags.plugin.deviceListStrategy", "--device-list-strategy", `"mounts"`, "envvar, volume-mounts, cdi-annotations, cdi-cri"}},
		{name: "unknown list strategy in file list", file: "version: v1\nflags: {plugin: {deviceListStrategy: [envvar, cdi]}}",
			want: []string{"flags.plugin.deviceListStrategy", `"cdi"`, "cdi-cri"}},
		{name: "unknown ID strategy", env: map[string]string{"DEVICE_ID_STRATEGY": "serial"},
			want: []string{"flags.plugin.deviceIDStrategy", "serial", "uuid, index"}},
		{name: "replicas 0", file: "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 0}]}}",
			want: []string{"sharing.timeSlicing.resources[0].replicas", "0", "2 or more"}},
		{name: "replicas 1", file: "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}",
			want: []string{"sharing.timeSlicing.resources[0].replicas", "2 or more"}},
		{name: "replicas negative", file: "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: -3}]}}",
			want: []string{"replicas", "-3"}},
		{name: "replicas huge", file: "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 100000000}]}}",
			want: []string{"replicas", "100000000", "at most 1024"}},
		{name: "replicas missing", file: "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu}]}}",
			want: []string{"replicas", "2 or more"}},
		{name: "bad devices", file: "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: some}]}}",
			want: []string{"devices", `"some"`, "all"}},
		{name: "bad resource name", file: "version: v1\nsharing: {timeSlicing: {resources: [{name: GPU_Big, replicas: 2}]}}",
			want: []string{"sharing.timeSlicing.resources[0].name", "GPU_Big", "DNS"}},
		{name: "mps replicas 1", file: "version: v1\nsharing: {mps: {resources: [{name: gpu, replicas: 1}]}}",
			want: []string{"sharing.mps.resources[0].replicas", "2 or more"}},
		{name: "unknown key with a bad value", file: "version: v1\nflags: {migStrategee: none, migStrategy: half}",
			want: []string{"flags.migStrategy", "half"}},
		{name: "bad version", file: "version: v2",
			want: []string{"version", "v2", "v1"}},
		{name: "bad bool env", env: map[string]string{"PASS_DEVICE_SPECS": "maybe"},
			want: []string{"PASS_DEVICE_SPECS=maybe", "flags.plugin.passDeviceSpecs", "true or false"}},
		{name: "bad gpus", flags: map[string]string{"gpus": "cuda"},
			want: []string{"gantry.gpus", "--gpus", "nvml, sim:PROFILE"}},
		{name: "bad kubelet socket", env: map[string]string{"KUBELET_SOCKET": "/var/lib/kubelet/device-plugins/k.sock"},
			want: []string{"KUBELET_SOCKET", "kubelet.sock"}},
		{name: "relative kubelet dir", flags: map[string]string{"kubelet-dir": "kubelet"},
			want: []string{"gantry.kubeletDir", "absolute"}},
		{name: "bad quiet period", file: "version: v1\ngantry: {health: {recoveryQuietPeriod: soon}}",
			want: []string{"gantry.health.recoveryQuietPeriod", "soon", "10m"}},
		{name: "bad allocation policy", env: map[string]string{"SHARED_DEVICES_ALLOCATION_POLICY": "random"},
			want: []string{"sharedDevicesAllocationPolicy", "distributed, packed"}},
		{name: "tegra", env: map[string]string{"DEVICE_DISCOVERY_STRATEGY": "tegra"},
			want: []string{"flags.deviceDiscoveryStrategy", "auto, nvml"}},
		{name: "empty file", file: " \n",
			want: []string{"cfg.yaml", "empty"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = filepath.Join(t.TempDir(), "cfg.yaml")
				if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err := LoadEffective(path, func(k string) string { return tc.env[k] }, tc.flags)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrConfig) {
				t.Errorf("%v does not wrap ErrConfig", err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("multi-line error: %q", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	// An unreadable file names itself.
	_, err := LoadEffective("/nonexistent/dp.yaml", func(string) string { return "" }, nil)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/dp.yaml") {
		t.Errorf("missing file: %v", err)
	}
}

func TestPrecedenceFlagOverEnvOverFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cfg.yaml")
	os.WriteFile(path, []byte("version: v1\nflags: {migStrategy: single, plugin: {deviceIDStrategy: index, passDeviceSpecs: true}}"), 0o644)
	env := map[string]string{"MIG_STRATEGY": "mixed", "DEVICE_LIST_STRATEGY": "volume-mounts,cdi-cri"}
	c, err := LoadEffective(path, func(k string) string { return env[k] }, map[string]string{"mig-strategy": "none", "pass-device-specs": "false"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Flags.MigStrategy != MIGNone || c.Flags.Plugin.DeviceIDStrategy != IDIndex || c.Flags.Plugin.PassDeviceSpecs ||
		!slices.Equal(c.Flags.Plugin.DeviceListStrategy, StrategyList{ListVolumeMounts, ListCDICRI}) {
		t.Errorf("effective config: %+v", c.Flags)
	}
}

func TestMatchPattern(t *testing.T) {
	for _, tc := range []struct {
		p, s string
		want bool
	}{
		{"*", "NVIDIA H100 80GB HBM3", true}, {"*H100*", "NVIDIA H100 80GB HBM3", true},
		{"*A100*", "NVIDIA H100 80GB HBM3", false}, {"1g.*", "1g.5gb", true}, {"1g.*", "2g.10gb", false},
		{"1g.5gb", "1g.5gb", true}, {"1g.5gb", "1g.5gbx", false}, {"a*b*c", "abc", true}, {"a*b*c", "acb", false},
		{"a*a", "a", false}, {"*gb", "1g.5gb", true},
	} {
		if got := matchPattern(tc.p, tc.s); got != tc.want {
			t.Errorf("matchPattern(%q, %q) = %v", tc.p, tc.s, got)
		}
	}
}

func TestMainHelpDryRunAndShutdown(t *testing.T) {
	t.Setenv("GANTRY_CONFIG", filepath.Join(t.TempDir(), "absent.toml")) // explicit and missing: an error
	var out, errb bytes.Buffer
	noenv := func(string) string { return "" }
	if code := run(context.Background(), []string{"--help"}, noenv, &out, &errb); code != 0 {
		t.Fatalf("--help: %d %s", code, errb.String())
	}
	for _, w := range []string{"MIG_STRATEGY", "--device-list-strategy", "DP_DISABLE_HEALTHCHECKS", "accept-volume-mounts", "timeSlicing", "--kubelet-dir"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("--help does not mention %s", w)
		}
	}
	out.Reset()
	if code := run(context.Background(), []string{"--gpus", "sim:h100x1", "--dry-run"}, noenv, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "absent.toml") {
		t.Errorf("an explicit missing GANTRY_CONFIG: %d %s", code, errb.String())
	}
	os.Unsetenv("GANTRY_CONFIG")
	t.Setenv("GANTRY_CONFIG", "")

	errb.Reset()
	code := run(context.Background(), []string{"--gpus=sim:a100x2-mig", "--mig-strategy=mixed", "--dry-run"}, noenv, &out, &errb)
	if code != 0 || !strings.Contains(out.String(), "nvidia.com/mig-1g.5gb (8 devices, socket nvidia-mig-1g.5gb.sock)") {
		t.Errorf("--dry-run: %d\n%s\n%s", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), []string{"--mig-strategy=whole"}, noenv, &out, &errb); code != 1 || !strings.Contains(errb.String(), "none, single, mixed") {
		t.Errorf("bad flag value: %d %s", code, errb.String())
	}
	if code := run(context.Background(), []string{"--no-such-flag"}, noenv, &out, &errb); code != 2 {
		t.Errorf("unknown flag: %d", code)
	}
	// Init failure with failOnInitError false waits for termination instead of exiting.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--gpus=sim:a100x2-mig", "--mig-strategy=single", "--fail-on-init-error=false"}, noenv, &out, &errb)
	}()
	select {
	case code := <-done:
		t.Fatalf("exited (%d) though failOnInitError is false", code)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit after termination: %d", code)
	}

	// A full run against a fake kubelet, ended like SIGTERM ends it.
	dir := shortTempDir(t)
	k := startKubelet(t, dir)
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		done <- run(ctx, []string{"--gpus=sim:h100x8", "--kubelet-dir=" + dir, "--sim-health-socket=" + filepath.Join(dir, "h.sock"), "--log-level=error"}, noenv, &out, &errb)
	}()
	if r := k.registration(); r.ResourceName != "nvidia.com/gpu" {
		t.Errorf("registration %v", r)
	}
	if l := k.list("nvidia.com/gpu"); len(l) != 8 {
		t.Errorf("%d devices", len(l))
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit status after termination: %d (%s)", code, errb.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "nvidia-gpu.sock")); err == nil {
		t.Error("socket left after termination")
	}
}

// FuzzParseConfig: no input panics the parser, the validator or the
// resource builder, and an accepted config builds resources or says why not.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(nvidiaStyleConfig))
	f.Add([]byte("version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 3, devices: [0, \"1:2\"]}]}}"))
	f.Add([]byte(`{"version":"v1","resources":{"gpus":[{"pattern":"*","name":"x"}]}}`))
	sys := loadSim(f, "a100x2-mig")
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data, "fuzz")
		if err != nil {
			return
		}
		if c.Validate() != nil {
			return
		}
		if _, err := BuildResources(sys, &c, testLogger(t)); err != nil && !strings.Contains(err.Error(), ":") {
			t.Errorf("error without context: %v", err)
		}
	})
}
