package shim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gantry-gpu/gantry/internal/gpu/sim"
	"github.com/gantry-gpu/gantry/internal/kubeletckpt"
	"github.com/gantry-gpu/gantry/internal/request"
)

// TestKubeletAllocationSetsVisibleDevices: a CRI container whose image sets
// NVIDIA_VISIBLE_DEVICES=all and to which the kubelet allocated one GPU
// (the device plugin answered its UUID, in the kubelet's checkpoint) gets
// that GPU only, and the variable in the container reads that UUID, what
// the device plugin gave, as under NVIDIA's stack, not "all"; through
// gantry-runtime and real runc.
func TestKubeletAllocationSetsVisibleDevices(t *testing.T) {
	sys, err := sim.Load("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	gpu := sys.Devices[2]
	resp, err := proto.Marshal(&pluginapi.ContainerAllocateResponse{Envs: map[string]string{request.EnvVisibleDevices: gpu.UUID}})
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		PodUID, ContainerName, ResourceName string
		DeviceIDs                           map[string][]string
		AllocResp                           []byte
	}
	var cp struct {
		Data struct{ PodDeviceEntries []entry }
	}
	cp.Data.PodDeviceEntries = []entry{{PodUID: "pod-uid-1", ContainerName: "cuda", ResourceName: "nvidia.com/gpu",
		DeviceIDs: map[string][]string{"0": {gpu.UUID}}, AllocResp: resp}}
	kubelet := t.TempDir()
	data, _ := json.Marshal(cp)
	if err := os.MkdirAll(filepath.Join(kubelet, "device-plugins"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(kubelet, "device-plugins", kubeletckpt.File), data, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, env := range [][]string{
		{"NVIDIA_VISIBLE_DEVICES=all"},
		// The image's value, then the kubelet's, as a CRI may append it:
		// a shell takes the first.
		{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=" + gpu.UUID},
	} {
		checkVisible(t, gpu.UUID, kubelet, env)
	}
}

func checkVisible(t *testing.T, uuid, kubelet string, env []string) {
	t.Helper()
	c := newContainer(t, opts{
		env:    append(env, "NVIDIA_DRIVER_CAPABILITIES=compute,utility"),
		args:   []string{"sh", "-c", gpuScript},
		config: `kubernetes-env = "allocated"` + "\n" + `kubelet-dir = "` + kubelet + `"`,
		annotations: map[string]string{
			request.AnnotationContainerdType: "container", request.AnnotationContainerdPodUID: "pod-uid-1",
			request.AnnotationContainerdContainer: "cuda",
		},
	})
	out, stderr, err := c.run()
	if err != nil {
		t.Fatalf("gantry-runtime run: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
	}
	want := "nvidia-uvm nvidia-uvm-tools nvidia2 nvidiactl"
	if got := strings.Join(devNodes(out), " "); got != want {
		t.Errorf("device nodes %q, want %q", got, want)
	}
	var vis []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, request.EnvVisibleDevices+"=") {
			vis = append(vis, l)
		}
	}
	if len(vis) != 1 || vis[0] != request.EnvVisibleDevices+"="+uuid {
		t.Errorf("image env %q: container env has %q, want exactly %s=%s (what the kubelet allocated):\n%s", env, vis, request.EnvVisibleDevices, uuid, out)
	}
}
