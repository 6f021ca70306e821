package doctor

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultKubeletDir is the kubelet's root directory.
const DefaultKubeletDir = "/var/lib/kubelet"

// gpuResource reports whether a kubelet resource name is one of NVIDIA's.
func gpuResource(name string) bool { return strings.HasPrefix(name, "nvidia.com/") }

// nodeHints names this node in the commands fixes suggest. The plugin's
// pods are those of deployments/ (namespace kube-system, label
// app.kubernetes.io/name=gantry).
type nodeHints struct{ node string }

func hintsFor(opts Options) nodeHints {
	n := opts.NodeName
	if n == "" {
		n = os.Getenv("NODE_NAME")
	}
	if n == "" {
		// The kubelet names its Node after the host unless told otherwise.
		if h, err := os.Hostname(); err == nil {
			n, _, _ = strings.Cut(strings.ToLower(h), ".")
		}
	}
	if n == "" {
		n = "NODE"
	}
	return nodeHints{n}
}

// fix renders a documented fix naming this node.
func (h nodeHints) fix(doc string) string { return fix(doc, "NODE", h.node) }

// kubeState is what the node's kubelet and its plugins answered.
type kubeState struct {
	hints      nodeHints
	dir        string // device-plugins
	socketsErr error
	kubelet    bool // kubelet.sock exists
	endpoints  []*pluginEndpoint

	podResources string // the socket
	prErr        error  // dialling pod-resources failed
	list         *podresourcesv1.ListPodResourcesResponse
	listErr      error
	alloc        *podresourcesv1.AllocatableResourcesResponse
	allocErr     error

	checkpoint    *kubeletCheckpoint
	checkpointErr error
}

// relevantEndpoints are the endpoints doctor reports on.
func (s *kubeState) relevantEndpoints() []*pluginEndpoint {
	var out []*pluginEndpoint
	for _, e := range s.endpoints {
		if e.relevant() {
			out = append(out, e)
		}
	}
	return out
}

// listed are the Gantry endpoints that answered ListAndWatch, by resource.
func (s *kubeState) listed() map[string]*pluginEndpoint {
	m := map[string]*pluginEndpoint{}
	for _, e := range s.endpoints {
		if e.listed && e.resource != "" {
			m[e.resource] = e
		}
	}
	return m
}

// holders says which containers hold each device: by name from the
// pod-resources API, else by pod UID from the checkpoint.
func (s *kubeState) holders() map[devKey][]holder {
	m := map[devKey][]holder{}
	if s.listErr == nil && s.list != nil {
		for _, p := range s.list.GetPodResources() {
			for _, c := range p.GetContainers() {
				for _, d := range c.GetDevices() {
					for _, id := range d.GetDeviceIds() {
						k := devKey{d.GetResourceName(), id}
						m[k] = append(m[k], holder{p.GetNamespace() + "/" + p.GetName(), c.GetName()})
					}
				}
			}
		}
		return m
	}
	if s.checkpoint != nil {
		return s.checkpoint.held
	}
	return m
}

