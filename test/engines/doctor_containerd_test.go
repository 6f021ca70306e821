//go:build linux

package engines

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gantry-gpu/gantry/internal/doctor"
	"github.com/gantry-gpu/gantry/internal/kubeletckpt"
)

// cgroupBroken is how doctor names a device cgroup that refuses the GPU.
const cgroupBroken = "Failed to initialize NVML: Unknown Error"

// runDoctor runs `gantry doctor --json args...` with env and returns its
// checks in order (a pod's containers each have their own).
func runDoctor(t *testing.T, f *fixture, env []string, args ...string) []doctor.Check {
	t.Helper()
	cmd := exec.Command(f.gantry, append([]string{"doctor", "--json"}, args...)...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); err != nil && (!ok || ee.ExitCode() != 1) {
		t.Fatalf("gantry doctor %v: %v\n%s", args, err, stderr.String())
	}
	var checks []doctor.Check
	if err := json.Unmarshal(stdout.Bytes(), &checks); err != nil {
		t.Fatalf("gantry doctor --json: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	return checks
}

// named returns the checks called name.
func named(checks []doctor.Check, name string) []doctor.Check {
	var out []doctor.Check
	for _, c := range checks {
		if c.Name == name {
			out = append(out, c)
		}
	}
	return out
}

// one returns the single check called name, failing the test otherwise.
func one(t *testing.T, checks []doctor.Check, name string) doctor.Check {
	t.Helper()
	got := named(checks, name)
	if len(got) != 1 {
		t.Fatalf("%d %q checks, want 1: %+v", len(got), name, checks)
	}
	return got[0]
}

// denyNvidiactl removes 195:255 from the cgroup v1 devices cgroup of pid,
// what systemctl daemon-reload does to a rule a hook added; it skips on
// cgroup v2, where the rules are an eBPF program.
func denyNvidiactl(t *testing.T, pid string) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strings.TrimSpace(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && strings.Contains(","+parts[1]+",", ",devices,") {
			deny := filepath.Join("/sys/fs/cgroup/devices", parts[2], "devices.deny")
			if err := os.WriteFile(deny, []byte("c 195:255 rwm"), 0); err != nil {
				t.Fatalf("removing the container's rule: %v", err)
			}
			return
		}
	}
	t.Skip("cgroup v2: a single device rule cannot be removed from outside (it is an eBPF program); internal/doctor's TestProbeDevice covers a container without the rule there")
}

// TestDoctorContainerd runs `gantry doctor --container` on containerd
// tasks started by ctr: one that got the GPUs from gantry-runtime (as the
// runc binary of the runc-v2 shim), the same after its device rule is
// taken away and after the fix doctor names, and one run with plain runc
// although it asks for GPUs.
func TestDoctorContainerd(t *testing.T) {
	e := startContainerd(t)
	f := e.f
	state := filepath.Join(e.dir, "containerd", "state")
	// ctr puts tasks in the cgroup /NAMESPACE/ID; runc removes the ID part.
	t.Cleanup(func() { removeCgroupDirs("/" + e.namespace) })
	start := func(id string, opts ...string) {
		t.Helper()
		args := append([]string{"run", "--detach", "--null-io", "--snapshotter", e.snapshotter,
			"--runc-root", filepath.Join(e.dir, "runc"), "--fifo-dir", filepath.Join(e.dir, "fifo")}, opts...)
		if out, err := e.ctr(append(args, ctrImage, id, "busybox", "sleep", "600")...); err != nil {
			t.Fatalf("%v\n%s\n%s", err, out, f.runtimeLogTail())
		}
		t.Cleanup(func() {
			_, _ = e.ctr("task", "kill", "-s", "SIGKILL", id)
			for i := 0; i < 50; i++ { // the task must have stopped before it can be deleted
				if _, err := e.ctr("task", "delete", id); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			_, _ = e.ctr("containers", "delete", id)
		})
	}
	diagnose := func(id string, extra ...string) []doctor.Check {
		t.Helper()
		return runDoctor(t, f, e.cli, append([]string{"--container", id, "--containerd-state", state}, extra...)...)
	}
	bundle := func(id string) string {
		return filepath.Join(state, "io.containerd.runtime.v2.task", e.namespace, id)
	}

	start("gpu-doctor", "--runc-binary", f.nvRuntime, "--env", "NVIDIA_VISIBLE_DEVICES=all")
	got := diagnose("gpu-doctor")
	req := one(t, got, doctor.CheckContainer)
	if req.Status != doctor.Pass {
		t.Fatalf("container request: %+v", req)
	}
	// gantry-runtime keeps the request in the env and marks the spec with
	// the GPUs it injected.
	for _, want := range []string{"containerd task " + e.namespace + "/gpu-doctor", "NVIDIA_VISIBLE_DEVICES=all", "injected by gantry-runtime (GPUs 0,1,2,3,4,5,6,7)",
		"runc binary " + f.nvRuntime, "device nodes (/dev/nvidia", "/dev/nvidiactl", " driver mounts"} {
		if !strings.Contains(req.Evidence, want) {
			t.Errorf("container request evidence lacks %q: %s", want, req.Evidence)
		}
	}
	if strings.Contains(req.Evidence, " 0 driver mounts") {
		t.Errorf("no driver mounts counted: %s", req.Evidence)
	}
	dev := one(t, got, doctor.CheckContainerDevice)
	if dev.Status != doctor.Pass || strings.Contains(dev.Evidence, cgroupBroken) || !strings.Contains(dev.Evidence, "/dev/nvidiactl") {
		t.Fatalf("healthy container: %+v", dev)
	}
	t.Logf("healthy:\n%s\n%s", req.Evidence, dev.Evidence)

	// A unique prefix and an explicit namespace find it too; another
	// namespace does not.
	if c := one(t, diagnose("gpu-doc", "--namespace", e.namespace), doctor.CheckContainer); c.Status != doctor.Pass {
		t.Errorf("--namespace with a prefix: %+v", c)
	}
	if c := one(t, diagnose("gpu-doctor", "--namespace", "elsewhere"), doctor.CheckContainer); c.Status != doctor.Fail ||
		!strings.Contains(c.Evidence, "no containerd task") || !strings.Contains(c.Fix, "--namespace") {
		t.Errorf("wrong namespace: %+v", c)
	}

	t.Run("RuleRemoved", func(t *testing.T) {
		pid, err := os.ReadFile(filepath.Join(bundle("gpu-doctor"), "init.pid"))
		if err != nil {
			t.Fatal(err)
		}
		denyNvidiactl(t, string(pid))
		c := one(t, diagnose("gpu-doctor"), doctor.CheckContainerDevice)
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, cgroupBroken) || !strings.Contains(c.Evidence, "daemon-reload") ||
			!strings.Contains(c.Evidence, "operation not permitted") || strings.Contains(c.Evidence, "c 195:255 rwm") ||
			!strings.Contains(c.Fix, "ctr -n "+e.namespace+" task kill -s SIGKILL gpu-doctor") {
			t.Fatalf("after the rule was removed: %+v", c)
		}
		t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
		// The fix works: a new task gets its cgroup from the spec again.
		if out, err := e.ctr("task", "kill", "-s", "SIGKILL", "gpu-doctor"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var out string
		for i := 0; i < 100; i++ {
			if out, err = e.ctr("task", "delete", "gpu-doctor"); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if out, err := e.ctr("task", "start", "--detach", "--null-io", "--fifo-dir", filepath.Join(e.dir, "fifo"), "gpu-doctor"); err != nil {
			t.Fatalf("%v\n%s\n%s", err, out, f.runtimeLogTail())
		}
		if c := one(t, diagnose("gpu-doctor"), doctor.CheckContainerDevice); c.Status != doctor.Pass {
			t.Fatalf("still broken after the task was restarted: %+v", c)
		}
	})

	t.Run("PlainRunc", func(t *testing.T) {
		start("plain-runc", "--env", "NVIDIA_VISIBLE_DEVICES=all")
		got := diagnose("plain-runc")
		c := one(t, got, doctor.CheckContainer)
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, "runtime is not registered or runc was used directly") ||
			!strings.Contains(c.Evidence, "0 device nodes") || !strings.Contains(c.Fix, "gantry runtime configure --runtime containerd") {
			t.Fatalf("container request: %+v", c)
		}
		// Its cgroup never allowed the GPU (runc's defaults), and it has no node.
		if d := one(t, got, doctor.CheckContainerDevice); d.Status != doctor.Fail {
			t.Errorf("container device access: %+v", d)
		}
		t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
	})

	t.Run("Unknown", func(t *testing.T) {
		got := diagnose("no-such-container")
		c := one(t, got, doctor.CheckContainer)
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, "no containerd task") || !strings.Contains(c.Fix, "ctr -n NAMESPACE tasks ls") {
			t.Fatalf("%+v", c)
		}
		if d := one(t, got, doctor.CheckContainerDevice); d.Status != doctor.Skip {
			t.Errorf("%+v", d)
		}
	})
}

// pauseImage is the CRI sandbox image of the private containerd: the test
// image whose command sleeps, so that the sandbox's namespaces live.
const pauseImage = "docker.io/gantry-test/pause:1"

// containerdCRIConfig is a private containerd with its CRI plugin on: the
// sandbox image imported from a local archive (never pulled), a runtime
// "nvidia" whose runc binary is Gantry's (what gantry runtime configure
// writes), no AppArmor profile, oom_score_adj no lower than containerd's
// own (lowering it needs CAP_SYS_RESOURCE, which a test host inside a
// container may lack), and the stream server on loopback. Pods
// use the node's network namespace, so no CNI plugin is needed.
const containerdCRIConfig = containerdConfig + `
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = %q
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %q
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
        BinaryName = %q
        Root = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`

const containerdCRIRunConfig = `version = 2
imports = [%q]
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]
`

// criEngine is a private containerd serving CRI.
type criEngine struct {
	f     *fixture
	dir   string
	sock  string
	state string
	env   []string
	rt    runtimeapi.RuntimeServiceClient
	d     *daemon
	argv  []string
}

func startCRI(t *testing.T) *criEngine {
	f := need(t)
	return startCRIWith(t, f.daemonEnv(), f.nvRuntime)
}

// startCRIWith is startCRI with env for containerd and binaryName as the
// nvidia runtime's BinaryName.
func startCRIWith(t *testing.T, env []string, binaryName string) *criEngine {
	f := need(t)
	if why := containerdSkip(); why != "" {
		t.Skip(why)
	}
	hostDirsCleanup(t)
	e := &criEngine{f: f, dir: t.TempDir(), env: env}
	dir := filepath.Join(e.dir, "containerd")
	for _, d := range []string{dir, filepath.Join(e.dir, "cni", "bin"), filepath.Join(e.dir, "cni", "conf")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	snapshotter := "native"
	if f.overlay {
		snapshotter = "overlayfs"
	}
	e.sock = filepath.Join(dir, "containerd.sock")
	e.state = filepath.Join(dir, "state")
	config := filepath.Join(dir, "config.toml")
	cfg := fmt.Sprintf(containerdCRIConfig, filepath.Join(dir, "root"), e.state, e.sock, e.sock+".ttrpc",
		filepath.Join(dir, "opt"), pauseImage, snapshotter, filepath.Join(e.dir, "runc"),
		binaryName, filepath.Join(e.dir, "runc"), filepath.Join(e.dir, "cni", "bin"), filepath.Join(e.dir, "cni", "conf"))
	runConfig := filepath.Join(dir, "run.toml")
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(runConfig, []byte(fmt.Sprintf(containerdCRIRunConfig, config)), 0o644); err != nil {
		t.Fatal(err)
	}
	e.argv = []string{"containerd", "--config", runConfig}
	conn, err := grpc.NewClient("unix://"+e.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.rt = runtimeapi.NewRuntimeServiceClient(conn)
	e.start(t)
	d := e.d
	// The images, into the namespace CRI uses.
	pause := filepath.Join(e.dir, "pause-oci.tar")
	layer, err := os.ReadFile(f.rootfsTar)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeImageArchive(pause, layer, pauseImage, []string{"busybox", "sleep", "100000"}); err != nil {
		t.Fatal(err)
	}
	for _, archive := range []string{pause, f.ociArchive} {
		if out, err := command(e.env, "ctr", "--address", e.sock, "--namespace", "k8s.io", "images", "import",
			"--snapshotter", snapshotter, archive); err != nil {
			t.Fatalf("%v\n%s\ncontainerd log:\n%s", err, out, tail(d.log, 4000))
		}
	}
	return e
}

// start starts containerd and waits until CRI answers.
func (e *criEngine) start(t *testing.T) {
	t.Helper()
	dir := filepath.Join(e.dir, "containerd")
	e.d = startDaemon(t, "containerd (CRI)", filepath.Join(dir, "containerd.log"), dir, e.env, e.argv...)
	e.d.waitReady(t, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := e.rt.Version(ctx, &runtimeapi.VersionRequest{})
		return err
	})
}

// restart is systemctl restart containerd: the same files read again.
func (e *criEngine) restart(t *testing.T) {
	t.Helper()
	e.d.stop(t)
	e.start(t)
}

// runPod starts a pod sandbox on the node's network with one container
// that sleeps, under the runtime handler (containerd runtime name), with
// env, and removes it when the test ends.
func (e *criEngine) runPod(t *testing.T, ns, name, handler string, env map[string]string) (sandboxID, containerID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logs := t.TempDir()
	sbConfig := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: ns, Uid: fmt.Sprintf("uid-%s-%d", name, os.Getpid())},
		Labels:       map[string]string{"io.kubernetes.pod.namespace": ns, "io.kubernetes.pod.name": name},
		LogDirectory: logs,
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: fmt.Sprintf("/gantry-cri-test-%d/%s", os.Getpid(), name),
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
			},
		},
	}
	sb, err := e.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbConfig, RuntimeHandler: handler})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v\ncontainerd log:\n%s\n%s", err, tail(filepath.Join(e.dir, "containerd", "containerd.log"), 4000), e.f.runtimeLogTail())
	}
	sandboxID = sb.GetPodSandboxId()
	// runc removes the containers' cgroups; their parents are ours.
	t.Cleanup(func() { removeCgroupDirs(fmt.Sprintf("/gantry-cri-test-%d/%s", os.Getpid(), name)) })
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = e.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandboxID})
		_, _ = e.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID})
	})
	var envs []*runtimeapi.KeyValue
	for k, v := range env {
		envs = append(envs, &runtimeapi.KeyValue{Key: k, Value: []byte(v)})
	}
	if v, ok := env["NVIDIA_VISIBLE_DEVICES"]; ok {
		// What a kubelet does before it creates the container: record the
		// device plugin's answer in its device checkpoint, which
		// gantry-runtime reads for a CRI container (runtime.kubernetes-env).
		e.f.recordAllocation(t, sbConfig.Metadata.Uid, "cuda", v)
	}
	c, err := e.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId: sandboxID,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "cuda"},
			Image:    &runtimeapi.ImageSpec{Image: ctrImage},
			Command:  []string{"busybox", "sleep", "600"},
			Envs:     envs,
			LogPath:  "cuda.log",
			Linux:    &runtimeapi.LinuxContainerConfig{},
		},
		SandboxConfig: sbConfig,
	})
	if err != nil {
		t.Fatalf("CreateContainer: %v\n%s", err, e.f.runtimeLogTail())
	}
	containerID = c.GetContainerId()
	if _, err := e.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: containerID}); err != nil {
		t.Fatalf("StartContainer: %v\n%s", err, e.f.runtimeLogTail())
	}
	return sandboxID, containerID
}

