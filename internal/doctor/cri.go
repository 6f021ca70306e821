package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
)

// DefaultCRISockets are the CRI runtime service sockets tried, in order,
// when --cri-socket is not given: containerd's, then CRI-O's.
var DefaultCRISockets = []string{"/run/containerd/containerd.sock", "/run/crio/crio.sock"}

// The labels the kubelet puts on every pod sandbox it asks a CRI runtime for.
const (
	labelPodNamespace = "io.kubernetes.pod.namespace"
	labelPodName      = "io.kubernetes.pod.name"
)

// k8sNamespace is the containerd namespace of containers made through CRI.
const k8sNamespace = "k8s.io"

// checkPodContainers finds the pod's containers through the CRI runtime
// service and examines each like --container does: its request, what was
// injected, and its device cgroup, with the devices the kubelet assigned.
func checkPodContainers(opts Options) []Check {
	podNS, podName, _ := strings.Cut(opts.Pod, "/")
	socket := opts.CRISocket
	if socket == "" {
		for _, s := range opts.CRISockets {
			if st, err := os.Stat(s); err == nil && st.Mode()&os.ModeSocket != 0 {
				socket = s
				break
			}
		}
		if socket == "" {
			return []Check{fail(CheckPodContainers, fix(fixCRISocket),
				"pod %s: no CRI socket to ask: none of %s exists", opts.Pod, strings.Join(opts.CRISockets, ", "))}
		}
	}
	if st, err := os.Stat(socket); err != nil {
		return []Check{fail(CheckPodContainers, fix(fixCRISocket), "pod %s: CRI socket: %v", opts.Pod, err)}
	} else if st.Mode()&os.ModeSocket == 0 {
		return []Check{fail(CheckPodContainers, fix(fixCRISocket), "pod %s: CRI socket %s is not a socket", opts.Pod, socket)}
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return []Check{fail(CheckPodContainers, fix(fixCRISocket), "pod %s: CRI socket %s: %v", opts.Pod, socket, err)}
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	ver, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return []Check{fail(CheckPodContainers, fix(fixCRISocket),
			"pod %s: the CRI runtime service at %s does not answer: %s", opts.Pod, socket, status.Convert(err).Message())}
	}
	engine := fmt.Sprintf("%s %s at %s", ver.GetRuntimeName(), ver.GetRuntimeVersion(), socket)
	sbs, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{labelPodNamespace: podNS, labelPodName: podName},
	}})
	if err != nil {
		return []Check{fail(CheckPodContainers, fix(fixCRISocket), "pod %s: %s: ListPodSandbox: %s", opts.Pod, engine, status.Convert(err).Message())}
	}
	sandboxes := sbs.GetItems()
	var ready []*runtimeapi.PodSandbox
	for _, sb := range sandboxes {
		if sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
			ready = append(ready, sb)
		}
	}
	if len(ready) > 0 {
		sandboxes = ready // older, stopped sandboxes of the same pod are history
	}
	if len(sandboxes) == 0 {
		return []Check{fail(CheckPodContainers, fix(fixNoSandbox, "NAMESPACE", podNS, "NAME", podName),
			"pod %s: %s has no pod sandbox labelled %s=%s, %s=%s: the pod does not run on this node",
			opts.Pod, engine, labelPodNamespace, podNS, labelPodName, podName)}
	}

	assigned := kubeletAssignments(opts, podNS, podName)
	var out, perContainer []Check
	var listed []string
	for _, sb := range sandboxes {
		cs, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb.GetId()}})
		if err != nil {
			return []Check{fail(CheckPodContainers, fix(fixCRISocket), "pod %s: %s: ListContainers of sandbox %s: %s",
				opts.Pod, engine, shortID(sb.GetId()), status.Convert(err).Message())}
		}
		containers := cs.GetContainers()
		sort.Slice(containers, func(i, j int) bool {
			return containers[i].GetMetadata().GetName() < containers[j].GetMetadata().GetName()
		})
		var names []string
		for _, c := range containers {
			names = append(names, fmt.Sprintf("%s (%s, %s)", c.GetMetadata().GetName(), shortID(c.GetId()), stateWord(c.GetState())))
			perContainer = append(perContainer, checkCRIContainer(ctx, opts, rt, ver.GetRuntimeName(), podNS, podName, c, assigned)...)
		}
		listed = append(listed, fmt.Sprintf("sandbox %s (%s): %s", shortID(sb.GetId()), stateWord(sb.GetState()), listOrNone(names)))
	}
	if len(perContainer) == 0 {
		out = append(out, fail(CheckPodContainers, fix(fixNoContainers, "NAMESPACE", podNS, "NAME", podName),
			"pod %s on %s: %s: no containers", opts.Pod, engine, strings.Join(listed, "; ")))
		return out
	}
	out = append(out, pass(CheckPodContainers, "pod %s on %s: %s", opts.Pod, engine, strings.Join(listed, "; ")))
	return append(out, perContainer...)
}