// checkDevicePlugin checks that a device plugin serves a socket next to
// the kubelet's registration socket and that each one named as NVIDIA's
// (or identifying as Gantry's) answers as the kubelet asks it.
func checkDevicePlugin(s *kubeState) Check {
	if s.socketsErr != nil {
		return fail(CheckDevicePlugin, fix(fixKubeletDir),
			"reading the kubelet's device plugin directory: %v", s.socketsErr)
	}
	if !s.kubelet {
		return fail(CheckDevicePlugin, fix(fixNoKubeletSock),
			"no kubelet.sock socket in %s: no device plugin can register", s.dir)
	}
	if len(s.endpoints) == 0 {
		return fail(CheckDevicePlugin, s.hints.fix(fixPluginNotRunning),
			"no device plugin socket next to kubelet.sock in %s", s.dir)
	}
	var ok, bad, other []string
	stale := false
	for _, e := range s.endpoints {
		switch {
		case !e.relevant() && e.err == nil:
			other = append(other, e.socket)
		case !e.relevant():
			other = append(other, e.socket+" (does not answer)")
		case e.err != nil:
			bad = append(bad, fmt.Sprintf("%s: %v", e.path, e.err))
			stale = stale || e.stale
		default:
			who := "not Gantry's plugin"
			if e.gantry {
				who = "gantry-device-plugin"
			}
			res := e.resource
			if res == "" {
				res = "resource unknown"
			}
			ok = append(ok, fmt.Sprintf("%s (%s, %s)", e.socket, res, who))
		}
	}
	ev := ""
	if len(ok) > 0 {
		ev = "answering: " + strings.Join(ok, ", ")
	}
	if len(other) > 0 {
		ev = join(ev, "other vendors' plugins, not checked: "+strings.Join(other, ", "))
	}
	if len(bad) > 0 {
		fix := s.hints.fix(fixPluginStale)
		if !stale {
			fix = s.hints.fix(fixPluginHung)
		}
		what := "stale registration"
		if !stale {
			what = "plugin not answering"
		}
		return fail(CheckDevicePlugin, fix, "%s: %s%s", what, strings.Join(bad, "; "), semi(ev))
	}
	if len(ok) == 0 {
		return fail(CheckDevicePlugin, s.hints.fix(fixPluginNotRunning), "no NVIDIA device plugin socket next to kubelet.sock in %s (%s)", s.dir, ev)
	}
	return pass(CheckDevicePlugin, "%s in %s", ev, s.dir)
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func semi(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// checkPluginHealth reports each resource's devices as the plugin's first
// ListAndWatch answer gives them, the list the kubelet acts on.
func checkPluginHealth(s *kubeState, registration Check) Check {
	var answering []*pluginEndpoint
	for _, e := range s.relevantEndpoints() {
		if e.err == nil {
			answering = append(answering, e)
		}
	}
	if len(answering) == 0 {
		return *after(CheckPluginHealth, registration)
	}
	holders := s.holders()
	var parts, bad []string
	foreign := 0
	for _, e := range answering {
		if !e.gantry {
			foreign++
			parts = append(parts, fmt.Sprintf("%s: not read (not Gantry's plugin: its ListAndWatch hands each health change to one stream only, so a stream opened here could take one from the kubelet; see %s)", e.socket, CheckNode))
			continue
		}
		unhealthy := e.unhealthy()
		p := fmt.Sprintf("%s: %d devices, %d healthy", e.resource, len(e.devices), len(e.devices)-len(unhealthy))
		if len(unhealthy) > 0 {
			var ids []string
			for _, id := range unhealthy {
				d := id
				if hs := holders[devKey{e.resource, id}]; len(hs) > 0 {
					var names []string
					for _, h := range hs {
						names = append(names, h.String())
					}
					d += " (held by " + strings.Join(names, ", ") + ")"
				}
				ids = append(ids, d)
			}
			p += "; unhealthy: " + strings.Join(ids, ", ")
			bad = append(bad, p)
		}
		parts = append(parts, p)
	}
	if len(bad) > 0 {
		return fail(CheckPluginHealth, s.hints.fix(fixUnhealthy), "%s", strings.Join(parts, "; "))
	}
	if foreign == len(answering) {
		return skip(CheckPluginHealth, "%s", strings.Join(parts, "; "))
	}
	return pass(CheckPluginHealth, "%s", strings.Join(parts, "; "))
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
// those the pods on the node hold, and compares them with what Gantry's
// plugin advertises: the kubelet offers exactly the healthy devices of a
// registered plugin (capacity is all of them, allocatable the healthy ones).
func checkAllocatable(s *kubeState) Check {
	if s.prErr != nil {
		return fail(CheckAllocatable, fix(fixPodResources), "%v", s.prErr)
	}
	if s.allocErr != nil {
		f := fix(fixPodResources)
		if status.Code(s.allocErr) == codes.Unimplemented {
			f = fix(fixNoAllocatable)
		}
		return fail(CheckAllocatable, f, "pod-resources %s: GetAllocatableResources: %v", s.podResources, status.Convert(s.allocErr).Message())
	}
	allocatable := map[string]map[string]bool{}
	for _, d := range s.alloc.GetDevices() {
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
	listed := s.listed()

	// What the kubelet should offer, from the plugin's own list.
	var problems []string
	notRegistered := false
	for _, res := range slices.Sorted(maps.Keys(listed)) {
		e := listed[res]
		healthy := e.healthyIDs()
		var missing, stale []string
		for id := range healthy {
			if !allocatable[res][id] {
				missing = append(missing, id)
			}
		}
		for _, id := range e.unhealthy() {
			if allocatable[res][id] {
				stale = append(stale, id)
			}
		}
		sort.Strings(missing)
		sort.Strings(stale)
		switch {
		case len(healthy) > 0 && len(allocatable[res]) == 0:
			notRegistered = true
			problems = append(problems, fmt.Sprintf("the plugin on %s advertises %d healthy %s devices but the kubelet offers none: the plugin is not registered with this kubelet", e.socket, len(healthy), res))
		case len(missing) > 0:
			notRegistered = true
			problems = append(problems, fmt.Sprintf("the kubelet does not offer %s %s that the plugin on %s advertises healthy: the kubelet has not got the plugin's current list", res, formatIDs(missing), e.socket))
		}
		if len(stale) > 0 {
			problems = append(problems, fmt.Sprintf("the kubelet still offers %s %s that the plugin reports unhealthy: its stream from the plugin is behind or broken (kubelets before 1.23 listed unhealthy devices here too)", res, formatIDs(stale)))
		}
	}
	if len(problems) > 0 {
		fix := s.hints.fix(fixReregister)
		if !notRegistered {
			fix = s.hints.fix(fixKubeletBehind)
		}
		return fail(CheckAllocatable, fix, "%s (pod-resources %s)", strings.Join(problems, "; "), s.podResources)
	}
	if len(allocatable) == 0 {
		fix := s.hints.fix(fixPluginNotRunning)
		for _, e := range listed {
			if len(e.devices) > 0 && len(e.healthyIDs()) == 0 {
				fix = s.hints.fix(fixAllUnhealthy)
			}
		}
		return fail(CheckAllocatable, fix,
			"the kubelet lists no allocatable nvidia.com/ devices (pod-resources %s)", s.podResources)
	}
	inUse := map[devKey]bool{}
	for _, pod := range s.list.GetPodResources() {
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDevices() {
				for _, id := range d.GetDeviceIds() {
					inUse[devKey{d.GetResourceName(), id}] = true
				}
			}
		}
	}
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(allocatable)) {
		used := 0
		for id := range allocatable[name] {
			if inUse[devKey{name, id}] {
				used++
			}
		}
		in := fmt.Sprintf("%d in use", used)
		if s.listErr != nil {
			in = "in use unknown"
		}
		p := fmt.Sprintf("%s: %d allocatable, %s", name, len(allocatable[name]), in)
		if e := listed[name]; e != nil {
			p += fmt.Sprintf(" (the plugin advertises %d, %d healthy)", len(e.devices), len(e.healthyIDs()))
		}
		parts = append(parts, p)
	}
	ev := strings.Join(parts, "; ")
	if s.listErr != nil {
		ev += " (" + s.listErr.Error() + ")"
	}
	return pass(CheckAllocatable, "%s", ev)
}

// formatIDs lists device IDs, the replicas of a time-sliced GPU
// (UUID::0, UUID::1, ...) as one entry with their count.
func formatIDs(ids []string) string {
	count := map[string]int{}
	var order []string
	for _, id := range ids {
		base, _, replica := strings.Cut(id, "::")
		if _, ok := count[base]; !ok {
			order = append(order, base)
			count[base] = 0
		}
		if replica {
			count[base]++
		}
	}
	out := make([]string, len(order))
	for i, base := range order {
		out[i] = base
		if count[base] > 0 {
			out[i] = fmt.Sprintf("%s (%d replicas)", base, count[base])
		}
	}
	return strings.Join(out, ", ")
}

// checkCheckpoint reads the kubelet's device checkpoint: the devices it
// last registered and those it gave to pods' containers, which it keeps
// across restarts. A container holding a device the plugin no longer
// advertises runs on a device that is gone.
func checkCheckpoint(s *kubeState) Check {
	if s.checkpointErr != nil {
		return fail(CheckCheckpoint, fix(fixCheckpoint),
			"%v", s.checkpointErr)
	}
	cp := s.checkpoint
	if cp == nil {
		return skip(CheckCheckpoint, "no %s in %s: the kubelet has not written one (it does on start and on each allocation)", checkpointFile, s.dir)
	}
	var parts []string
	for _, res := range slices.Sorted(maps.Keys(cp.registered)) {
		if gpuResource(res) {
			parts = append(parts, fmt.Sprintf("%s: %d registered", res, len(cp.registered[res])))
		}
	}
	heldBy := map[string]int{}
	var gone []string
	listed := s.listed()
	keys := slices.SortedFunc(maps.Keys(cp.held), func(a, b devKey) int {
		return strings.Compare(a.resource+"\x00"+a.id, b.resource+"\x00"+b.id)
	})
	for _, k := range keys {
		if !gpuResource(k.resource) {
			continue
		}
		heldBy[k.resource]++
		if e := listed[k.resource]; e != nil && !slices.ContainsFunc(e.devices, func(d *pluginapi.Device) bool { return d.GetID() == k.id }) {
			var hs []string
			for _, h := range cp.held[k] {
				hs = append(hs, h.String())
			}
			gone = append(gone, fmt.Sprintf("%s %s (%s)", k.resource, k.id, strings.Join(hs, ", ")))
		}
	}
	for _, res := range slices.Sorted(maps.Keys(heldBy)) {
		parts = append(parts, fmt.Sprintf("%s: %d held by pods", res, heldBy[res]))
	}
	if len(parts) == 0 {
		parts = append(parts, "no nvidia.com/ devices registered or held")
	}
	if len(gone) > 0 {
		return fail(CheckCheckpoint, fix(fixCheckpointGone),
			"pods hold devices the plugin no longer advertises: %s (%s)", strings.Join(gone, "; "), cp.path)
	}
	return pass(CheckCheckpoint, "%s (%s)", strings.Join(parts, "; "), cp.path)
}

// checkNode compares the Node's status, what the scheduler sees, with the
// plugins: capacity counts every device, allocatable the healthy ones.
func checkNode(opts Options, s *kubeState) Check {
	a, err := resolveAPI(opts)
	if err != nil {
		return skip(CheckNode, "%v", err)
	}
	n, err := getNode(a)
	if err != nil {
		// Reaching the API server is not part of the GPU chain: never a failure.
		return skip(CheckNode, "not checked: %v", err)
	}
	listed := s.listed()
	names := map[string]bool{}
	for r := range n.capacity {
		names[r] = true
	}
	for r := range listed {
		names[r] = true
	}
	if len(names) == 0 {
		return fail(CheckNode, s.hints.fix(fixPluginNotRunning),
			"node %s advertises no nvidia.com/ resource (status.capacity): the scheduler sees no GPU here", n.name)
	}
	var parts, problems []string
	short := false
	for _, r := range slices.Sorted(maps.Keys(names)) {
		capacity, alloc := n.capacity[r], n.allocatable[r]
		p := fmt.Sprintf("%s capacity %d, allocatable %d", r, capacity, alloc)
		e := listed[r]
		if e != nil && int64(len(e.devices)) != capacity {
			problems = append(problems, fmt.Sprintf("%s: the Node's capacity is %d but the plugin advertises %d devices (the kubelet updates the Node every few seconds; if this persists the plugin is not registered with it)", r, capacity, len(e.devices)))
		}
		if alloc < capacity {
			short = true
			why := ""
			if e != nil {
				if u := e.unhealthy(); len(u) > 0 {
					why = ": unhealthy " + formatIDs(u)
				}
			}
			p += fmt.Sprintf(" (%d not allocatable%s)", capacity-alloc, why)
			problems = append(problems, fmt.Sprintf("%s: allocatable %d < capacity %d%s", r, alloc, capacity, why))
		}
		parts = append(parts, p)
	}
	who := n.server
	if n.kubelet != "" {
		who += ", kubelet " + n.kubelet
	}
	ev := fmt.Sprintf("node %s (%s): %s", n.name, who, strings.Join(parts, "; "))
	if len(problems) > 0 {
		fix := s.hints.fix(fixReregister)
		if short {
			fix = s.hints.fix(fixNodeUnhealthy)
		}
		return fail(CheckNode, fix, "%s; %s", ev, strings.Join(problems, "; "))
	}
	return pass(CheckNode, "%s", ev)
}

// checkPod reports the NVIDIA devices a pod's containers hold.
func checkPod(pod string, list *podresourcesv1.ListPodResourcesResponse, listErr error) Check {
	if listErr != nil {
		return fail(CheckPod, fix(fixPodResources), "pod %s: %v", pod, listErr)
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
			return fail(CheckPod, fix(fixPodNoGPU),
				"pod %s holds no GPU (does its spec ask for nvidia.com/gpu in resources.limits?)", pod)
		}
		return pass(CheckPod, "pod %s: %s", pod, strings.Join(held, "; "))
	}
	return fail(CheckPod, fix(fixWrongNode),
		"pod %s is not among the kubelet's pods on this node (it does not exist, is not running, or runs on another node)", pod)
}