// removeCgroupDirs removes the empty cgroup rel and its empty parents in
// every mounted cgroup hierarchy.
func removeCgroupDirs(rel string) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, root := range roots {
		for p := filepath.Clean(rel); p != "/" && p != "."; p = filepath.Dir(p) {
			if os.Remove(filepath.Join(root, p)) != nil {
				break
			}
		}
	}
}

// fakePodResources is the kubelet's pod-resources service as a kubelet
// serves it, answering List with one pod's GPU assignment.
type fakePodResources struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	ns, name, container, device string
}

func (p *fakePodResources) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	return &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{{
		Name: p.name, Namespace: p.ns,
		Containers: []*podresourcesv1.ContainerResources{{
			Name:    p.container,
			Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{p.device}}},
		}},
	}}}, nil
}

// TestDoctorPod runs `gantry doctor --pod` against pods made through the
// CRI API of a real containerd (its CRI plugin), with gantry-runtime as the
// runc binary of the pod's runtime handler: a healthy GPU pod, the same
// after its container's device rule is taken away, and a pod run by plain
// runc although it asks for GPUs.
func TestDoctorPod(t *testing.T) {
	e := startCRI(t)
	f := e.f

	_, gpuID := e.runPod(t, "ml", "train", "nvidia", map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"})

	// The kubelet's pod-resources API, with the device it assigned.
	kubelet := filepath.Join(e.dir, "kubelet")
	if err := os.MkdirAll(filepath.Join(kubelet, "pod-resources"), 0o755); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", filepath.Join(kubelet, "pod-resources", "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, &fakePodResources{ns: "ml", name: "train", container: "cuda", device: "GPU-0f00"})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)

	diagnose := func(pod string, extra ...string) []doctor.Check {
		t.Helper()
		return runDoctor(t, f, e.env, append([]string{"--pod", pod, "--cri-socket", e.sock, "--containerd-state", e.state,
			"--kubelet-dir", kubelet}, extra...)...)
	}
	got := diagnose("ml/train")
	pc := one(t, got, doctor.CheckPodContainers)
	if pc.Status != doctor.Pass || !strings.Contains(pc.Evidence, "cuda ("+gpuID[:13]+", running)") || !strings.Contains(pc.Evidence, "containerd") {
		t.Fatalf("pod containers: %+v", pc)
	}
	req := one(t, got, doctor.CheckContainer)
	for _, want := range []string{"pod ml/train container cuda", "NVIDIA_VISIBLE_DEVICES=all", "runc binary " + f.nvRuntime,
		"/dev/nvidiactl", "task bundle " + filepath.Join(e.state, "io.containerd.runtime.v2.task", "k8s.io", gpuID),
		"the kubelet assigned nvidia.com/gpu GPU-0f00"} {
		if !strings.Contains(req.Evidence, want) {
			t.Errorf("container request evidence lacks %q: %+v", want, req)
		}
	}
	if req.Status != doctor.Pass {
		t.Errorf("container request: %+v", req)
	}
	dev := one(t, got, doctor.CheckContainerDevice)
	if dev.Status != doctor.Pass || strings.Contains(dev.Evidence, cgroupBroken) {
		t.Fatalf("healthy pod: %+v", dev)
	}
	t.Logf("healthy pod:\n%s\n%s\n%s", pc.Evidence, req.Evidence, dev.Evidence)

	// --cri-socket names the containerd for --container too: its task is
	// found in that containerd's state directory, without --containerd-state.
	if c := one(t, runDoctor(t, f, e.env, "--container", gpuID[:13], "--namespace", "k8s.io", "--cri-socket", e.sock, "--kubelet-dir", kubelet),
		doctor.CheckContainer); c.Status != doctor.Pass || !strings.Contains(c.Evidence, "containerd task k8s.io/"+gpuID) {
		t.Errorf("--container with --cri-socket only: %+v", c)
	}

	t.Run("RuleRemoved", func(t *testing.T) {
		pid, err := os.ReadFile(filepath.Join(e.state, "io.containerd.runtime.v2.task", "k8s.io", gpuID, "init.pid"))
		if err != nil {
			t.Fatal(err)
		}
		denyNvidiactl(t, string(pid))
		c := one(t, diagnose("ml/train"), doctor.CheckContainerDevice)
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, cgroupBroken) || !strings.Contains(c.Fix, "kubectl delete pod -n ml train") {
			t.Fatalf("after the rule was removed: %+v", c)
		}
		t.Logf("%s\nfix: %s", c.Evidence, c.Fix)
		// The same container through --container (containerd, namespace k8s.io).
		c = one(t, runDoctor(t, f, e.env, "--container", gpuID[:13], "--namespace", "k8s.io", "--containerd-state", e.state),
			doctor.CheckContainerDevice)
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, "pod ml/train container cuda") || !strings.Contains(c.Fix, "kubectl delete pod -n ml train") {
			t.Fatalf("--container on a pod's container: %+v", c)
		}
	})

	t.Run("PlainRunc", func(t *testing.T) {
		e.runPod(t, "ml", "plain", "runc", map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"})
		c := one(t, diagnose("ml/plain"), doctor.CheckContainer)
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, "runtime is not registered or runc was used directly") ||
			!strings.Contains(c.Fix, "gantry runtime configure --runtime containerd") || !strings.Contains(c.Fix, "runtimeClassName") {
			t.Fatalf("%+v", c)
		}
	})

	t.Run("NotOnThisNode", func(t *testing.T) {
		got := diagnose("ml/elsewhere")
		c := one(t, got, doctor.CheckPodContainers)
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, "io.kubernetes.pod.name=elsewhere") || !strings.Contains(c.Fix, "-o wide") {
			t.Fatalf("%+v", c)
		}
		if len(named(got, doctor.CheckContainer)) != 0 {
			t.Errorf("container checks for a pod that is not here: %+v", got)
		}
	})

	t.Run("NoCRI", func(t *testing.T) {
		c := one(t, diagnose("ml/train", "--cri-socket", filepath.Join(e.dir, "nope.sock")), doctor.CheckPodContainers)
		if c.Status != doctor.Fail || !strings.Contains(c.Evidence, filepath.Join(e.dir, "nope.sock")) || !strings.Contains(c.Fix, "--cri-socket") {
			t.Fatalf("%+v", c)
		}
	})
}

