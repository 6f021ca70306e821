package doctor

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/cdispec"
	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/engineconfig"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
	injectpkg "github.com/gantry-gpu/gantry/internal/inject"
	"github.com/gantry-gpu/gantry/internal/ldcache"
	"github.com/gantry-gpu/gantry/internal/request"
	"sigs.k8s.io/yaml"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"
)

// host is one test host: a fake driver root with real device nodes,
// simulated GPUs, and every engine file in a temporary directory.
type host struct {
	res  *fakedriver.Result
	dir  string
	bin  string // the only directory on PATH
	opts Options
}

func newHost(t *testing.T) *host {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot build a fake driver root (scripts/deps.sh --test installs it)")
	}
	dir := t.TempDir()
	res, err := fakedriver.Build(filepath.Join(dir, "driver"), fakedriver.Options{GPUs: 8, DeviceNodes: true})
	if err != nil {
		t.Fatalf("building fake driver: %v", err)
	}
	if !res.RealDeviceNodes {
		t.Skip("not root: the fake driver's device nodes are regular files, which doctor rightly rejects")
	}
	h := &host{res: res, dir: dir, bin: filepath.Join(dir, "bin")}
	// The kernel's character majors, as a fake root's own proc/devices.
	h.write(t, filepath.Join(res.Root, "proc/devices"),
		"Character devices:\n  1 mem\n195 nvidia-frontend\n511 nvidia-uvm\n\nBlock devices:\n  8 sd\n")
	h.write(t, filepath.Join(h.bin, "gantry-runtime"), "#!/bin/sh\n")
	h.write(t, filepath.Join(h.bin, "nvidia-container-runtime-hook"), "#!/bin/sh\n")
	t.Setenv("PATH", h.bin)

	cfg := config.Default()
	cfg.GPUs = "sim:h100x8"
	cfg.DriverRoot = res.Root
	cfg.CDI.SpecDirs = []string{filepath.Join(dir, "cdi")}
	cfg.Runtime.CacheDir = filepath.Join(dir, "cache")
	h.opts = Options{
		Config:           cfg,
		Proc:             filepath.Join(dir, "proc"), // the host's /proc must not matter
		Sys:              filepath.Join(dir, "sys"),  // nor its /sys (a loaded nvidia module)
		DockerConfig:     filepath.Join(dir, "docker/daemon.json"),
		DockerSocket:     filepath.Join(dir, "docker/docker.sock"), // no dockerd: the file only
		ContainerdConfig: filepath.Join(dir, "containerd/config.toml"),
		CRIOConfig:       filepath.Join(dir, "crio/crio.conf"),
		CRIODropins:      filepath.Join(dir, "crio/crio.conf.d"),
		KubeletDir:       filepath.Join(dir, "kubelet"), // not a Kubernetes node
		// No containerd or CRI-O answering: never the host's
		// /run/containerd/containerd.sock, whose runtimes would be judged.
		CRISockets:    []string{filepath.Join(dir, "containerd/containerd.sock"), filepath.Join(dir, "crio/crio.sock")},
		RuntimeSocket: filepath.Join(dir, "runtime.sock"), // no create server; never the host's
		PodmanStorage: filepath.Join(dir, "containers/storage"),
		// containerd's root: none, so never the host's content store.
		ContainerdRoot: filepath.Join(dir, "containerd-root"),
		// Where dockerd would look for the hook when none runs: never the
		// host's /usr/bin, which has one where Gantry or NVIDIA's toolkit
		// is installed.
		ServicePATH: filepath.Join(dir, "service/sbin") + ":" + filepath.Join(dir, "service/bin"),
		// CRIU's configuration files: none, never the host's /etc/criu.
		CRIUConfigs: []string{filepath.Join(dir, "criu/runc.conf"), filepath.Join(dir, "criu/default.conf")},
	}
	// A running dockerd whose PATH has the hook: doctor looks the hook up
	// there, not in its own PATH.
	h.write(t, filepath.Join(h.opts.Proc, "100/comm"), "dockerd\n")
	h.write(t, filepath.Join(h.opts.Proc, "100/environ"), "LANG=C\x00PATH="+h.bin+"\x00")
	h.write(t, h.opts.DockerConfig, `{"runtimes": {"nvidia": {"path": "`+filepath.Join(h.bin, "gantry-runtime")+`"}}}`)
	h.writeSpec(t)
	return h
}

