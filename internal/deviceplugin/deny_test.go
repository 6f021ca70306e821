package deviceplugin

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gantry-gpu/gantry/internal/request"
)

// containerSpec is what the kubelet and the CRI make of an image's env and
// an Allocate answer: the answer's variables override the image's, its
// mounts become bind mounts.
func containerSpec(imageEnv []string, r *pluginapi.ContainerAllocateResponse, privileged bool) *specs.Spec {
	env := slices.Clone(imageEnv)
	if r != nil {
		for k, v := range r.Envs {
			env = append(env, k+"="+v)
		}
	}
	s := &specs.Spec{Process: &specs.Process{Env: env, Capabilities: &specs.LinuxCapabilities{}}}
	if privileged {
		s.Process.Capabilities.Bounding = []string{"CAP_SYS_ADMIN"}
	}
	if r != nil {
		for _, m := range r.Mounts {
			s.Mounts = append(s.Mounts, specs.Mount{Source: m.HostPath, Destination: m.ContainerPath, Type: "bind", Options: []string{"rbind", "ro"}})
		}
	}
	return s
}

// TestDenyByDefault checks the contract of the package comment end to end,
// from this plugin's Allocate answer to the runtime's reading of the spec
// (package request, as gantry-runtime and gantry-hook use it).
func TestDenyByDefault(t *testing.T) {
	sys := loadSim(t, "h100x8")
	u1, u6 := sys.Devices[1].UUID, sys.Devices[6].UUID
	imageEnv := []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}

	opts := request.DefaultOptions()
	opts.AcceptEnvWhenUnprivileged = false // runtime.accept-env-unprivileged = false
	opts.AcceptVolumeMounts = true         // runtime.accept-volume-mounts = true

	answer := func(strategy DeviceListStrategy) *pluginapi.ContainerAllocateResponse {
		cfg := DefaultConfig()
		cfg.Flags.Plugin.DeviceListStrategy = StrategyList{strategy}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		p, err := New(Options{Config: cfg, System: sys, Log: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		s := p.servers[0]
		devs, err := s.lookup([]string{u1, u6})
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.containerResponse(devs)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	parse := func(spec *specs.Spec) *request.Request {
		t.Helper()
		r, err := request.Parse(request.InputFromSpec(spec), opts)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	// A pod without a GPU request, image saying "all": nothing.
	if r := parse(containerSpec(imageEnv, nil, false)); r.Wants() {
		t.Errorf("no GPU request, image NVIDIA_VISIBLE_DEVICES=all: the runtime would inject %v", r.Devices)
	}
	// A pod with a GPU request under volume-mounts: exactly its GPUs.
	r := parse(containerSpec(imageEnv, answer(ListVolumeMounts), false))
	if !r.Wants() || !slices.Equal(r.Devices.IDs, []string{u1, u6}) {
		t.Errorf("volume-mounts request: devices %v (source %s), want [%s %s]", r.Devices, r.Source, u1, u6)
	}
	// The same with the envvar strategy: the runtime refuses the env of an
	// unprivileged container, so deny-by-default needs volume-mounts.
	if r := parse(containerSpec(imageEnv, answer(ListEnvVar), false)); r.Wants() {
		t.Errorf("envvar strategy with accept-env-unprivileged=false gave %v", r.Devices)
	}
	// Privileged containers are trusted with the env, as in NVIDIA's runtime.
	if r := parse(containerSpec(imageEnv, nil, true)); !r.Wants() {
		t.Errorf("privileged container with NVIDIA_VISIBLE_DEVICES=all: no devices")
	}
}
