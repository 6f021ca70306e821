package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/procfs"
)

func TestParseCgroupMounts(t *testing.T) {
	const v1 = `25 1 0:22 / /sys ro - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 30 0:31 / /sys/fs/cgroup/memory rw shared:14 - cgroup cgroup rw,memory
36 30 0:32 /docker/x /sys/fs/cgroup/devices2 rw - cgroup cgroup rw,devices
37 30 0:32 / /sys/fs/cgroup/dev\040ices rw shared:15 - cgroup cgroup rw,devices
`
	got, err := parseCgroupMounts(strings.NewReader(v1))
	if err != nil {
		t.Fatal(err)
	}
	// The bind of a subtree (root /docker/x) cannot reach other cgroups by
	// their /proc/PID/cgroup path; the escaped space is undone.
	if got.Devices != "/sys/fs/cgroup/dev ices" || got.Unified != "/sys/fs/cgroup/unified" {
		t.Fatalf("got %+v", got)
	}
	const v2 = `28 22 0:25 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	got, err = parseCgroupMounts(strings.NewReader(v2))
	if err != nil || got.Unified != "/sys/fs/cgroup" || got.Devices != "" {
		t.Fatalf("got %+v, %v", got, err)
	}
	if d, err := got.dir(procfs.DeviceCgroup{V2: true, Path: "/system.slice/a.scope"}); err != nil || d != "/sys/fs/cgroup/system.slice/a.scope" {
		t.Errorf("dir: %q, %v", d, err)
	}
	// A path climbing out is a cgroup outside doctor's cgroup namespace:
	// not under the mount, and not the cgroup the cleaned path would name.
	if d, err := got.dir(procfs.DeviceCgroup{V2: true, Path: "/../../kubepods/pod1/c1"}); err == nil || !strings.Contains(err.Error(), "outside doctor's cgroup namespace") {
		t.Errorf("dir of a climbing path: %q, %v", d, err)
	}
	if _, err := got.dir(procfs.DeviceCgroup{Path: "/x"}); err == nil || !strings.Contains(err.Error(), "devices controller is not mounted") {
		t.Errorf("v1 place without a devices mount: %v", err)
	}
}

func TestClassifyOpen(t *testing.T) {
	for errno, want := range map[syscall.Errno]access{
		0:               accessAllowed,
		syscall.ENXIO:   accessNoDriver,
		syscall.ENODEV:  accessNoDriver,
		syscall.EPERM:   accessRefused,
		syscall.EACCES:  accessUnknown, // a nodev mount or the file mode, not the cgroup
		syscall.ENOENT:  accessUnknown,
		syscall.EINTR:   accessUnknown,
		syscall.ENOTDIR: accessUnknown,
	} {
		if got := classifyOpen(errno); got != want {
			t.Errorf("classifyOpen(%v) = %v, want %v", errno, got, want)
		}
	}
}

func ptr(i int64) *int64 { return &i }

func TestRuleAllows(t *testing.T) {
	denyAll := specs.LinuxDeviceCgroup{Allow: false, Access: "rwm"}
	ctl := specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: ptr(195), Minor: ptr(255), Access: "rw"}
	for _, tc := range []struct {
		name  string
		rules []specs.LinuxDeviceCgroup
		want  bool
	}{
		{"none", nil, false},
		{"deny all", []specs.LinuxDeviceCgroup{denyAll}, false},
		{"deny all then nvidiactl", []specs.LinuxDeviceCgroup{denyAll, ctl}, true},
		{"nvidiactl then deny all", []specs.LinuxDeviceCgroup{ctl, denyAll}, false},
		{"all of major 195", []specs.LinuxDeviceCgroup{denyAll, {Allow: true, Type: "c", Major: ptr(195), Access: "rwm"}}, true},
		{"wildcard minor -1", []specs.LinuxDeviceCgroup{denyAll, {Allow: true, Type: "c", Major: ptr(195), Minor: ptr(-1), Access: "rwm"}}, true},
		{"read only", []specs.LinuxDeviceCgroup{denyAll, {Allow: true, Type: "c", Major: ptr(195), Minor: ptr(255), Access: "r"}}, false},
		{"another minor", []specs.LinuxDeviceCgroup{denyAll, {Allow: true, Type: "c", Major: ptr(195), Minor: ptr(0), Access: "rwm"}}, false},
		{"block device", []specs.LinuxDeviceCgroup{denyAll, {Allow: true, Type: "b", Major: ptr(195), Minor: ptr(255), Access: "rwm"}}, false},
		{"allow everything", []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}, true},
	} {
		if got := ruleAllows(tc.rules, 195, 255); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSummarizeSpec(t *testing.T) {
	spec := &specs.Spec{
		Process: &specs.Process{Env: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}},
		Annotations: map[string]string{
			"cdi.k8s.io/gantry": "nvidia.com/gpu=0",
			"other":             "x",
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Source: "proc", Type: "proc"},
			{Destination: "/usr/lib/libcuda.so.580.1", Source: "/drv/usr/lib/libcuda.so.580.1", Type: "bind"},
			{Destination: "/usr/bin/nvidia-smi", Source: "/usr/bin/nvidia-smi", Type: "bind"},
			{Destination: "/etc/hosts", Source: "/var/lib/x/hosts", Type: "bind"},
		},
		Linux: &specs.Linux{
			Devices: []specs.LinuxDevice{{Path: "/dev/nvidiactl"}, {Path: "/dev/nvidia0"}, {Path: "/dev/fuse"}},
			Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{
				{Allow: false, Access: "rwm"}, {Allow: true, Type: "c", Major: ptr(195), Minor: ptr(255), Access: "rw"},
			}},
		},
	}
	cfg := config.Default()
	cfg.DriverRoot = "/drv"
	s := summarizeSpec(spec, cfg)
	if !s.asks() || s.Visible != "all" || s.Caps != "compute,utility" || len(s.CDI) != 1 ||
		len(s.Devices) != 2 || s.DriverMounts != 2 || !s.AllowsCtl {
		t.Fatalf("%+v", s)
	}
	d := s.describe()
	for _, want := range []string{"NVIDIA_VISIBLE_DEVICES=all", "cdi.k8s.io/gantry=nvidia.com/gpu=0", "2 device nodes (/dev/nvidiactl /dev/nvidia0)", "2 driver mounts"} {
		if !strings.Contains(d, want) {
			t.Errorf("describe() = %q, lacks %q", d, want)
		}
	}
	// The driver tree layout: one mount whose source is below
	// driver-tree-dir, wherever that is (its path need not say nvidia).
	cfg.Runtime.DriverTreeDir = "/run/k8s/trees"
	tree := &specs.Spec{Mounts: []specs.Mount{{Destination: "/usr/local/nvidia", Source: "/run/k8s/trees/.sets/ab12/580.159.04", Type: "bind"}}}
	if s := summarizeSpec(tree, cfg); s.DriverMounts != 1 || s.DriverTree != "/usr/local/nvidia" ||
		!strings.Contains(s.describe(), "1 driver mounts (the driver tree at /usr/local/nvidia one of them)") {
		t.Errorf("tree layout: %+v %q", s, s.describe())
	}
	for _, v := range []string{"void", "none", ""} {
		s := summarizeSpec(&specs.Spec{Process: &specs.Process{Env: []string{"NVIDIA_VISIBLE_DEVICES=" + v}}}, config.Default())
		if s.asks() {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q asks for GPUs", v)
		}
	}
}

// TestFindTask reads a runtime v2 state directory laid out as containerd's
// shims leave it.
func TestFindTask(t *testing.T) {
	state := t.TempDir()
	mk := func(ns, id, pid, options string) {
		dir := filepath.Join(state, taskDirName, ns, id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		spec := `{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=all"]},"annotations":{"io.kubernetes.cri.sandbox-namespace":"ml","io.kubernetes.cri.sandbox-name":"train","io.kubernetes.cri.container-name":"cuda"}}`
		for name, content := range map[string]string{"config.json": spec, "init.pid": pid, "options.json": options} {
			if content != "" {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	mk("default", "abc123", "4242", `{"binary_name":"/usr/bin/gantry-runtime"}`)
	mk("k8s.io", "abd456", "", "")
	mk("k8s.io", "ffff", "17", "")

	got, err := findTask(state, "", "abc123")
	if err != nil || got.Namespace != "default" || got.Pid != 4242 || got.Binary != "/usr/bin/gantry-runtime" || got.Spec == nil {
		t.Fatalf("exact: %+v, %v", got, err)
	}
	if got, err := findTask(state, "", "ff"); err != nil || got.ID != "ffff" || got.Namespace != "k8s.io" || got.Pid != 17 {
		t.Fatalf("prefix: %+v, %v", got, err)
	}
	if _, err := findTask(state, "", "ab"); err == nil || !strings.Contains(err.Error(), "ambiguous") ||
		!strings.Contains(err.Error(), "default/abc123") || !strings.Contains(err.Error(), "k8s.io/abd456") {
		t.Fatalf("ambiguous prefix: %v", err)
	}
	if got, err := findTask(state, "k8s.io", "ab"); err != nil || got.ID != "abd456" {
		t.Fatalf("prefix in one namespace: %+v, %v", got, err)
	}
	if _, err := findTask(state, "moby", "abc123"); err == nil || !strings.Contains(err.Error(), filepath.Join(state, taskDirName, "moby")) {
		t.Fatalf("wrong namespace: %v", err)
	}
	if _, err := findTask(filepath.Join(state, "nope"), "", "abc123"); err == nil || !strings.Contains(err.Error(), "no containerd task") {
		t.Fatalf("no state directory: %v", err)
	}
	ns, pod, c := podOf(got.Spec)
	if ns != "ml" || pod != "train" || c != "cuda" {
		t.Errorf("podOf: %q %q %q", ns, pod, c)
	}
	fx := taskFixes(got, ns, pod)
	if !strings.Contains(fx.restart, "kubectl delete pod -n ml train") {
		t.Errorf("pod fix: %q", fx.restart)
	}
	fx = taskFixes(&task{Namespace: "default", ID: "abc123"}, "", "")
	if !strings.Contains(fx.restart, "ctr -n default task kill -s SIGKILL abc123") {
		t.Errorf("task fix: %q", fx.restart)
	}
}