func (h *host) write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
}

// writeSpec generates the CDI spec for the fake driver as it is now.
func (h *host) writeSpec(t *testing.T) { h.writeSpecWith(t, "") }

// writeSpecWith is writeSpec with hooks that run hookPath ("" for none).
func (h *host) writeSpecWith(t *testing.T, hookPath string) {
	t.Helper()
	sys, err := sim.Load("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := driver.Discover(driver.Options{Root: h.res.Root, DevRoot: h.res.Root})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cdispec.Generate(sys, inv, cdispec.Options{DevRoot: h.res.Root, HookPath: hookPath})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(h.opts.Config.CDI.SpecDirs[0], 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cdispec.Write(spec, filepath.Join(h.opts.Config.CDI.SpecDirs[0], "nvidia.yaml"), ""); err != nil {
		t.Fatal(err)
	}
}

// find returns the named check, failing the test when it is absent.
func find(t *testing.T, checks []Check, name string) Check {
	t.Helper()
	for _, c := range checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %s", name, dump(checks))
	return Check{}
}

func dump(checks []Check) string {
	var b bytes.Buffer
	_ = Write(&b, checks)
	return b.String()
}

// expect asserts a check's status and that its evidence (and fix) contain the given words.
func expect(t *testing.T, checks []Check, name string, status Status, evidence []string, fix string) Check {
	t.Helper()
	c := find(t, checks, name)
	if c.Status != status || c.OK != (status != Fail) {
		t.Fatalf("%s: status %s (ok %v), want %s\n%s", name, c.Status, c.OK, status, dump(checks))
	}
	for _, w := range evidence {
		if !strings.Contains(c.Evidence, w) {
			t.Errorf("%s: evidence %q lacks %q", name, c.Evidence, w)
		}
	}
	if !strings.Contains(c.Fix, fix) {
		t.Errorf("%s: fix %q lacks %q", name, c.Fix, fix)
	}
	return c
}

func TestHealthyHost(t *testing.T) {
	h := newHost(t)
	checks := Run(h.opts)
	if Failed(checks) {
		t.Fatalf("a healthy host has failures:\n%s", dump(checks))
	}
	for _, name := range []string{CheckKernel, CheckDeviceNodes, CheckGPUNodes, CheckVersions, CheckDriverFiles, CheckLoaderCache, CheckCDISpecs, CheckDocker, CheckHook} {
		expect(t, checks, name, Pass, nil, "")
	}
	expect(t, checks, CheckKernel, Pass, []string{fakedriver.DefaultVersion}, "")
	expect(t, checks, CheckDeviceNodes, Pass, []string{"nvidiactl 195:255", "nvidia-uvm 511:0", "8 GPU nodes"}, "")
	expect(t, checks, CheckNVML, Skip, []string{"simulated"}, "")
	expect(t, checks, CheckPersistence, Skip, []string{"simulated"}, "")
	expect(t, checks, CheckContainerd, Skip, nil, "")
	expect(t, checks, CheckCRIO, Skip, nil, "")
	expect(t, checks, CheckContentStore, Skip, []string{"no containerd root"}, "")
	expect(t, checks, CheckNetworkLock, Skip, []string{"no criu in the engine's PATH"}, "")
	// Every check is present, in chain order.
	want := []string{CheckKernel, CheckDeviceNodes, CheckNVML, CheckGPUNodes, CheckPersistence, CheckVersions, CheckDriverFiles, CheckLoaderCache,
		CheckInventoryCache, CheckCDISpecs, CheckOldCDIHooks, CheckDocker, CheckContainerd, CheckCRIO, CheckHook, CheckCreateServer,
		CheckDevicePlugin, CheckPluginHealth, CheckAllocatable, CheckCheckpoint, CheckNode, CheckLowLevel, CheckContainerCheckpoint, CheckNetworkLock, CheckContentStore}
	if len(checks) != len(want) {
		t.Fatalf("%d checks, want %d:\n%s", len(checks), len(want), dump(checks))
	}
	for i, c := range checks {
		if c.Name != want[i] {
			t.Errorf("check %d is %q, want %q", i, c.Name, want[i])
		}
	}
}

