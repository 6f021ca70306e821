package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// addFeatureNodes makes the device nodes of GPUDirect Storage, MOFED,
// GDRCopy, NVSwitch and two IMEX channels under the fixture's device root
// (real character devices; majors as such drivers get them at load).
func addFeatureNodes(t *testing.T, devRoot string) {
	t.Helper()
	for path, dev := range map[string][2]uint32{
		"nvidia-fs0": {246, 0}, "nvidia-fs1": {246, 1},
		"infiniband/uverbs0": {231, 192}, "infiniband/rdma_cm": {10, 58},
		"gdrdrv":             {240, 0},
		"nvidia-nvswitchctl": {247, 255}, "nvidia-nvswitch0": {247, 0},
		"nvidia-caps-imex-channels/channel0": {508, 0}, "nvidia-caps-imex-channels/channel1": {508, 1},
	} {
		p := filepath.Join(devRoot, "dev", path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(dev[0], dev[1])))
		if err != nil && !errors.Is(err, unix.EEXIST) {
			t.Fatalf("mknod %s: %v", p, err)
		}
	}
}

// The device classes NVIDIA_GDS, NVIDIA_MOFED, NVIDIA_GDRCOPY,
// NVIDIA_NVSWITCH (=enabled) and NVIDIA_IMEX_CHANNELS bring, in a real
// runc container; none of them without a GPU request.
func TestFeatureDevices(t *testing.T) {
	f := need(t)
	addFeatureNodes(t, f.driver.Root)
	const list = `ls -1 /dev /dev/infiniband /dev/nvidia-caps-imex-channels 2>&1; true`
	c := newContainer(t, opts{
		env: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_GDS=enabled", "NVIDIA_MOFED=enabled", "NVIDIA_GDRCOPY=enabled",
			"NVIDIA_NVSWITCH=enabled", "NVIDIA_IMEX_CHANNELS=1"},
		args: []string{"sh", "-c", list},
	})
	out, stderr, err := c.run()
	if err != nil {
		t.Fatalf("gantry-runtime run: %v\n%s\n%s", err, out, stderr)
	}
	lines := strings.Fields(out)
	for _, want := range []string{"nvidia-fs0", "nvidia-fs1", "uverbs0", "rdma_cm", "gdrdrv", "nvidia-nvswitchctl", "nvidia-nvswitch0", "channel1", "nvidia0"} {
		if !slices.Contains(lines, want) {
			t.Errorf("%s missing in the container:\n%s", want, out)
		}
	}
	if slices.Contains(lines, "channel0") {
		t.Errorf("IMEX channel 0 was not asked for:\n%s", out)
	}

	// "enabled" only, as NVIDIA's runtime reads them; no GPU, no features.
	for _, env := range [][]string{
		{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_GDS=true", "NVIDIA_MOFED=1"},
		{"NVIDIA_GDS=enabled", "NVIDIA_MOFED=enabled", "NVIDIA_IMEX_CHANNELS=all"},
	} {
		c := newContainer(t, opts{env: env, args: []string{"sh", "-c", list}})
		out, stderr, err := c.run()
		if err != nil {
			t.Fatalf("%v: %v\n%s\n%s", env, err, out, stderr)
		}
		for _, absent := range []string{"nvidia-fs0", "uverbs0", "channel0", "channel1"} {
			if slices.Contains(strings.Fields(out), absent) {
				t.Errorf("%v: %s in the container:\n%s", env, absent, out)
			}
		}
	}
}

// An enabled feature whose devices the host lacks refuses the container
// with the variable's name, and a bad IMEX list names the variable too.
func TestFeatureMissingRefused(t *testing.T) {
	f := need(t)
	addFeatureNodes(t, f.driver.Root)
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=7"}, "NVIDIA_IMEX_CHANNELS: channel 7"},
		{[]string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=one"}, `NVIDIA_IMEX_CHANNELS="one"`},
	} {
		c := newContainer(t, opts{env: tc.env, args: []string{"true"}})
		out, stderr, err := c.run()
		if err == nil || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: err %v, want an error naming %q\n%s\n%s", tc.env, err, tc.want, out, stderr)
		}
	}
}