// checkCRIContainer examines one container of the pod. The spec it reads
// is the one that ran when containerd keeps its task bundle in
// --containerd-state (after gantry-runtime's edits), else the spec the
// engine reports in its verbose status (before any runtime edits).
func checkCRIContainer(ctx context.Context, opts Options, rt runtimeapi.RuntimeServiceClient, engine, podNS, podName string,
	c *runtimeapi.Container, assigned map[string][]string) []Check {
	name := c.GetMetadata().GetName()
	who := fmt.Sprintf("pod %s/%s container %s (%s)", podNS, podName, name, shortID(c.GetId()))
	st, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId(), Verbose: true})
	if err != nil {
		r := fail(CheckContainer, fix(fixCRISocket), "%s: ContainerStatus: %s", who, status.Convert(err).Message())
		return []Check{r, *after(CheckContainerDevice, r)}
	}
	info := parseCRIInfo(st.GetInfo())
	running := st.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING && info.Pid > 0
	spec, request, binary := info.RuntimeSpec, (*specs.Spec)(nil), info.binary()
	source := "the spec " + engine + " reports (before runtime edits)"
	t, err := taskByID(opts.ContainerdState, k8sNamespace, c.GetId())
	if err != nil && info.Pid > 0 {
		// A containerd with a state directory of its own: its shim runs in
		// the pod's task bundle, a sibling of this container's.
		if state := stateFromShim(opts.Proc, info.Pid); state != "" {
			t, err = taskByID(state, k8sNamespace, c.GetId())
		}
	}
	if err == nil {
		spec, request, source = t.Spec, info.RuntimeSpec, "task bundle "+t.Bundle
		if t.Binary != "" {
			binary = t.Binary
		}
		if info.Pid == 0 {
			info.Pid = t.Pid
			running = running || t.running(opts.Proc)
		}
	}
	if spec == nil {
		r := fail(CheckContainer, fix(fixNoSpec),
			"%s: no OCI spec: no task bundle under %s and %s reports none in its verbose status", who, filepath.Join(opts.ContainerdState, taskDirName, k8sNamespace), engine)
		return []Check{r, *after(CheckContainerDevice, r)}
	}
	note := ", " + source
	if devs := assigned[name]; len(devs) > 0 {
		note += ", the kubelet assigned " + strings.Join(devs, "; ")
	}
	if !running {
		who += " (" + stateWord(st.GetStatus().GetState()) + ")"
	}
	fx := containerFixes{restart: fix(fixRestartPod, "NAMESPACE", podNS, "NAME", podName), recur: fix(fixRecurSpec)}
	return checkSpecAndAccess(opts, who, spec, request, note, binary, info.Pid, running, fx)
}

// criInfo is what the verbose ContainerStatus's "info" JSON says (the
// same keys on containerd and CRI-O).
type criInfo struct {
	Pid            int         `json:"pid"`
	RuntimeSpec    *specs.Spec `json:"runtimeSpec"`
	RuntimeOptions struct {
		BinaryName  string `json:"binary_name"`
		BinaryName2 string `json:"BinaryName"`
	} `json:"runtimeOptions"`
}