func TestMissingLibrary(t *testing.T) {
	h := newHost(t)
	libs, _ := filepath.Glob(filepath.Join(h.res.Root, h.res.LibDir, "libnvidia-ml.so*"))
	if len(libs) == 0 {
		t.Fatalf("fake driver has no libnvidia-ml.so* in %s", h.res.LibDir)
	}
	for _, l := range libs {
		if err := os.Remove(l); err != nil {
			t.Fatal(err)
		}
	}
	checks := Run(h.opts)
	expect(t, checks, CheckDriverFiles, Fail, []string{"libnvidia-ml.so", "not found"}, "reinstall")
	// Independent links are still checked.
	expect(t, checks, CheckKernel, Pass, nil, "")
	expect(t, checks, CheckDocker, Pass, nil, "")
}

func TestBrokenSONAMELink(t *testing.T) {
	h := newHost(t)
	link := filepath.Join(h.res.Root, h.res.LibDir, "libcuda.so.1")
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libcuda.so.1.0.0-gone", link); err != nil {
		t.Fatal(err)
	}
	checks := Run(h.opts)
	expect(t, checks, CheckDriverFiles, Fail, []string{"libcuda.so.1", "do not resolve"}, "ldconfig -r "+h.res.Root)
}

func TestStaleCDISpec(t *testing.T) {
	// The driver upgraded, module and libraries, after the spec was
	// generated for the old one.
	const upgraded = "560.35.03"
	var res *fakedriver.Result
	if _, err := exec.LookPath("gcc"); err == nil {
		if res, err = fakedriver.Build(filepath.Join(t.TempDir(), "driver-"+upgraded), fakedriver.Options{Version: upgraded, GPUs: 8, DeviceNodes: true}); err != nil {
			t.Fatal(err)
		}
	}
	h := newHost(t)
	h.write(t, filepath.Join(res.Root, "proc/devices"), "Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n")
	h.opts.Config.DriverRoot = res.Root
	checks := Run(h.opts)
	c := expect(t, checks, CheckCDISpecs, Fail,
		[]string{"nvidia.yaml", "generated for driver " + fakedriver.DefaultVersion, "running driver is " + upgraded},
		"cdi generate --output "+filepath.Join(h.opts.Config.CDI.SpecDirs[0], "nvidia.yaml"))
	t.Log(c.Evidence)
	expect(t, checks, CheckKernel, Pass, []string{upgraded}, "")
}

// The cache gantry-runtime wrote for the driver before an upgrade is
// reported stale, with the version it was made for; a file that is not a
// cache is reported unreadable.
func TestStaleInventoryCacheIsReported(t *testing.T) {
	h := newHost(t)
	cfg := h.opts.Config
	rec := injectpkg.NewRecord(injectpkg.FrontEndRuntime, "", "")
	if _, err := injectpkg.Prepare(cfg, &request.Request{Devices: request.Selection{Mode: request.All}}, injectpkg.Options{}, rec); err != nil {
		t.Fatal(err)
	}
	expect(t, Run(h.opts), CheckInventoryCache, Pass, []string{"current " + filepath.Join(cfg.Runtime.CacheDir, "inventory-")}, "")
	const upgraded = "560.35.03"
	h.write(t, filepath.Join(h.res.Root, "proc/driver/nvidia/version"),
		"NVRM version: NVIDIA UNIX x86_64 Kernel Module  "+upgraded+"  Tue Aug 13 00:00:00 UTC 2024\n")
	h.write(t, filepath.Join(cfg.Runtime.CacheDir, "inventory-0123456789ab.bin"), `{"key":{}}`)
	expect(t, Run(h.opts), CheckInventoryCache, Pass, []string{"stale", "(driver " + fakedriver.DefaultVersion + ")", "inventory-0123456789ab.bin (unreadable"}, "")
}