// The DRM nodes of the requested GPU (matched through udev's by-path links
// by PCI address) for graphics and display; none for compute only, and
// none of another GPU.
func TestDRINodes(t *testing.T) {
	f := need(t)
	dri := filepath.Join(f.driver.Root, "dev", "dri")
	if err := os.MkdirAll(filepath.Join(dri, "by-path"), 0o755); err != nil {
		t.Fatal(err)
	}
	// sim:h100x8's GPU 0 is 00000000:1B:00.0, GPU 1 00000000:43:00.0.
	for i, addr := range []string{"0000:1b:00.0", "0000:43:00.0"} {
		card, render := fmt.Sprintf("card%d", i+1), fmt.Sprintf("renderD%d", 128+i)
		for _, n := range []struct {
			name  string
			minor uint32
		}{{card, uint32(i + 1)}, {render, uint32(128 + i)}} {
			err := unix.Mknod(filepath.Join(dri, n.name), unix.S_IFCHR|0o666, int(unix.Mkdev(226, n.minor)))
			if err != nil && !errors.Is(err, unix.EEXIST) {
				t.Fatal(err)
			}
		}
		for kind, target := range map[string]string{"card": card, "render": render} {
			link := filepath.Join(dri, "by-path", "pci-"+addr+"-"+kind)
			if err := os.Symlink("../"+target, link); err != nil && !errors.Is(err, os.ErrExist) {
				t.Fatal(err)
			}
		}
	}
	run := func(caps string) []string {
		t.Helper()
		c := newContainer(t, opts{
			env:  []string{"NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=" + caps},
			args: []string{"sh", "-c", "ls -1 /dev/dri 2>&1; true"},
		})
		out, stderr, err := c.run()
		if err != nil {
			t.Fatalf("%s: %v\n%s\n%s", caps, err, out, stderr)
		}
		return strings.Fields(out)
	}
	if got := run("graphics,utility"); !slices.Contains(got, "card2") || !slices.Contains(got, "renderD129") || slices.Contains(got, "card1") {
		t.Errorf("graphics on GPU 1: /dev/dri %v, want card2 and renderD129 only", got)
	}
	if got := run("compute,utility"); slices.Contains(got, "card2") || slices.Contains(got, "renderD129") {
		t.Errorf("compute only: /dev/dri %v, want no DRM node", got)
	}
}

// At log-level debug the runtime's log line names every node, mount and
// library folder it injected, host side and container side; at the default
// level it does not.
func TestDebugLogNamesInjected(t *testing.T) {
	for _, debug := range []bool{true, false} {
		// A mount per file: the log names each library's mount.
		c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}, args: []string{"true"}, config: `driver-layout = "files"`})
		if debug {
			b, err := os.ReadFile(c.config)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(c.config, append([]byte("log-level = \"debug\"\n"), b...), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if out, stderr, err := c.run(); err != nil {
			t.Fatalf("%v\n%s\n%s", err, out, stderr)
		}
		logged, err := os.ReadFile(filepath.Join(filepath.Dir(c.config), "gantry.log"))
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			Injected *struct {
				DeviceNodes []string `json:"device_nodes"`
				Mounts      []string `json:"mounts"`
				LibraryDirs []string `json:"library_dirs"`
			} `json:"injected"`
		}
		if err := json.Unmarshal(logged, &rec); err != nil {
			t.Fatalf("log line %q: %v", logged, err)
		}
		if !debug {
			if rec.Injected != nil {
				t.Errorf("the default log level names the injected files: %s", logged)
			}
			continue
		}
		if rec.Injected == nil {
			t.Fatalf("log-level debug: no injected detail in %s", logged)
		}
		nodes := strings.Join(rec.Injected.DeviceNodes, " ")
		mounts := strings.Join(rec.Injected.Mounts, " ")
		if !strings.Contains(nodes, "/dev/nvidia1 (") || strings.Contains(nodes, "/dev/nvidia0 (") || !strings.Contains(mounts, "libcuda.so") ||
			!strings.Contains(mounts, "libnvidia-ml.so") || len(rec.Injected.LibraryDirs) == 0 {
			t.Errorf("debug log line does not name what was injected for GPU 1 (nodes %q, mounts %q, dirs %v)", nodes, mounts, rec.Injected.LibraryDirs)
		}
	}
}

// runtime.no-cgroups = true (NVIDIA's nvidia-container-cli.no-cgroups, for
// rootless engines): the GPU's node is in the container but the spec gets
// no device cgroup rule for it, so a rootful runc, whose cgroup allows only
// what the spec lists, refuses opening it; without the key it opens as far
// as the (absent) driver.
func TestNoCgroupsConfig(t *testing.T) {
	const script = `ls /dev; echo "open0: $(head -c1 /dev/nvidia0 2>&1)"`
	for _, tc := range []struct{ config, want string }{
		{"no-cgroups = true", "Operation not permitted"},
		{"", "No such device or address"},
	} {
		c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"sh", "-c", script}, config: tc.config})
		out, stderr, err := c.run()
		if err != nil {
			t.Fatalf("%q: gantry-runtime run: %v\n%s\n%s", tc.config, err, out, stderr)
		}
		if !slices.Contains(strings.Fields(out), "nvidia0") || !strings.Contains(out, "open0: head: /dev/nvidia0: "+tc.want) {
			t.Errorf("%q: want nvidia0 and open0 %q:\n%s", tc.config, tc.want, out)
		}
	}
}
