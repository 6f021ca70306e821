package edits

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/request"
)

func list(ids ...string) request.Selection { return request.Selection{Mode: request.List, IDs: ids} }

func TestResolve(t *testing.T) {
	sys := testSystem()
	tests := []struct {
		name    string
		sel     request.Selection
		want    []string // Selected.Name()s
		wantErr string   // substring; "" = no error
	}{
		{"void", request.Selection{Mode: request.Void}, nil, ""},
		{"none", request.Selection{Mode: request.None}, nil, ""},
		{"all mode", request.Selection{Mode: request.All}, []string{"0", "1", "1:0", "1:1"}, ""},
		{"all in list", list("ALL"), []string{"0", "1", "1:0", "1:1"}, ""},
		{"index", list("1"), []string{"1"}, ""},
		{"index leading zero", list("01"), []string{"1"}, ""},
		{"order kept, duplicates removed", list("1", "0", "1"), []string{"1", "0"}, ""},
		{"uuid any case", list("gpu-0AAAAAAA-1111-2222-3333-444444444444"), []string{"0"}, ""},
		{"uuid and index are the same device", list("GPU-0aaaaaaa-1111-2222-3333-444444444444", "0"), []string{"0"}, ""},
		{"pci bus id short form", list("0:2a:0.0"), []string{"1"}, ""},
		{"pci bus id full form", list("00000000:18:00.0"), []string{"0"}, ""},
		{"mig pair", list("1:1"), []string{"1:1"}, ""},
		{"mig uuid", list("mig-10000000-AAAA-bbbb-cccc-dddddddddddd"), []string{"1:0"}, ""},
		{"empty entries skipped", list("", " 0 "), []string{"0"}, ""},
		{"unknown index", list("7"), nil, `"7"`},
		{"uuid prefix is not enough", list("GPU-0aaaaaaa"), nil, `"GPU-0aaaaaaa"`},
		{"signed index", list("+1"), nil, `"+1"`},
		{"mig on whole gpu", list("0:0"), nil, `"0:0"`},
		{"mig index out of range", list("1:2"), nil, `"1:2"`},
		{"unknown mig uuid", list("MIG-nope"), nil, `"MIG-nope"`},
		{"unknown pci", list("0:99:0.0"), nil, `"0:99:0.0"`},
		{"one bad id fails the list", list("0", "bogus"), nil, `"bogus"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Resolve(sys, tt.sel)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrUnknownDevice) {
					t.Fatalf("err = %v, want ErrUnknownDevice", err)
				}
				msg := err.Error()
				for _, s := range []string{tt.wantErr, "0=GPU-0aaaaaaa-1111-2222-3333-444444444444", "1:1=MIG-11111111"} {
					if !strings.Contains(msg, s) {
						t.Errorf("error %q does not mention %s", msg, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range got {
				names = append(names, s.Name())
			}
			if !slices.Equal(names, tt.want) {
				t.Errorf("got %v, want %v", names, tt.want)
			}
		})
	}
}

func TestResolveNoGPUs(t *testing.T) {
	_, err := Resolve(nil, list("0"))
	if !errors.Is(err, ErrUnknownDevice) || !strings.Contains(err.Error(), "no GPUs") {
		t.Fatalf("err = %v", err)
	}
}

func TestForDevicesNodes(t *testing.T) {
	devRoot := makeDevRoot(t)
	sys := testSystem()
	tests := []struct {
		name string
		sel  request.Selection
		want []string // "path major:minor"
	}{
		{"gpu", list("0"), []string{"/dev/nvidia0 195:0"}},
		{"mig brings parent and both caps", list("1:0"), []string{
			"/dev/nvidia-caps/nvidia-cap147 236:147", "/dev/nvidia-caps/nvidia-cap148 236:148", "/dev/nvidia1 195:1"}},
		{"two migs share the parent node", list("1:0", "MIG-11111111-aaaa-bbbb-cccc-dddddddddddd"), []string{
			"/dev/nvidia-caps/nvidia-cap147 236:147", "/dev/nvidia-caps/nvidia-cap148 236:148",
			"/dev/nvidia-caps/nvidia-cap156 236:156", "/dev/nvidia-caps/nvidia-cap157 236:157", "/dev/nvidia1 195:1"}},
		{"none", request.Selection{Mode: request.None}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, e, err := ForDevices(sys, tt.sel, devRoot)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range e.DeviceNodes {
				got = append(got, n.Path+" "+itoa(n.Major)+":"+itoa(n.Minor))
				if n.Type != "c" || n.Permissions != "rwm" {
					t.Errorf("%s: type %q perms %q, want c rwm", n.Path, n.Type, n.Permissions)
				}
				if want := filepath.Join(devRoot, n.Path); n.HostPath != want {
					t.Errorf("%s: host path %q, want %q", n.Path, n.HostPath, want)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("nodes %v, want %v", got, tt.want)
			}
		})
	}
}

func TestForDevicesMissingNode(t *testing.T) {
	devRoot := t.TempDir() // no nodes at all
	_, _, err := ForDevices(testSystem(), list("0"), devRoot)
	if err == nil || !strings.Contains(err.Error(), "GPU-0aaaaaaa") {
		t.Fatalf("err = %v, want an error naming the device", err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func mountPaths(e *Edits) []string {
	var out []string
	for _, m := range e.Mounts {
		out = append(out, m.ContainerPath)
	}
	return out
}

func nodePaths(e *Edits) []string {
	var out []string
	for _, n := range e.DeviceNodes {
		out = append(out, n.Path)
	}
	return out
}

func TestCommonCapabilities(t *testing.T) {
	inv := testInventory()
	const lib = "/usr/lib/x86_64-linux-gnu/"
	tests := []struct {
		name       string
		caps       []driver.Capability
		wantMounts []string
		wantNodes  []string
	}{
		{
			name:       "no capabilities: firmware and nvidiactl only",
			caps:       nil,
			wantMounts: []string{"/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin"},
			wantNodes:  []string{"/dev/nvidiactl"},
		},
		{
			name: "utility",
			caps: []driver.Capability{driver.Utility},
			wantMounts: []string{"/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin", "/run/nvidia-persistenced/socket",
				"/usr/bin/nvidia-smi", lib + "libnvidia-ml.so.550.54.15"},
			wantNodes: []string{"/dev/nvidiactl"},
		},
		{
			name: "compute brings uvm and the mps pipe, not compat32",
			caps: []driver.Capability{driver.Compute},
			wantMounts: []string{"/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin", "/tmp/nvidia-mps",
				"/usr/bin/nvidia-cuda-mps-control", lib + "libcuda.so.550.54.15"},
			wantNodes: []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"},
		},
		{
			name:       "display brings modeset",
			caps:       []driver.Capability{driver.Display},
			wantMounts: []string{"/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin"},
			wantNodes:  []string{"/dev/nvidia-modeset", "/dev/nvidiactl"},
		},
		{
			name: "graphics and compat32",
			caps: []driver.Capability{driver.Graphics, driver.Compat32},
			wantMounts: []string{"/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin",
				"/usr/lib/i386-linux-gnu/libcuda.so.550.54.15",
				lib + "libEGL_nvidia.so.550.54.15", lib + "libGLX_nvidia.so.550.54.15",
				"/usr/share/vulkan/icd.d/nvidia_icd.json"},
			wantNodes: []string{"/dev/nvidiactl"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := Common(inv, tt.caps)
			if got := mountPaths(e); !slices.Equal(got, tt.wantMounts) {
				t.Errorf("mounts:\n got %v\nwant %v", got, tt.wantMounts)
			}
			if got := nodePaths(e); !slices.Equal(got, tt.wantNodes) {
				t.Errorf("nodes:\n got %v\nwant %v", got, tt.wantNodes)
			}
		})
	}
}

func TestCommonMountOptionsAndLinks(t *testing.T) {
	e := Common(testInventory(), driver.AllCapabilities)
	for _, m := range e.Mounts {
		want := ReadOnlyOptions
		if strings.HasPrefix(m.ContainerPath, "/run/") || strings.HasPrefix(m.ContainerPath, "/tmp/") {
			want = SocketOptions
		}
		if !slices.Equal(m.Options, want) {
			t.Errorf("%s: options %v, want %v", m.ContainerPath, m.Options, want)
		}
		if !strings.HasPrefix(m.HostPath, "/run/nvidia/driver/") {
			t.Errorf("%s: host path %s lacks the driver root", m.ContainerPath, m.HostPath)
		}
	}
	const lib = "/usr/lib/x86_64-linux-gnu/"
	wantLinks := []Symlink{
		{"libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so"},
		{"libcuda.so.550.54.15", "/usr/lib/i386-linux-gnu/libcuda.so.1"},
		{"libEGL_nvidia.so.550.54.15", lib + "libEGL_nvidia.so.0"},
		{"libGLX_nvidia.so.550.54.15", lib + "libGLX_indirect.so.0"},
		{"libGLX_nvidia.so.550.54.15", lib + "libGLX_nvidia.so.0"},
		{"libcuda.so.1", lib + "libcuda.so"},
		{"libcuda.so.550.54.15", lib + "libcuda.so.1"},
		{"libnvidia-ml.so.550.54.15", lib + "libnvidia-ml.so.1"},
		{"libnvidia-opticalflow.so.1", lib + "libnvidia-opticalflow.so"},
		{"libnvidia-opticalflow.so.550.54.15", lib + "libnvidia-opticalflow.so.1"},
	}
	if !reflect.DeepEqual(e.Symlinks, wantLinks) {
		t.Errorf("symlinks:\n got %v\nwant %v", e.Symlinks, wantLinks)
	}
	if want := []string{"/usr/lib/i386-linux-gnu", "/usr/lib/x86_64-linux-gnu"}; !slices.Equal(e.LibraryDirs, want) {
		t.Errorf("library dirs %v, want %v", e.LibraryDirs, want)
	}
	if Common(nil, driver.AllCapabilities).Empty() != true {
		t.Error("Common(nil) is not empty")
	}
}

func TestMergeDedupes(t *testing.T) {
	a := &Edits{
		Env:         []string{"B=1", "A=1"},
		DeviceNodes: []DeviceNode{{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 1}},
		Mounts:      []Mount{{HostPath: "/h/x", ContainerPath: "/x", Options: []string{"ro"}}},
		Symlinks:    []Symlink{{Target: "a", Link: "/l"}},
		LibraryDirs: []string{"/lib", "/lib64"},
	}
	b := &Edits{
		Env:         []string{"A=2"},
		DeviceNodes: []DeviceNode{{Path: "/dev/nvidia0", Type: "c", Major: 195}, {Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 1}},
		Mounts:      []Mount{{HostPath: "/h/x2", ContainerPath: "/x", Options: []string{"rw"}}, {HostPath: "/h/a", ContainerPath: "/a"}},
		Symlinks:    []Symlink{{Target: "b", Link: "/l"}},
		LibraryDirs: []string{"/lib"},
	}
	got := a.Clone().Merge(b)
	want := &Edits{
		Env: []string{"A=2", "B=1"},
		DeviceNodes: []DeviceNode{{Path: "/dev/nvidia0", Type: "c", Major: 195},
			{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 1}},
		Mounts:      []Mount{{HostPath: "/h/a", ContainerPath: "/a"}, {HostPath: "/h/x2", ContainerPath: "/x", Options: []string{"rw"}}},
		Symlinks:    []Symlink{{Target: "b", Link: "/l"}},
		LibraryDirs: []string{"/lib", "/lib64"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("merge:\n got %+v\nwant %+v", got, want)
	}
	// Merging in the other order gives the same lists, apart from who wins.
	rev := b.Clone().Merge(a)
	if !slices.Equal(nodePaths(rev), nodePaths(want)) || !slices.Equal(rev.LibraryDirs, want.LibraryDirs) {
		t.Errorf("merge is order dependent: %+v", rev)
	}
	if a.Env[0] != "B=1" || len(a.DeviceNodes) != 1 {
		t.Errorf("Merge into a clone changed the original: %+v", a)
	}
	var nilEdits *Edits
	if got := nilEdits.Merge(b); len(got.DeviceNodes) != 2 {
		t.Errorf("nil.Merge = %+v", got)
	}
}

func sampleEdits() *Edits {
	return &Edits{
		Env: []string{"NVIDIA_VISIBLE_DEVICES=void", "NEW=1"},
		DeviceNodes: []DeviceNode{
			{Path: "/dev/nvidia0", HostPath: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0, Permissions: "rwm"},
			{Path: "/dev/nvidiactl", Type: "c", Major: 195, Minor: 255, FileMode: 0o666},
		},
		Mounts: []Mount{
			{HostPath: "/drv/usr/lib/libcuda.so.1", ContainerPath: "/usr/lib/libcuda.so.1", Options: ReadOnlyOptions},
			{HostPath: "/drv/usr/bin/nvidia-smi", ContainerPath: "/usr/bin/nvidia-smi", Options: ReadOnlyOptions},
		},
		Symlinks:    []Symlink{{Target: "libcuda.so.1", Link: "/usr/lib/libcuda.so"}},
		LibraryDirs: []string{"/usr/lib"},
	}
}

func TestApplyToSpec(t *testing.T) {
	spec := &ocispecs.Spec{
		Process: &ocispecs.Process{
			User: ocispecs.User{UID: 1000, GID: 1000},
			Env:  []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=0"},
		},
		Mounts: []ocispecs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux: &ocispecs.Linux{Resources: &ocispecs.LinuxResources{Devices: []ocispecs.LinuxDeviceCgroup{
			{Allow: false, Access: "rwm"},
		}}},
	}
	e := sampleEdits()
	if err := e.ApplyToSpec(spec); err != nil {
		t.Fatal(err)
	}
	if want := []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void", "NEW=1"}; !slices.Equal(spec.Process.Env, want) {
		t.Errorf("env %v, want %v", spec.Process.Env, want)
	}
	if len(spec.Linux.Devices) != 2 || spec.Linux.Devices[0].Path != "/dev/nvidia0" || *spec.Linux.Devices[0].UID != 1000 {
		t.Errorf("devices %+v", spec.Linux.Devices)
	}
	if m := spec.Linux.Devices[1].FileMode; m == nil || *m != 0o666 {
		t.Errorf("nvidiactl file mode %v, want 0666", m)
	}
	rules := spec.Linux.Resources.Devices
	if len(rules) != 3 || !rules[1].Allow || *rules[1].Major != 195 || *rules[2].Minor != 255 || rules[2].Access != "rwm" {
		t.Errorf("cgroup rules %+v", rules)
	}
	if len(spec.Mounts) != 3 || spec.Mounts[1].Type != "bind" || spec.Mounts[1].Source != "/drv/usr/lib/libcuda.so.1" {
		t.Errorf("mounts %+v", spec.Mounts)
	}

	// A second application changes nothing.
	once := deepCopySpec(t, spec)
	if err := e.ApplyToSpec(spec); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(once, spec) {
		t.Errorf("second ApplyToSpec changed the spec:\nonce %+v\ntwice %+v", once.Linux, spec.Linux)
	}
}

func TestApplyToSpecRuleAfterDeny(t *testing.T) {
	maj, min := int64(195), int64(0)
	spec := &ocispecs.Spec{Linux: &ocispecs.Linux{Resources: &ocispecs.LinuxResources{Devices: []ocispecs.LinuxDeviceCgroup{
		{Allow: true, Type: "c", Major: &maj, Minor: &min, Access: "rwm"},
		{Allow: false, Access: "rwm"}, // a later deny-all cancels the earlier allow
	}}}}
	e := &Edits{DeviceNodes: []DeviceNode{{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0}}}
	if err := e.ApplyToSpec(spec); err != nil {
		t.Fatal(err)
	}
	rules := spec.Linux.Resources.Devices
	if len(rules) != 3 || !rules[2].Allow {
		t.Errorf("allow rule not re-added after the deny: %+v", rules)
	}
}

// NoCgroups (runtime.no-cgroups, rootless engines): the node is in the
// spec, no allow rule is added and an existing rule list is left as it was.
func TestApplyToSpecNoCgroups(t *testing.T) {
	e := &Edits{DeviceNodes: []DeviceNode{{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0}}}
	spec := &ocispecs.Spec{Linux: &ocispecs.Linux{}}
	if err := e.ApplyToSpecWith(spec, SpecOptions{NoCgroups: true}); err != nil {
		t.Fatal(err)
	}
	if len(spec.Linux.Devices) != 1 || spec.Linux.Devices[0].Path != "/dev/nvidia0" || spec.Linux.Resources != nil {
		t.Errorf("devices %+v, resources %+v", spec.Linux.Devices, spec.Linux.Resources)
	}
	if err := e.ApplyToSpec(spec); err != nil {
		t.Fatal(err)
	}
	if spec.Linux.Resources == nil || len(spec.Linux.Resources.Devices) != 1 {
		t.Errorf("without NoCgroups: resources %+v", spec.Linux.Resources)
	}
}

func TestApplyToSpecErrors(t *testing.T) {
	tests := []struct {
		name string
		e    *Edits
	}{
		{"env without =", &Edits{Env: []string{"FOO"}}},
		{"env without key", &Edits{Env: []string{"=x"}}},
		{"relative node", &Edits{DeviceNodes: []DeviceNode{{Path: "dev/nvidia0", Type: "c"}}}},
		{"bad node type", &Edits{DeviceNodes: []DeviceNode{{Path: "/dev/nvidia0", Type: "x"}}}},
		{"unclean mount", &Edits{Mounts: []Mount{{HostPath: "/a", ContainerPath: "/usr/../etc/passwd"}}}},
		{"relative host path", &Edits{Mounts: []Mount{{HostPath: "a", ContainerPath: "/a"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := &ocispecs.Spec{}
			if err := tt.e.ApplyToSpec(spec); !errors.Is(err, ErrInvalidEdits) {
				t.Fatalf("err = %v, want ErrInvalidEdits", err)
			}
			if !reflect.DeepEqual(spec, &ocispecs.Spec{}) {
				t.Errorf("failed ApplyToSpec changed the spec: %+v", spec)
			}
		})
	}
	if err := sampleEdits().ApplyToSpec(nil); !errors.Is(err, ErrInvalidEdits) {
		t.Errorf("nil spec: err = %v", err)
	}
	var nilEdits *Edits
	if err := nilEdits.ApplyToSpec(&ocispecs.Spec{}); err != nil {
		t.Errorf("nil edits: %v", err)
	}
}

func TestCDIConversion(t *testing.T) {
	e := sampleEdits()
	tests := []struct {
		hookPath string
		wantBase []string
	}{
		{"/usr/bin/gantry-cdi-hook", []string{"gantry-cdi-hook"}},
		{"/usr/bin/gantry", []string{"gantry", "hook"}},
		{"/usr/bin/nvidia-cdi-hook", []string{"nvidia-cdi-hook"}},
		{"", nil},
	}
	for _, tt := range tests {
		t.Run(tt.hookPath, func(t *testing.T) {
			c := e.CDI(tt.hookPath)
			if tt.hookPath == "" {
				if len(c.Hooks) != 0 {
					t.Fatalf("hooks without a hook path: %+v", c.Hooks)
				}
				return
			}
			if len(c.Hooks) != 2 {
				t.Fatalf("hooks %+v", c.Hooks)
			}
			want0 := append(slices.Clone(tt.wantBase), "create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so")
			want1 := append(slices.Clone(tt.wantBase), "update-ldcache", "--folder", "/usr/lib")
			for i, want := range [][]string{want0, want1} {
				h := c.Hooks[i]
				if h.HookName != "createContainer" || h.Path != tt.hookPath || !slices.Equal(h.Args, want) {
					t.Errorf("hook %d = %+v, want args %v", i, h, want)
				}
				// A hook without env would run with the image's.
				if !slices.Equal(h.Env, []string{HookPATH}) {
					t.Errorf("hook %d env %q, want only %q", i, h.Env, HookPATH)
				}
			}
		})
	}
	c := e.CDI("/x")
	if c.DeviceNodes[0].HostPath != "" {
		t.Errorf("HostPath equal to Path kept: %+v", c.DeviceNodes[0])
	}
	if m := c.DeviceNodes[1].FileMode; m == nil || *m != 0o666 {
		t.Errorf("file mode not carried: %+v", c.DeviceNodes[1])
	}
	if c.DeviceNodes[0].Permissions != "rwm" || len(c.Mounts) != 2 || !slices.Equal(c.Env, e.Env) {
		t.Errorf("CDI edits %+v", c)
	}
	// The conversion copies: changing it leaves e alone.
	c.Mounts[0].Options[0] = "rw"
	if e.Mounts[0].Options[0] != "ro" {
		t.Error("CDI() shares mount options with the edits")
	}
}

// deepCopySpec copies an OCI spec through JSON, its wire format.
func deepCopySpec(t *testing.T, s *ocispecs.Spec) *ocispecs.Spec {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var out ocispecs.Spec
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}