func TestDockerConfig(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		status        Status
		evidence      []string
		fix           string
	}{
		// The hook is on dockerd's PATH, so --gpus works: no runtime entry is INFO.
		{"no runtime", `{"log-driver": "json-file", "runtimes": {"crun": {"path": "/usr/bin/crun"}}}`, Info,
			[]string{"registers no GPU runtime", "--gpus uses the hook"}, ""},
		{"empty", ``, Info, []string{"registers no GPU runtime"}, ""},
		{"missing program", `{"runtimes": {"nvidia": {"path": "/nonexistent/nvidia-container-runtime"}}}`, Fail,
			[]string{`"nvidia"`, "/nonexistent/nvidia-container-runtime", "does not exist"}, "gantry runtime configure --runtime docker"},
		{"relative on PATH", `{"runtimes": {"gantry": {"path": "gantry-runtime"}}, "default-runtime": "gantry"}`, Pass,
			[]string{`"gantry" -> `, `default runtime "gantry"`}, ""},
		{"malformed", `{"runtimes": `, Fail, []string{"daemon.json"}, "correct the JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			h.write(t, h.opts.DockerConfig, tc.content)
			expect(t, Run(h.opts), CheckDocker, tc.status, tc.evidence, tc.fix)
		})
	}
	t.Run("absent", func(t *testing.T) {
		h := newHost(t)
		os.Remove(h.opts.DockerConfig)
		checks := Run(h.opts)
		expect(t, checks, CheckDocker, Skip, []string{"not installed"}, "")
		h.write(t, filepath.Join(h.bin, "dockerd"), "#!/bin/sh\n")
		checks = Run(h.opts)
		// --gpus users need no daemon.json: INFO, exit 0.
		expect(t, checks, CheckDocker, Info, []string{"does not exist", "--gpus uses the hook"}, "")
		if Failed(checks) {
			t.Fatalf("Docker used through --gpus only fails:\n%s", dump(checks))
		}
		os.Remove(filepath.Join(h.bin, "nvidia-container-runtime-hook"))
		checks = Run(h.opts)
		// Neither Docker GPU path is set up: Docker is not used for GPUs
		// here (issue 11: FAIL only on the paths in use), INFO with the fix.
		expect(t, checks, CheckDocker, Info, []string{"does not exist", "not set up for GPU containers"}, "")
		if Failed(checks) {
			t.Fatalf("Docker installed but not used for GPUs fails:\n%s", dump(checks))
		}
	})
	t.Run("no runtime and no hook", func(t *testing.T) {
		h := newHost(t)
		h.write(t, h.opts.DockerConfig, `{"runtimes": {"crun": {"path": "/usr/bin/crun"}}}`)
		os.Remove(filepath.Join(h.bin, "nvidia-container-runtime-hook"))
		expect(t, Run(h.opts), CheckDocker, Info, []string{"registers no GPU runtime", "crun"}, "")
	})
	t.Run("a GPU runtime whose binary is gone", func(t *testing.T) {
		h := newHost(t)
		h.write(t, h.opts.DockerConfig, `{"runtimes": {"nvidia": {"path": "/nonexistent/nvidia-container-runtime"}}}`)
		expect(t, Run(h.opts), CheckDocker, Fail, []string{"nvidia"}, "gantry runtime configure --runtime docker")
	})
}

func TestHookMissing(t *testing.T) {
	h := newHost(t)
	os.Remove(filepath.Join(h.bin, "nvidia-container-runtime-hook"))
	// --runtime nvidia works: only --gpus is unavailable, INFO.
	checks := Run(h.opts)
	expect(t, checks, CheckHook, Info, []string{"not on dockerd's PATH", "--gpus is not available"}, "")
	if Failed(checks) {
		t.Fatalf("a host using --runtime nvidia fails for the --gpus hook:\n%s", dump(checks))
	}
	// Neither path is set up: Docker is not a GPU path here, both INFO.
	h.write(t, h.opts.DockerConfig, `{}`)
	checks = Run(h.opts)
	expect(t, checks, CheckHook, Info, []string{"not on PATH", "not set up here"}, "")
	expect(t, checks, CheckDocker, Info, []string{"registers no GPU runtime"}, "")
	if Failed(checks) {
		t.Fatalf("a host not using Docker for GPUs fails:\n%s", dump(checks))
	}
	os.Remove(h.opts.DockerConfig) // no Docker: the hook is not needed
	expect(t, Run(h.opts), CheckHook, Skip, []string{"Docker is not installed"}, "")
}

