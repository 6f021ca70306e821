package kubeletckpt

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// testdata/kubelet-v1.37.2.json was written by a real kubelet v1.37.2
// (test/cluster) for one pod: an init container with 1 GPU and containers
// a and b with 2 and 3, allocated by Gantry's device plugin (envvar
// strategy) on simulated GPUs.
const pod = "75463ae5-18b4-4611-8d69-002e103c9c78"

func TestReadRealCheckpoint(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile("testdata/kubelet-v1.37.2.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "device-plugins"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "device-plugins", File), data, 0o600); err != nil {
		t.Fatal(err)
	}
	cp, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	for ctr, n := range map[string]int{"init": 1, "a": 2, "b": 3} {
		es := cp.For(pod, ctr)
		if len(es) != 1 {
			t.Fatalf("container %s: %d entries, want 1", ctr, len(es))
		}
		e := es[0]
		if e.ResourceName != "nvidia.com/gpu" || len(e.DeviceIDs) != n {
			t.Errorf("container %s: %s %v, want %d nvidia.com/gpu IDs", ctr, e.ResourceName, e.DeviceIDs, n)
		}
		env := strings.Split(e.Env["NVIDIA_VISIBLE_DEVICES"], ",")
		ids := append([]string(nil), e.DeviceIDs...)
		sort.Strings(env)
		sort.Strings(ids)
		if !reflect.DeepEqual(env, ids) {
			t.Errorf("container %s: NVIDIA_VISIBLE_DEVICES %v, want the allocated IDs %v", ctr, env, ids)
		}
	}
	if es := cp.For(pod, "c"); len(es) != 0 {
		t.Errorf("a container the pod does not have: %v", es)
	}
	if es := cp.For("other-pod", "a"); len(es) != 0 {
		t.Errorf("another pod: %v", es)
	}
}

func TestMissingCheckpointIsEmpty(t *testing.T) {
	cp, err := Read(t.TempDir())
	if err != nil || len(cp.Entries) != 0 {
		t.Fatalf("Read(no file) = %v, %v; want empty, nil", cp, err)
	}
}

func TestRefusesNonRegularAndHuge(t *testing.T) {
	dir := t.TempDir()
	dp := filepath.Join(dir, "device-plugins")
	if err := os.MkdirAll(dp, 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "elsewhere.json")
	if err := os.WriteFile(target, []byte(`{"Data":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dp, File)); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir); err == nil {
		t.Error("a symlinked checkpoint was read")
	}
	if err := os.Remove(filepath.Join(dp, File)); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dp, File))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxSize + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := Read(dir); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("an oversized checkpoint: %v, want a size error", err)
	}
}

// The envs decoder against the kubelet API's own protobuf encoding, with
// every other field of the response set, so skipping them is exercised.
func TestAllocEnvMatchesProtobuf(t *testing.T) {
	resp := &pluginapi.ContainerAllocateResponse{
		Envs:        map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", "OTHER": "x=y", "EMPTY": ""},
		Mounts:      []*pluginapi.Mount{{ContainerPath: "/var/run/nvidia-container-devices/GPU-a", HostPath: "/dev/null", ReadOnly: true}},
		Devices:     []*pluginapi.DeviceSpec{{ContainerPath: "/dev/nvidia0", HostPath: "/dev/nvidia0", Permissions: "rw"}},
		Annotations: map[string]string{"cdi.k8s.io/gantry": "nvidia.com/gpu=GPU-a"},
		CdiDevices:  []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=GPU-a"}},
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	env, err := allocEnv(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(env, resp.Envs) {
		t.Errorf("allocEnv = %v, want %v", env, resp.Envs)
	}
	// A truncated response decodes to some of the envs or an error, and
	// never to a value that was not in the response.
	for i := range b {
		env, err := allocEnv(b[:i])
		if err != nil {
			continue
		}
		for k, v := range env {
			if resp.Envs[k] != v {
				t.Errorf("truncated at %d of %d bytes: %s=%q, not in the response", i, len(b), k, v)
			}
		}
	}
}

func FuzzParse(f *testing.F) {
	data, _ := os.ReadFile("testdata/kubelet-v1.37.2.json")
	f.Add(data)
	f.Add([]byte(`{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","DeviceIDs":["x"],"AllocResp":"CgA="}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		cp, err := Parse(b)
		if err == nil {
			_ = cp.For("p", "c")
		}
	})
}

// TestReadReusesAnUnchangedFile: a second read of the same file reuses the
// first parse (a GPU create reads it twice), and a file the kubelet
// replaced (a rename) is read afresh.
func TestReadReusesAnUnchangedFile(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile("testdata/kubelet-v1.37.2.json")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "device-plugins", File)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Error("an unchanged checkpoint was parsed again")
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(`{"Data":{"PodDeviceEntries":[],"RegisteredDevices":{}},"Checksum":0}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	c, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c == a || len(c.For(pod, "a")) != 0 {
		t.Errorf("the replaced checkpoint was not read afresh: %d entries for container a", len(c.For(pod, "a")))
	}
}
