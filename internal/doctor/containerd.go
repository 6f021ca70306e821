package doctor

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/edits"
)

// DefaultContainerdState is containerd's state directory (its config's
// `state`); the runtime v2 shims keep one bundle per task under
// io.containerd.runtime.v2.task/NAMESPACE/ID there.
const DefaultContainerdState = "/run/containerd"

// taskDirName is the runtime v2 task directory under the state directory.
const taskDirName = "io.containerd.runtime.v2.task"

// task is one containerd runtime v2 task, read from its bundle directory:
// config.json is the OCI spec the runtime was given to create the
// container, after gantry-runtime (as its runc binary) edited it.
type task struct {
	Namespace, ID, Bundle string
	// Pid is the container's init process (init.pid), 0 when not written.
	Pid  int
	Spec *specs.Spec
	// Binary is the runc binary the shim was told to run
	// (options.json's BinaryName, from a runtime entry or ctr run
	// --runc-binary); empty means plain runc.
	Binary string
}

// findTask finds the task id (or a unique prefix of one) in namespace, or
// in every namespace when namespace is "".
func findTask(state, namespace, id string) (*task, error) {
	root := filepath.Join(state, taskDirName)
	var namespaces []string
	if namespace != "" {
		namespaces = []string{namespace}
	} else {
		entries, err := os.ReadDir(root)
		if err != nil {
			return nil, fmt.Errorf("no containerd task %s: %v", id, err)
		}
		for _, e := range entries {
			if e.IsDir() {
				namespaces = append(namespaces, e.Name())
			}
		}
	}
	var matches []string // NAMESPACE/ID
	for _, ns := range namespaces {
		if _, err := os.Stat(filepath.Join(root, ns, id, "config.json")); err == nil {
			matches = []string{ns + "/" + id}
			break
		}
		entries, _ := os.ReadDir(filepath.Join(root, ns))
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), id) {
				matches = append(matches, ns+"/"+e.Name())
			}
		}
	}
	where := filepath.Join(root, "*")
	if namespace != "" {
		where = filepath.Join(root, namespace)
	}
	switch {
	case id == "" || len(matches) == 0:
		return nil, fmt.Errorf("no containerd task %q in %s", id, where)
	case len(matches) > 1:
		sort.Strings(matches)
		return nil, fmt.Errorf("containerd task %q is ambiguous in %s: %s (give more of the ID, or --namespace)", id, where, strings.Join(matches, ", "))
	}
	ns, full, _ := strings.Cut(matches[0], "/")
	return readTask(filepath.Join(root, ns, full), ns, full)
}

// readTask reads one bundle directory.
func readTask(bundle, namespace, id string) (*task, error) {
	t := &task{Namespace: namespace, ID: id, Bundle: bundle}
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("containerd task %s/%s: %v", namespace, id, err)
	}
	if err := json.Unmarshal(b, &t.Spec); err != nil || t.Spec == nil {
		return nil, fmt.Errorf("containerd task %s/%s: %s is not an OCI spec: %v", namespace, id, filepath.Join(bundle, "config.json"), err)
	}
	if b, err := os.ReadFile(filepath.Join(bundle, "init.pid")); err == nil {
		t.Pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if b, err := os.ReadFile(filepath.Join(bundle, "options.json")); err == nil {
		var o struct {
			BinaryName  string `json:"BinaryName"`
			BinaryName2 string `json:"binary_name"`
		}
		if json.Unmarshal(b, &o) == nil {
			t.Binary = o.BinaryName + o.BinaryName2
		}
	}
	return t, nil
}

// running reports whether the task's init process is alive.
func (t *task) running(proc string) bool {
	if t.Pid <= 0 {
		return false
	}
	_, err := os.Stat(filepath.Join(proc, strconv.Itoa(t.Pid)))
	return err == nil
}

// podOf returns the pod namespace, pod name and container name that a
// Kubernetes engine recorded in the spec's annotations (containerd's CRI
// plugin, or CRI-O's), or empty strings.
func podOf(s *specs.Spec) (ns, pod, container string) {
	a := s.Annotations
	first := func(keys ...string) string {
		for _, k := range keys {
			if v := a[k]; v != "" {
				return v
			}
		}
		return ""
	}
	return first("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace"),
		first("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"),
		first("io.kubernetes.cri.container-name", "io.kubernetes.container.name")
}