func TestContainerdAndCRIO(t *testing.T) {
	h := newHost(t)
	rt := filepath.Join(h.bin, "gantry-runtime")
	h.write(t, h.opts.ContainerdConfig, `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
`)
	// No kubelet: containerd is Docker's backend (Debian's package), not a GPU path.
	expect(t, Run(h.opts), CheckContainerd, Info, []string{"no Kubernetes node", "Docker's backend"}, "")
	// Docker CE's config turns CRI off: never a GPU path, kubelet or not.
	h.write(t, filepath.Join(h.opts.KubeletDir, "device-plugins/.keep"), "")
	h.write(t, h.opts.ContainerdConfig, "disabled_plugins = [\"cri\"]\n")
	expect(t, Run(h.opts), CheckContainerd, Info, []string{`disabled_plugins "cri"`}, "")
	// On a Kubernetes node the CRI plugin runs GPU pods: no runtime is a FAIL.
	h.write(t, h.opts.ContainerdConfig, `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
`)
	expect(t, Run(h.opts), CheckContainerd, Fail, []string{"registers no runtime", "runc"}, "gantry runtime configure --runtime containerd")
	h.write(t, h.opts.ContainerdConfig, `version = 3
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
    BinaryName = "`+rt+`"
`)
	expect(t, Run(h.opts), CheckContainerd, Pass, []string{`"nvidia" -> ` + rt}, "")
	// The runtime in a drop-in the file imports, as nvidia-ctk runtime
	// configure writes it by default.
	h.write(t, h.opts.ContainerdConfig, `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
`)
	dropIn := filepath.Join(filepath.Dir(h.opts.ContainerdConfig), "conf.d", "99-nvidia.toml")
	if _, err := engineconfig.ApplyContainerdDropIn(h.opts.ContainerdConfig, dropIn, engineconfig.Options{RuntimePath: rt}, false); err != nil {
		t.Fatal(err)
	}
	expect(t, Run(h.opts), CheckContainerd, Pass, []string{`"nvidia" -> ` + rt, dropIn}, "")
	h.write(t, dropIn, "version = \n")
	expect(t, Run(h.opts), CheckContainerd, Fail, []string{dropIn, "imported by"}, "regenerate Gantry's drop-in")

	h.write(t, filepath.Join(h.opts.CRIODropins, "10-other.conf"), "[crio.runtime]\ndefault_runtime = \"runc\"\n")
	expect(t, Run(h.opts), CheckCRIO, Fail, []string{"registers no runtime"}, "gantry runtime configure --runtime crio")
	h.write(t, filepath.Join(h.opts.CRIODropins, "99-nvidia.toml"),
		"[crio.runtime.runtimes.nvidia]\nruntime_path = \""+rt+"\"\nruntime_type = \"oci\"\n")
	expect(t, Run(h.opts), CheckCRIO, Pass, []string{`"nvidia" -> ` + rt}, "")
}

func TestDeviceNodeMajors(t *testing.T) {
	h := newHost(t)
	// After a reboot the kernel gave nvidia-uvm another major than the
	// node (made by hand, or in a driver container's /dev) carries.
	h.write(t, filepath.Join(h.res.Root, "proc/devices"), "Character devices:\n195 nvidia-frontend\n500 nvidia-uvm\n")
	checks := Run(h.opts)
	expect(t, checks, CheckDeviceNodes, Fail, []string{"/dev/nvidia-uvm has major 511", "nvidia-uvm major 500"}, "nvidia-ctk system create-device-nodes --control-devices --driver-root "+h.res.Root+" --dev-root "+h.res.Root)
	// NVML (here: simulated) and the driver files do not depend on it.
	expect(t, checks, CheckDriverFiles, Pass, nil, "")

	h.write(t, filepath.Join(h.res.Root, "proc/devices"), "Character devices:\n195 nvidia-frontend\n")
	expect(t, Run(h.opts), CheckDeviceNodes, Fail, []string{"nvidia-uvm module is not loaded"}, "modprobe nvidia-uvm")
}