// kubeletDir is the kubelet root directory the engine tests' runtime reads
// the device checkpoint from.
func (f *fixture) kubeletDir() string { return filepath.Join(f.dir, "kubelet") }

// recordAllocation adds a container's allocation to the kubelet device
// checkpoint under kubeletDir, in the kubelet's format: the plugin's
// Allocate response (envs) in protobuf.
func (f *fixture) recordAllocation(t *testing.T, podUID, container, visible string) {
	t.Helper()
	path := filepath.Join(f.kubeletDir(), "device-plugins", kubeletckpt.File)
	var cp map[string]any
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &cp); err != nil {
			t.Fatal(err)
		}
	} else {
		cp = map[string]any{"Data": map[string]any{"PodDeviceEntries": []any{}, "RegisteredDevices": map[string]any{}}, "Checksum": 0}
	}
	resp, err := proto.Marshal(&pluginapi.ContainerAllocateResponse{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": visible}})
	if err != nil {
		t.Fatal(err)
	}
	data := cp["Data"].(map[string]any)
	data["PodDeviceEntries"] = append(data["PodDeviceEntries"].([]any), map[string]any{
		"PodUID": podUID, "ContainerName": container, "ResourceName": "nvidia.com/gpu",
		"DeviceIDs": map[string][]string{"-1": strings.Split(visible, ",")}, "AllocResp": resp,
	})
	b, err := json.Marshal(cp)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// The kubelet drops a deleted pod's entries: left behind, they would
	// hold the GPUs for the next tests' pods (the runtime refuses a GPU a
	// running pod holds, and with no kubepods cgroup it counts every
	// holder as running).
	t.Cleanup(func() { f.dropAllocations(t, podUID) })
}

// dropAllocations removes a pod's entries from the kubelet device
// checkpoint under kubeletDir.
func (f *fixture) dropAllocations(t *testing.T, podUID string) {
	path := filepath.Join(f.kubeletDir(), "device-plugins", kubeletckpt.File)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Error(err)
		return
	}
	var cp map[string]any
	if err := json.Unmarshal(b, &cp); err != nil {
		t.Error(err)
		return
	}
	data := cp["Data"].(map[string]any)
	var kept []any
	for _, e := range data["PodDeviceEntries"].([]any) {
		if e.(map[string]any)["PodUID"] != podUID {
			kept = append(kept, e)
		}
	}
	if kept == nil {
		kept = []any{}
	}
	data["PodDeviceEntries"] = kept
	if b, err = json.Marshal(cp); err == nil {
		err = os.WriteFile(path, b, 0o600)
	}
	if err != nil {
		t.Error(err)
	}
}
