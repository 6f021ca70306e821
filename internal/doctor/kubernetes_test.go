package doctor

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// fakeKubelet serves the kubelet's pod-resources API from fixed answers.
type fakeKubelet struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	pods        []*podresourcesv1.PodResources
	allocatable []*podresourcesv1.ContainerDevices
}

func (f *fakeKubelet) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	return &podresourcesv1.ListPodResourcesResponse{PodResources: f.pods}, nil
}

func (f *fakeKubelet) GetAllocatableResources(context.Context, *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	return &podresourcesv1.AllocatableResourcesResponse{Devices: f.allocatable}, nil
}

// listen makes a real unix socket at path, as a kubelet or plugin would.
func listen(t *testing.T, path string) net.Listener {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// kubeletNode is a temporary kubelet directory: kubelet.sock and, when
// plugin is set, another vendor's plugin answering on that socket in
// device-plugins, and f served on pod-resources/kubelet.sock when f is not nil.
func kubeletNode(t *testing.T, plugin string, f *fakeKubelet) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// Not in a pod, whatever runs the tests: the Node is not read.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	listen(t, filepath.Join(dir, "device-plugins/kubelet.sock"))
	if plugin != "" {
		serveNVIDIALike(t, filepath.Join(dir, "device-plugins", plugin))
	}
	if f != nil {
		l := listen(t, filepath.Join(dir, "pod-resources/kubelet.sock"))
		srv := grpc.NewServer()
		podresourcesv1.RegisterPodResourcesListerServer(srv, f)
		go srv.Serve(l)
		t.Cleanup(srv.Stop)
	}
	return dir
}

func gpus(resource string, ids ...string) []*podresourcesv1.ContainerDevices {
	return []*podresourcesv1.ContainerDevices{{ResourceName: resource, DeviceIds: ids}}
}

func pod(ns, name string, containers ...*podresourcesv1.ContainerResources) *podresourcesv1.PodResources {
	return &podresourcesv1.PodResources{Namespace: ns, Name: name, Containers: containers}
}

func ctr(name string, devs []*podresourcesv1.ContainerDevices) *podresourcesv1.ContainerResources {
	return &podresourcesv1.ContainerResources{Name: name, Devices: devs}
}

// node is a healthy node: 4 GPUs allocatable, a training pod holding two.
func node() *fakeKubelet {
	return &fakeKubelet{
		allocatable: append(gpus("nvidia.com/gpu", "GPU-0", "GPU-1", "GPU-2", "GPU-3"),
			&podresourcesv1.ContainerDevices{ResourceName: "example.com/nic", DeviceIds: []string{"eth1"}}),
		pods: []*podresourcesv1.PodResources{
			pod("ml", "train-0", ctr("trainer", gpus("nvidia.com/gpu", "GPU-1", "GPU-3")), ctr("sidecar", nil)),
			pod("web", "frontend", ctr("nginx", gpus("example.com/nic", "eth1"))),
		},
	}
}

func TestKubernetesRegisteredAndAllocatable(t *testing.T) {
	checks := checkKubernetes(Options{KubeletDir: kubeletNode(t, "nvidia-gpu.sock", node()), Pod: "ml/train-0"})
	expect(t, checks, CheckDevicePlugin, Pass, []string{"nvidia-gpu.sock (nvidia.com/gpu, not Gantry's plugin)"}, "")
	expect(t, checks, CheckAllocatable, Pass, []string{"nvidia.com/gpu: 4 allocatable, 2 in use"}, "")
	expect(t, checks, CheckPod, Pass, []string{"pod ml/train-0: container trainer: nvidia.com/gpu GPU-1,GPU-3"}, "")
	if len(checks) != 6 || Failed(checks) {
		t.Errorf("want six checks, none failed:\n%s", dump(checks))
	}
}