// specSummary is what an OCI spec asked for and what it got.
type specSummary struct {
	// Visible is NVIDIA_VISIBLE_DEVICES from process.env; HasVisible
	// tells "" from unset.
	Visible    string
	HasVisible bool
	Caps       string
	// CDI are the cdi.k8s.io/ annotations, "key=value".
	CDI []string
	// Devices are the /dev/nvidia* entries of linux.devices.
	Devices []string
	// DriverMounts counts mounts of driver files (sources under the driver
	// root, or named like NVIDIA's libraries, programs and firmware), the
	// driver tree's included.
	DriverMounts int
	// DriverTree is where the driver tree layout's one mount (a source
	// below runtime.driver-tree-dir) is in the container, "" without one.
	DriverTree string
	// AllowsCtl: linux.resources.devices lets the container read and write
	// 195:255 (the last matching rule decides, as runc applies them).
	AllowsCtl bool
	// Injected is gantry-runtime's mark (edits.InjectedAnnotation): the
	// devices it injected; empty when it did not inject.
	Injected string
}

// withRequest takes the request (env and CDI annotations) from another
// spec: the one the engine made, before the runtime's edits.
func (s specSummary) withRequest(r specSummary) specSummary {
	s.Visible, s.HasVisible, s.Caps, s.CDI = r.Visible, r.HasVisible, r.Caps, r.CDI
	return s
}

// asks reports whether the spec asks for GPUs.
func (s specSummary) asks() bool {
	return (s.HasVisible && visibleAsks(s.Visible)) || len(s.CDI) > 0
}

func summarizeSpec(spec *specs.Spec, cfg config.Config) specSummary {
	driverRoot := cfg.DriverRoot
	var s specSummary
	if spec.Process != nil {
		for _, e := range spec.Process.Env {
			k, v, _ := strings.Cut(e, "=")
			switch k {
			case "NVIDIA_VISIBLE_DEVICES":
				s.Visible, s.HasVisible = v, true
			case "NVIDIA_DRIVER_CAPABILITIES":
				s.Caps = v
			}
		}
	}
	for k, v := range spec.Annotations {
		if strings.HasPrefix(k, "cdi.k8s.io/") {
			s.CDI = append(s.CDI, k+"="+v)
		}
	}
	s.Injected = spec.Annotations[edits.InjectedAnnotation]
	sort.Strings(s.CDI)
	for _, m := range spec.Mounts {
		tree := under(cfg.Runtime.DriverTreeDir, m.Source)
		if tree {
			s.DriverTree = m.Destination
		}
		if tree || driverMount(m.Source, driverRoot) {
			s.DriverMounts++
		}
	}
	if spec.Linux != nil {
		for _, d := range spec.Linux.Devices {
			if strings.HasPrefix(d.Path, "/dev/nvidia") {
				s.Devices = append(s.Devices, d.Path)
			}
		}
		if spec.Linux.Resources != nil {
			s.AllowsCtl = ruleAllows(spec.Linux.Resources.Devices, 195, 255)
		}
	}
	return s
}

// under reports whether p is below the directory dir ("" and / hold
// nothing here).
func under(dir, p string) bool {
	if dir == "" || dir == "/" {
		return false
	}
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}

// driverMount reports whether a bind mount's source is a driver file.
func driverMount(source, driverRoot string) bool {
	if under(driverRoot, source) {
		return true
	}
	base := filepath.Base(source)
	return strings.Contains(source, "nvidia") || strings.HasPrefix(base, "libcuda") || strings.HasPrefix(base, "libnv")
}

// ruleAllows evaluates OCI device cgroup rules for read-write access to the
// character device major:minor; later rules override earlier ones.
func ruleAllows(rules []specs.LinuxDeviceCgroup, major, minor int64) bool {
	allowed := false
	for _, r := range rules {
		if r.Type != "" && r.Type != "a" && r.Type != "c" {
			continue
		}
		if r.Major != nil && *r.Major != -1 && *r.Major != major {
			continue
		}
		if r.Minor != nil && *r.Minor != -1 && *r.Minor != minor {
			continue
		}
		rw := r.Access == "" || (strings.Contains(r.Access, "r") && strings.Contains(r.Access, "w"))
		switch {
		case r.Allow && rw:
			allowed = true
		case !r.Allow && (r.Access == "" || strings.ContainsAny(r.Access, "rw")):
			allowed = false
		}
	}
	return allowed
}

