package doctor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultKubeletDir is the kubelet's root directory.
const DefaultKubeletDir = "/var/lib/kubelet"

const (
	fixPluginNotRunning = "the device plugin is not running or not registered: kubectl -n kube-system get pods -l app=gantry-device-plugin; see its logs"
	fixPodResources     = "the kubelet serves pod-resources on this socket from Kubernetes 1.15 (GetAllocatableResources from 1.23, GA in 1.28): is the kubelet running (systemctl status kubelet), and is --kubelet-dir its root directory?"
	fixWrongNode        = "run doctor on the node the pod runs on (kubectl get pod -n NAMESPACE NAME -o wide), or point --kubelet-dir at the kubelet's root directory"
)

// gpuResource reports whether a kubelet resource name is one of NVIDIA's.
func gpuResource(name string) bool { return strings.HasPrefix(name, "nvidia.com/") }

// checkKubernetes runs the node checks when this host runs a kubelet, and
// the pod check when a pod was named.
func checkKubernetes(opts Options) []Check {
	if st, err := os.Stat(opts.KubeletDir); err != nil || !st.IsDir() {
		out := []Check{
			skip(CheckDevicePlugin, "not a Kubernetes node: no kubelet directory %s", opts.KubeletDir),
			skip(CheckAllocatable, "not a Kubernetes node: no kubelet directory %s", opts.KubeletDir),
		}
		if opts.Pod != "" {
			out = append(out, fail(CheckPod, fixWrongNode,
				"pod %s: no kubelet directory %s, so no pod runs here", opts.Pod, opts.KubeletDir))
		}
		return out
	}
	out := []Check{checkDevicePlugin(opts.KubeletDir)}

	socket := filepath.Join(opts.KubeletDir, "pod-resources", "kubelet.sock")
	client, closeConn, err := dialPodResources(socket)
	if err != nil {
		c := fail(CheckAllocatable, fixPodResources, "%v", err)
		out = append(out, c)
		if opts.Pod != "" {
			out = append(out, *after(CheckPod, c))
		}
		return out
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, listErr := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if listErr != nil {
		listErr = fmt.Errorf("pod-resources %s: List: %v", socket, status.Convert(listErr).Message())
	}
	out = append(out, checkAllocatable(ctx, client, socket, list, listErr))
	if opts.Pod != "" {
		out = append(out, checkPod(opts.Pod, list, listErr))
	}
	return out
}

// checkDevicePlugin looks for a device plugin's socket next to the
// kubelet's registration socket: a plugin serves its socket there and
// registers it through kubelet.sock.
func checkDevicePlugin(kubeletDir string) Check {
	dir := filepath.Join(kubeletDir, "device-plugins")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fail(CheckDevicePlugin,
			"is the kubelet running (systemctl status kubelet), and is --kubelet-dir its root directory?",
			"reading the kubelet's device plugin directory: %v", err)
	}
	var kubelet bool
	var plugins []string
	for _, e := range entries {
		if e.Type()&os.ModeSocket == 0 || !strings.HasSuffix(e.Name(), ".sock") {
			continue
		}
		if e.Name() == "kubelet.sock" {
			kubelet = true
		} else {
			plugins = append(plugins, e.Name())
		}
	}
	if !kubelet {
		return fail(CheckDevicePlugin,
			"the kubelet is not running or has the device plugin manager off: systemctl status kubelet; journalctl -u kubelet",
			"no kubelet.sock socket in %s: no device plugin can register", dir)
	}
	if len(plugins) == 0 {
		return fail(CheckDevicePlugin, fixPluginNotRunning,
			"no device plugin socket next to kubelet.sock in %s", dir)
	}
	return pass(CheckDevicePlugin, "plugin sockets in %s: %s", dir, strings.Join(plugins, ", "))
}