// No driver at all (no version file in the driver root, the host's /proc
// or /sys): the kernel driver FAILs and every check after it is SKIP
// naming it, device nodes and the engines included, so the one failure is
// the one to fix. Hermetic: the host's own driver, if any, is not read.
func TestNoKernelDriverSkipsDependents(t *testing.T) {
	h := newHost(t)
	if err := os.Remove(filepath.Join(h.res.Root, "proc/driver/nvidia/version")); err != nil {
		t.Fatal(err)
	}
	h.opts.Container = "some-container" // named: its checks are SKIP too, not left out
	checks := Run(h.opts)
	expect(t, checks, CheckKernel, Fail, []string{"not loaded"}, "modprobe nvidia")
	if len(checks) < len(Checks)-2 { // all but the pod's
		t.Errorf("only %d checks reported:\n%s", len(checks), dump(checks))
	}
	for _, c := range checks[1:] {
		if c.Status != Skip || !strings.Contains(c.Evidence, "kernel driver did not pass") {
			t.Errorf("%s: %s %s, want SKIP naming the kernel driver", c.Name, c.Status, c.Evidence)
		}
	}
	for _, name := range []string{CheckDeviceNodes, CheckGPUNodes, CheckDocker, CheckHook, CheckContainer, CheckContainerDevice} {
		find(t, checks, name)
	}
	if !strings.HasPrefix(dump(checks), "FAIL kernel driver: ") {
		t.Errorf("output does not start with the kernel failure:\n%s", dump(checks))
	}
	if !strings.Contains(dump(checks), "\n     fix: load the kernel module") {
		t.Errorf("no fix line:\n%s", dump(checks))
	}
	// The fix works: with the module loaded (its version file back),
	// the kernel driver passes and the checks after it run.
	h.write(t, filepath.Join(h.opts.Sys, "module/nvidia/version"), h.res.Version+"\n")
	h.opts.Container = ""
	checks = Run(h.opts)
	expect(t, checks, CheckKernel, Pass, []string{h.res.Version}, "")
	expect(t, checks, CheckDeviceNodes, Pass, nil, "")
}

// Every check after the kernel driver needs it: a check added without
// NeedDriver would report on a host with no driver at all.
func TestEveryCheckNeedsTheDriver(t *testing.T) {
	for _, c := range Checks[1:] {
		if !slices.Contains(c.Needs, NeedDriver) {
			t.Errorf("check %q does not need the driver", c.Name)
		}
	}
	if Checks[0].Name != CheckKernel {
		t.Errorf("the first check is %q", Checks[0].Name)
	}
}

func TestNVMLBackendNeedsKernel(t *testing.T) {
	h := newHost(t)
	h.opts.Config.GPUs = "nvml"
	os.Remove(filepath.Join(h.res.Root, "proc/driver/nvidia/version"))
	checks := Run(h.opts)
	expect(t, checks, CheckNVML, Skip, []string{"kernel driver did not pass"}, "")
}

// An 8-GPU host with /dev/nvidia1 gone: counting nodes said "7 GPU nodes"
// and passed; each GPU is checked against its own node.
func TestMissingGPUNodeNamesTheGPU(t *testing.T) {
	h := newHost(t)
	if err := os.Remove(filepath.Join(h.res.Root, "dev/nvidia1")); err != nil {
		t.Fatal(err)
	}
	checks := Run(h.opts)
	expect(t, checks, CheckGPUNodes, Fail, []string{"GPU 1 ", "/dev/nvidia1"}, "mknod -m 666 "+filepath.Join(h.res.Root, "dev/nvidia1")+" c 195 1")
	if c := find(t, checks, CheckGPUNodes); strings.Contains(c.Evidence, "GPU 0 ") || strings.Contains(c.Evidence, "GPU 2 ") {
		t.Errorf("evidence names GPUs whose nodes are there: %s", c.Evidence)
	}
	if !Failed(checks) {
		t.Error("a missing GPU node is not a failure")
	}
}