// describe is the request and the injection, for the evidence.
func (s specSummary) describe() string {
	var what []string
	switch {
	case s.HasVisible && strings.EqualFold(s.Visible, "void") && len(s.Devices) > 0:
		// CDI specs end with NVIDIA_VISIBLE_DEVICES=void so that no injector
		// further down the chain acts again: the request was served.
		what = append(what, "NVIDIA_VISIBLE_DEVICES=void (as a CDI spec leaves it once its devices are injected)")
	case s.HasVisible:
		what = append(what, "NVIDIA_VISIBLE_DEVICES="+s.Visible)
	}
	if s.Caps != "" {
		what = append(what, "NVIDIA_DRIVER_CAPABILITIES="+s.Caps)
	}
	what = append(what, s.CDI...)
	if len(what) == 0 {
		what = append(what, "no GPU request (no NVIDIA_VISIBLE_DEVICES, no cdi.k8s.io/ annotation)")
	}
	injected := fmt.Sprintf("injected: %d device nodes", len(s.Devices))
	if s.Injected != "" {
		injected = fmt.Sprintf("injected by gantry-runtime (GPUs %s): %d device nodes", s.Injected, len(s.Devices))
	}
	if len(s.Devices) > 0 {
		injected += " (" + strings.Join(s.Devices, " ") + ")"
	}
	injected += fmt.Sprintf(", %d driver mounts", s.DriverMounts)
	if s.DriverTree != "" {
		injected += " (the driver tree at " + s.DriverTree + " one of them)"
	}
	return strings.Join(what, ", ") + "; " + injected
}

// checkTask examines a containerd task found in the state directory.
func checkTask(opts Options, t *task) []Check {
	who := fmt.Sprintf("containerd task %s/%s", t.Namespace, t.ID)
	podNS, pod, ctr := podOf(t.Spec)
	if pod != "" {
		who += fmt.Sprintf(" (pod %s/%s container %s)", podNS, pod, ctr)
	}
	return checkSpecAndAccess(opts, who, t.Spec, nil, "", t.Binary, t.Pid, t.running(opts.Proc), taskFixes(t, podNS, pod))
}

// taskFixes are the remedies for a containerd task: delete the pod when
// Kubernetes owns it, else restart the task with ctr.
func taskFixes(t *task, podNS, pod string) containerFixes {
	if pod != "" {
		return containerFixes{restart: fix(fixRestartPod, "NAMESPACE", podNS, "NAME", pod), recur: fix(fixRecurSpec)}
	}
	return containerFixes{restart: fix(fixRestartTask, "NS", t.Namespace, "ID", t.ID), recur: fix(fixRecurSpec)}
}

// checkSpecAndAccess reports the request and injection of an OCI spec
// that ran, then probes the device access of its process.
//
// request, when not nil, is the spec the engine made before the runtime
// edited it, which has the request as asked even where a CDI spec set
// NVIDIA_VISIBLE_DEVICES=void in the spec that ran. note is more evidence
// for the request check (where the spec came from, what the kubelet
// assigned).
func checkSpecAndAccess(opts Options, who string, spec, request *specs.Spec, note, binary string, pid int, running bool, fx containerFixes) []Check {
	s := summarizeSpec(spec, opts.Config)
	if request != nil {
		s = s.withRequest(summarizeSpec(request, opts.Config))
	}
	runtime := "runc binary " + binary
	if binary == "" {
		runtime = "runc binary runc (the shim's default)"
	}
	var req Check
	switch {
	case len(s.Devices) > 0:
		req = pass(CheckContainer, "%s%s: %s, %s", who, note, runtime, s.describe())
	case s.asks():
		req = fail(CheckContainer, fix(fixNoRuntime),
			"%s%s: %s, %s: it asks for GPUs but its spec has no /dev/nvidia* device: the runtime is not registered or runc was used directly, which ignores the request", who, note, runtime, s.describe())
	default:
		// No request: not a GPU container, so no device FAIL either.
		return []Check{
			info(CheckContainer, "%s%s: %s, %s: no GPU requested (to give it GPUs: NVIDIA_VISIBLE_DEVICES=all (Kubernetes: resources.limits nvidia.com/gpu) under gantry-runtime, or a CDI device)", who, note, runtime, s.describe()),
			info(CheckContainerDevice, "%s: not probed: no GPU requested", who),
		}
	}
	if !running {
		return []Check{req, skip(CheckContainerDevice, "%s is not running", who)}
	}
	specNote := ""
	if len(s.Devices) > 0 && !s.AllowsCtl {
		specNote = "; its spec's linux.resources.devices does not allow c 195:255 either, so the cgroup manager drops the rule each time it reapplies the container's configuration"
	}
	return []Check{req, checkDeviceAccess(opts, who, pid, fx, specNote)}
}

// errTaskNotFound is returned by taskByID when the state directory has no
// such task.
var errTaskNotFound = errors.New("no such containerd task")

// taskByID reads the bundle of a task whose namespace and full ID are
// known (a CRI container on containerd).
func taskByID(state, namespace, id string) (*task, error) {
	bundle := filepath.Join(state, taskDirName, namespace, id)
	if _, err := os.Stat(filepath.Join(bundle, "config.json")); err != nil {
		return nil, fmt.Errorf("%w: %s", errTaskNotFound, bundle)
	}
	return readTask(bundle, namespace, id)
}