func dialPodResources(socket string) (podresourcesv1.PodResourcesListerClient, func(), error) {
	st, err := os.Stat(socket)
	if err != nil {
		return nil, nil, fmt.Errorf("the kubelet's pod-resources socket: %v", err)
	}
	if st.Mode()&os.ModeSocket == 0 {
		return nil, nil, fmt.Errorf("the kubelet's pod-resources socket %s is not a socket", socket)
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("pod-resources socket %s: %v", socket, err)
	}
	return podresourcesv1.NewPodResourcesListerClient(conn), func() { conn.Close() }, nil
}

// devKey is one device of one resource; device IDs are per resource.
type devKey struct{ resource, id string }

// checkAllocatable counts the NVIDIA devices the kubelet can hand out and
// those the pods on the node hold.
func checkAllocatable(ctx context.Context, client podresourcesv1.PodResourcesListerClient, socket string,
	list *podresourcesv1.ListPodResourcesResponse, listErr error) Check {
	alloc, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil {
		fix := fixPodResources
		if status.Code(err) == codes.Unimplemented {
			fix = "the kubelet predates GetAllocatableResources: upgrade it to 1.28 or later, or enable the KubeletPodResourcesGetAllocatable feature gate"
		}
		return fail(CheckAllocatable, fix, "pod-resources %s: GetAllocatableResources: %v", socket, status.Convert(err).Message())
	}
	allocatable := map[string]map[string]bool{}
	for _, d := range alloc.GetDevices() {
		if !gpuResource(d.GetResourceName()) {
			continue
		}
		if allocatable[d.GetResourceName()] == nil {
			allocatable[d.GetResourceName()] = map[string]bool{}
		}
		for _, id := range d.GetDeviceIds() {
			allocatable[d.GetResourceName()][id] = true
		}
	}
	if len(allocatable) == 0 {
		return fail(CheckAllocatable, fixPluginNotRunning,
			"the kubelet lists no allocatable nvidia.com/ devices (pod-resources %s)", socket)
	}
	inUse := map[devKey]bool{}
	for _, pod := range list.GetPodResources() {
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDevices() {
				for _, id := range d.GetDeviceIds() {
					inUse[devKey{d.GetResourceName(), id}] = true
				}
			}
		}
	}
	var names []string
	for name := range allocatable {
		names = append(names, name)
	}
	sort.Strings(names)
	var parts []string
	for _, name := range names {
		used := 0
		for id := range allocatable[name] {
			if inUse[devKey{name, id}] {
				used++
			}
		}
		in := fmt.Sprintf("%d in use", used)
		if listErr != nil {
			in = "in use unknown"
		}
		parts = append(parts, fmt.Sprintf("%s: %d allocatable, %s", name, len(allocatable[name]), in))
	}
	ev := strings.Join(parts, "; ")
	if listErr != nil {
		ev += " (" + listErr.Error() + ")"
	}
	return pass(CheckAllocatable, "%s", ev)
}

// checkPod reports the NVIDIA devices a pod's containers hold.
func checkPod(pod string, list *podresourcesv1.ListPodResourcesResponse, listErr error) Check {
	if listErr != nil {
		return fail(CheckPod, fixPodResources, "pod %s: %v", pod, listErr)
	}
	ns, name, _ := strings.Cut(pod, "/")
	for _, p := range list.GetPodResources() {
		if p.GetNamespace() != ns || p.GetName() != name {
			continue
		}
		var held []string
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if gpuResource(d.GetResourceName()) && len(d.GetDeviceIds()) > 0 {
					held = append(held, fmt.Sprintf("container %s: %s %s",
						c.GetName(), d.GetResourceName(), strings.Join(d.GetDeviceIds(), ",")))
				}
			}
		}
		if len(held) == 0 {
			return fail(CheckPod,
				"give its containers resources.limits nvidia.com/gpu: N (or a MIG resource) and recreate the pod",
				"pod %s holds no GPU (does its spec ask for nvidia.com/gpu in resources.limits?)", pod)
		}
		return pass(CheckPod, "pod %s: %s", pod, strings.Join(held, "; "))
	}
	return fail(CheckPod, fixWrongNode,
		"pod %s is not among the kubelet's pods on this node (it does not exist, is not running, or runs on another node)", pod)
}