// The hook on doctor's PATH but not on dockerd's: docker run --gpus fails
// there, so the lookup uses dockerd's PATH from /proc/PID/environ.
func TestHookLookedUpOnDockerdPATH(t *testing.T) {
	h := newHost(t)
	other := filepath.Join(h.dir, "elsewhere")
	h.write(t, filepath.Join(other, "nvidia-container-runtime-hook"), "#!/bin/sh\n")
	h.write(t, filepath.Join(h.opts.Proc, "100/environ"), "PATH="+other+"\x00")
	expect(t, Run(h.opts), CheckHook, Pass, []string{other, "dockerd's PATH", "100/environ"}, "")

	// doctor's own PATH (h.bin) has the hook; dockerd's does not. Not the
	// host's /usr/bin: it has the hook where Gantry is installed.
	dockerdPath := filepath.Join(h.dir, "usr/sbin") + ":" + filepath.Join(h.dir, "usr/bin")
	h.write(t, filepath.Join(h.opts.Proc, "100/environ"), "PATH="+dockerdPath+"\x00")
	h.write(t, h.opts.DockerConfig, `{}`)
	expect(t, Run(h.opts), CheckHook, Fail, []string{`"` + dockerdPath + `"`, "dockerd's PATH"}, "dockerd's PATH")
}