func TestKubernetesNoPluginSocket(t *testing.T) {
	dir := kubeletNode(t, "", node())
	// A regular file named like a socket is not a serving plugin.
	if err := os.WriteFile(filepath.Join(dir, "device-plugins/nvidia-gpu.sock"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	checks := checkKubernetes(Options{KubeletDir: dir, NodeName: "gpu-node-1"})
	expect(t, checks, CheckDevicePlugin, Fail, []string{"no device plugin socket next to kubelet.sock"},
		"kubectl -n kube-system get pods -l app.kubernetes.io/name=gantry --field-selector spec.nodeName=gpu-node-1 -o wide")
}

func TestKubernetesNoKubeletSocket(t *testing.T) {
	dir := kubeletNode(t, "nvidia-gpu.sock", node())
	if err := os.Remove(filepath.Join(dir, "device-plugins/kubelet.sock")); err != nil {
		t.Fatal(err)
	}
	expect(t, checkKubernetes(Options{KubeletDir: dir}), CheckDevicePlugin, Fail,
		[]string{"no kubelet.sock socket"}, "systemctl status kubelet")
}

func TestKubernetesNothingAllocatable(t *testing.T) {
	f := node()
	f.allocatable = f.allocatable[1:] // only the NIC
	checks := checkKubernetes(Options{KubeletDir: kubeletNode(t, "nvidia-gpu.sock", f), NodeName: "gpu-node-1"})
	expect(t, checks, CheckAllocatable, Fail, []string{"no allocatable nvidia.com/ devices"},
		"the device plugin is not running or not registered: kubectl -n kube-system get pods -l app.kubernetes.io/name=gantry --field-selector spec.nodeName=gpu-node-1 -o wide; see its logs: kubectl -n kube-system logs $(")
}

func TestKubernetesMIGAllocatable(t *testing.T) {
	f := &fakeKubelet{allocatable: append(gpus("nvidia.com/mig-1g.10gb", "MIG-a", "MIG-b"), gpus("nvidia.com/gpu", "GPU-0")...)}
	checks := checkKubernetes(Options{KubeletDir: kubeletNode(t, "nvidia-mig.sock", f)})
	expect(t, checks, CheckAllocatable, Pass,
		[]string{"nvidia.com/gpu: 1 allocatable, 0 in use; nvidia.com/mig-1g.10gb: 2 allocatable, 0 in use"}, "")
}

func TestKubernetesNoPodResourcesSocket(t *testing.T) {
	checks := checkKubernetes(Options{KubeletDir: kubeletNode(t, "nvidia-gpu.sock", nil), Pod: "ml/train-0"})
	expect(t, checks, CheckAllocatable, Fail, []string{"pod-resources/kubelet.sock"}, "is the kubelet running")
	expect(t, checks, CheckPod, Skip, []string{CheckAllocatable}, "")
}

func TestKubernetesUnimplementedAllocatable(t *testing.T) {
	dir := kubeletNode(t, "nvidia-gpu.sock", nil)
	l := listen(t, filepath.Join(dir, "pod-resources/kubelet.sock"))
	srv := grpc.NewServer()
	// An old kubelet: List only.
	podresourcesv1.RegisterPodResourcesListerServer(srv, &podresourcesv1.UnimplementedPodResourcesListerServer{})
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	expect(t, checkKubernetes(Options{KubeletDir: dir}), CheckAllocatable, Fail,
		[]string{"GetAllocatableResources"}, "KubeletPodResourcesGetAllocatable")
}

func TestPodHoldsNoGPU(t *testing.T) {
	checks := checkKubernetes(Options{KubeletDir: kubeletNode(t, "nvidia-gpu.sock", node()), Pod: "web/frontend"})
	expect(t, checks, CheckPod, Fail,
		[]string{"pod web/frontend holds no GPU (does its spec ask for nvidia.com/gpu in resources.limits?)"}, "resources.limits")
}

func TestPodNotFound(t *testing.T) {
	checks := checkKubernetes(Options{KubeletDir: kubeletNode(t, "nvidia-gpu.sock", node()), Pod: "ml/train-9"})
	expect(t, checks, CheckPod, Fail, []string{"pod ml/train-9 is not among the kubelet's pods"}, "kubectl get pod")
}

func TestNotAKubernetesNode(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "kubelet")
	checks := checkKubernetes(Options{KubeletDir: missing})
	for _, name := range []string{CheckDevicePlugin, CheckPluginHealth, CheckAllocatable, CheckCheckpoint, CheckNode} {
		expect(t, checks, name, Skip, []string{"not a Kubernetes node"}, "")
	}
	if len(checks) != 5 {
		t.Errorf("want five skipped checks:\n%s", dump(checks))
	}
	checks = checkKubernetes(Options{KubeletDir: missing, Pod: "ml/train-0"})
	expect(t, checks, CheckPod, Fail, []string{"ml/train-0", missing}, "run doctor on the node the pod runs on")
}