func (i criInfo) binary() string { return i.RuntimeOptions.BinaryName + i.RuntimeOptions.BinaryName2 }

func parseCRIInfo(m map[string]string) criInfo {
	var i criInfo
	if s := m["info"]; s != "" {
		_ = json.Unmarshal([]byte(s), &i)
	}
	return i
}

// kubeletAssignments returns, per container name, the nvidia.com/ devices
// the kubelet's pod-resources API says the pod's containers hold; nil when
// this is not a Kubernetes node or the kubelet does not answer (the pod
// devices check reports that).
func kubeletAssignments(opts Options, podNS, podName string) map[string][]string {
	socket := filepath.Join(opts.KubeletDir, "pod-resources", "kubelet.sock")
	if _, err := os.Stat(socket); err != nil {
		return nil
	}
	client, closeConn, err := dialPodResources(socket)
	if err != nil {
		return nil
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil
	}
	out := map[string][]string{}
	for _, p := range list.GetPodResources() {
		if p.GetNamespace() != podNS || p.GetName() != podName {
			continue
		}
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if gpuResource(d.GetResourceName()) && len(d.GetDeviceIds()) > 0 {
					out[c.GetName()] = append(out[c.GetName()], d.GetResourceName()+" "+strings.Join(d.GetDeviceIds(), ","))
				}
			}
		}
	}
	return out
}

// shortID is the 13-character prefix crictl shows.
func shortID(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}

// stateWord turns CONTAINER_RUNNING or SANDBOX_READY into "running", "ready".
func stateWord(s fmt.Stringer) string {
	w := s.String()
	if _, after, ok := strings.Cut(w, "_"); ok {
		w = after
	}
	return strings.ToLower(w)
}

// stateFromShim is containerd's state directory, found from the working
// directory of the shim that is the parent of a container's process:
// STATE/io.containerd.runtime.v2.task/NAMESPACE/ID. "" when that is not so.
func stateFromShim(proc string, pid int) string {
	stat, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 2 {
		return ""
	}
	cwd, err := os.Readlink(filepath.Join(proc, fields[1], "cwd"))
	if err != nil {
		return ""
	}
	ns := filepath.Dir(cwd)
	if filepath.Base(filepath.Dir(ns)) != taskDirName {
		return ""
	}
	return filepath.Dir(filepath.Dir(ns))
}

// containerdDirs are a running containerd's state and root directories,
// as its CRI service reports them.
type containerdDirs struct{ State, Root string }

// errNotContainerd: the CRI service answered, but not as containerd's
// (CRI-O's).
var errNotContainerd = errors.New("another CRI runtime")

// liveContainerdRuntimes asks a containerd's CRI service (socket, or the
// first of candidates that is a socket) for its running
// configuration (Status, verbose: the "config" info, containerd only) and
// lists the runtimes it registers, with their BinaryName (runc when unset).
//
// dirs, when not nil, gets containerd's state and root directories from
// the same answer ("" when it names none).
func liveContainerdRuntimes(socket string, candidates []string, dirs *containerdDirs) ([]registered, string, error) {
	if socket == "" {
		for _, s := range candidates {
			if st, err := os.Stat(s); err == nil && st.Mode()&os.ModeSocket != 0 {
				socket = s
				break
			}
		}
	}
	if st, err := os.Stat(socket); err != nil || st.Mode()&os.ModeSocket == 0 {
		return nil, socket, fmt.Errorf("no CRI socket")
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, socket, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := runtimeapi.NewRuntimeServiceClient(conn).Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return nil, socket, err
	}
	reg, err := engineconfig.ParseContainerdStatus([]byte(st.GetInfo()["config"]))
	if err == nil && dirs != nil {
		*dirs = containerdDirs{State: containerdStateDir(st.GetInfo()["config"]), Root: reg.Root}
	}
	if err != nil {
		return nil, socket, fmt.Errorf("%s is not containerd's CRI service (%v): %w", socket, err, errNotContainerd)
	}
	return reg.Runtimes, socket, nil
}