// A corrupt host ld.so.cache, or one without the driver's libraries: the
// files are all there (driver files passes) but the loader cannot find them.
func TestLoaderCache(t *testing.T) {
	h := newHost(t)
	cache := filepath.Join(h.res.Root, "etc/ld.so.cache")
	h.write(t, cache, "glibc-ld.so.cache1.1 but then garbage")
	checks := Run(h.opts)
	expect(t, checks, CheckLoaderCache, Fail, []string{cache, "cannot be read as a loader cache"}, "ldconfig -r "+h.res.Root)
	expect(t, checks, CheckDriverFiles, Pass, nil, "")

	// A well-formed cache written before the driver was installed.
	b, err := (&ldcache.Cache{Entries: []ldcache.Entry{{Name: "libc.so.6", Path: "/lib/x86_64-linux-gnu/libc.so.6", Flags: ldcache.FlagELFLibc6 | ldcache.FlagX8664Lib64}}}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	h.write(t, cache, string(b))
	expect(t, Run(h.opts), CheckLoaderCache, Fail, []string{cache, "libcuda.so.1", "libnvidia-ml.so.1"}, "ldconfig -r "+h.res.Root)
}

// A CDI spec whose hooks carry no env (as gantry and NVIDIA's toolkit wrote
// them before CVE-2025-23266): the runtime runs them as root on the host
// with the image's environment. FAIL naming the file and the regeneration.
func TestCDISpecHooksWithoutEnv(t *testing.T) {
	h := newHost(t)
	path := filepath.Join(h.opts.Config.CDI.SpecDirs[0], "nvidia.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispecs.Spec
	if err := yaml.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	// The hook an older generator wrote: no env of its own.
	spec.ContainerEdits.Hooks = append(spec.ContainerEdits.Hooks, &cdispecs.Hook{
		HookName: "createContainer", Path: "/usr/bin/nvidia-cdi-hook", Args: []string{"nvidia-cdi-hook", "update-ldcache"}})
	b, err = yaml.Marshal(&spec)
	if err != nil {
		t.Fatal(err)
	}
	h.write(t, path, string(b))
	c := expect(t, Run(h.opts), CheckCDISpecs, Fail,
		[]string{path, "without an explicit env", "CVE-2025-23266", spec.ContainerEdits.Hooks[0].Path},
		"cdi generate --output "+path)
	t.Log(c.Evidence)
}

// Healthy hosts that use one engine each: every check PASS, SKIP or INFO,
// nothing failed (exit 0), and the engines not in use say why.
func TestHealthyHostsByEngine(t *testing.T) {
	t.Run("containerd only", func(t *testing.T) {
		h := newHost(t)
		os.Remove(h.opts.DockerConfig)
		os.RemoveAll(filepath.Join(h.opts.Proc, "100")) // no dockerd
		h.write(t, h.opts.ContainerdConfig, `version = 3
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
    BinaryName = "`+filepath.Join(h.bin, "gantry-runtime")+`"
`)
		checks := Run(h.opts)
		if Failed(checks) {
			t.Fatalf("containerd-only host fails:\n%s", dump(checks))
		}
		expect(t, checks, CheckContainerd, Pass, []string{`"nvidia"`}, "")
		expect(t, checks, CheckDocker, Skip, []string{"not installed"}, "")
		expect(t, checks, CheckHook, Skip, []string{"Docker is not installed"}, "")
	})
	t.Run("podman only", func(t *testing.T) {
		// Podman takes GPUs through CDI only: the spec is its whole path.
		h := newHost(t)
		os.Remove(h.opts.DockerConfig)
		os.RemoveAll(filepath.Join(h.opts.Proc, "100"))
		checks := Run(h.opts)
		if Failed(checks) {
			t.Fatalf("podman-only host fails:\n%s", dump(checks))
		}
		expect(t, checks, CheckCDISpecs, Pass, []string{"nvidia.yaml"}, "")
		for _, n := range []string{CheckDocker, CheckContainerd, CheckCRIO, CheckHook} {
			expect(t, checks, n, Skip, nil, "")
		}
	})
	t.Run("docker with debian containerd", func(t *testing.T) {
		// Docker's backend containerd, configured by Docker CE without CRI.
		h := newHost(t)
		h.write(t, h.opts.ContainerdConfig, "disabled_plugins = [\"cri\"]\n")
		checks := Run(h.opts)
		if Failed(checks) {
			t.Fatalf("Docker host with Docker CE's containerd config fails:\n%s", dump(checks))
		}
		expect(t, checks, CheckContainerd, Info, []string{"disables the CRI plugin"}, "")
	})
}

// /dev/nvidiactl deleted: every GPU container needs it.
func TestMissingControlNode(t *testing.T) {
	h := newHost(t)
	if err := os.Remove(filepath.Join(h.res.Root, "dev/nvidiactl")); err != nil {
		t.Fatal(err)
	}
	expect(t, Run(h.opts), CheckDeviceNodes, Fail, []string{"/dev/nvidiactl"}, "--dev-root "+h.res.Root)
}

// The user-space driver upgraded under a loaded kernel module: NVML's
// "Driver/library version mismatch".
func TestDriverLibraryVersionMismatch(t *testing.T) {
	c := checkVersions(Options{Config: config.Config{GPUs: "nvml", DriverRoot: t.TempDir()}}, "550.54.15", &gpu.System{DriverVersion: "560.35.03", CUDADriverVersion: "12.6"}, Check{Status: Pass})
	if c.Status != Fail || !strings.Contains(c.Evidence, "NVML reports driver 560.35.03 but the kernel module is 550.54.15") ||
		!strings.Contains(c.Fix, "reboot") {
		t.Fatalf("%+v", c)
	}
}

// With no dockerd running, the hook is looked up on the PATH dockerd will
// get (Options.ServicePATH, systemd's default), not doctor's own PATH and
// not the host's /usr/bin when a test names another.
func TestHookOnServicePATHWithoutDockerd(t *testing.T) {
	h := newHost(t)
	if err := os.RemoveAll(filepath.Join(h.opts.Proc, "100")); err != nil {
		t.Fatal(err)
	}
	svc := filepath.Join(h.dir, "service/bin")
	h.write(t, filepath.Join(svc, hookName), "#!/bin/sh\n")
	expect(t, Run(h.opts), CheckHook, Pass, []string{filepath.Join(svc, hookName), "systemd's default service PATH"}, "")
}
