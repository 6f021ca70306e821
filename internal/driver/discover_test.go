package driver_test

import (
	"errors"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

// buildRoot makes a fake driver root, skipping when gcc is missing. The
// host's own version files are hidden so a GPU test machine's driver does
// not decide the version.
func buildRoot(t testing.TB, opts fakedriver.Options) (string, *fakedriver.Result) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not found: needed to build a fake driver root")
	}
	driver.SetHostVersionFiles(t)
	root := t.TempDir()
	res, err := fakedriver.Build(root, opts)
	if err != nil {
		t.Fatal(err)
	}
	return root, res
}

func byContainerPath(files []driver.File) map[string]driver.File {
	m := map[string]driver.File{}
	for _, f := range files {
		m[f.ContainerPath] = f
	}
	return m
}

// TestDiscoverLayouts checks that every library the fake driver has is
// found, with its SONAME, capability and paths, in both layouts.
func TestDiscoverLayouts(t *testing.T) {
	for _, layout := range []string{fakedriver.LayoutStandard, fakedriver.LayoutGKE} {
		t.Run(layout, func(t *testing.T) {
			root, res := buildRoot(t, fakedriver.Options{Layout: layout, Compat32: true, DeviceNodes: true, GPUs: 2})
			if !res.LDCache {
				t.Logf("no ld.so.cache (%v): testing the directory search only", res.Notes)
			}
			inv, err := driver.Discover(driver.Options{Root: root})
			if err != nil {
				t.Fatal(err)
			}
			if inv.Version != fakedriver.DefaultVersion || inv.Root != root {
				t.Errorf("Version, Root = %q, %q", inv.Version, inv.Root)
			}
			if len(inv.Missing) != 0 && res.RealDeviceNodes {
				t.Errorf("Missing = %v, want none", inv.Missing)
			}
			libs := byContainerPath(inv.Libraries)
			for _, want := range res.Libraries {
				got, ok := libs[want.Path]
				if !ok {
					t.Errorf("library %s (%s) not found", want.Path, want.Capability)
					continue
				}
				if got.SONAME != want.SONAME || got.Capability != want.Capability || got.Kind != driver.KindLibrary {
					t.Errorf("library %s = %+v, want SONAME %s capability %s", want.Path, got, want.SONAME, want.Capability)
				}
				if got.HostPath != filepath.Join(root, want.Path) {
					t.Errorf("library %s HostPath = %s", want.Path, got.HostPath)
				}
				delete(libs, want.Path)
			}
			for p := range libs {
				t.Errorf("unexpected library %s", p)
			}
			// Every capability but display has libraries.
			for _, c := range driver.AllCapabilities {
				n := 0
				for _, f := range inv.Libraries {
					if f.Capability == c {
						n++
					}
				}
				if c != driver.Display && n == 0 {
					t.Errorf("no %s libraries", c)
				}
			}
			if !slices.IsSortedFunc(inv.Libraries, func(a, b driver.File) int { return strings.Compare(a.ContainerPath, b.ContainerPath) }) {
				t.Error("libraries not sorted by ContainerPath")
			}

			// Binaries go to /usr/bin and are the real programs: on the GKE
			// layout /usr/bin/nvidia-smi is a wrapper script to pass over.
			bins := byContainerPath(inv.Binaries)
			for _, want := range res.Binaries {
				name := path.Base(want)
				got, ok := bins["/usr/bin/"+name]
				if !ok || got.HostPath != filepath.Join(root, want) {
					t.Errorf("binary %s = %+v, want HostPath %s", name, got, filepath.Join(root, want))
				}
			}
			if bins["/usr/bin/nvidia-smi"].Capability != driver.Utility || bins["/usr/bin/nvidia-cuda-mps-control"].Capability != driver.Compute {
				t.Errorf("binary capabilities wrong: %+v", inv.Binaries)
			}

			if len(inv.Firmware) != len(res.Firmware) {
				t.Errorf("firmware = %+v, want %v", inv.Firmware, res.Firmware)
			}
			for _, f := range inv.Firmware {
				if !strings.HasPrefix(f.ContainerPath, "/lib/firmware/nvidia/"+inv.Version+"/gsp") || f.Capability != "" {
					t.Errorf("firmware %+v", f)
				}
			}

			cfg := byContainerPath(inv.Configs)
			for _, p := range []string{
				"/usr/share/vulkan/icd.d/nvidia_icd.json",
				"/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
				"/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
				"/usr/lib/xorg/modules/drivers/nvidia_drv.so",
				"/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so." + inv.Version,
				path.Join(res.LibDir, "gbm/nvidia-drm_gbm.so"),
			} {
				f, ok := cfg[p]
				if !ok {
					t.Errorf("config %s not found; have %v", p, inv.Configs)
					continue
				}
				if f.Kind != driver.KindConfig || !strings.HasPrefix(f.HostPath, root+"/") {
					t.Errorf("config %+v", f)
				}
			}
			if layout == fakedriver.LayoutGKE {
				// The loader's path, the driver tree's file.
				if got := cfg["/usr/share/vulkan/icd.d/nvidia_icd.json"].HostPath; got != filepath.Join(root, "usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json") {
					t.Errorf("GKE Vulkan ICD HostPath = %s", got)
				}
			}

			if len(inv.Sockets) != 1 || inv.Sockets[0].ContainerPath != "/run/nvidia-persistenced/socket" || inv.Sockets[0].Capability != driver.Utility {
				t.Errorf("sockets = %+v", inv.Sockets)
			}

			if res.RealDeviceNodes {
				devs := byContainerPath(inv.DeviceNodes)
				for p, want := range map[string][2]int64{
					"/dev/nvidiactl":        {fakedriver.NvidiaMajor, 255},
					"/dev/nvidia-modeset":   {fakedriver.NvidiaMajor, 254},
					"/dev/nvidia-uvm":       {fakedriver.UVMMajor, 0},
					"/dev/nvidia-uvm-tools": {fakedriver.UVMMajor, 1},
				} {
					got := devs[p]
					if got.Major != want[0] || got.Minor != want[1] || got.HostPath != filepath.Join(root, p) {
						t.Errorf("device %s = %+v, want %d:%d", p, got, want[0], want[1])
					}
				}
				if len(inv.DeviceNodes) != 4 {
					t.Errorf("device nodes = %+v, want the 4 control nodes", inv.DeviceNodes)
				}
			}
		})
	}
}

// TestFiles checks the capability filter.
func TestFiles(t *testing.T) {
	root, res := buildRoot(t, fakedriver.Options{Compat32: true, DeviceNodes: true})
	inv, err := driver.Discover(driver.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	devs := map[string]bool{"nvidiactl": true, "nvidia-uvm": true, "nvidia-modeset": true}
	if got, want := len(inv.Files(driver.AllCapabilities)), len(inv.All()); got != want {
		t.Errorf("Files(all) has %d files, All has %d", got, want)
	}
	tests := []struct {
		caps        []driver.Capability
		want, never []string // base names
	}{
		{caps: []driver.Capability{driver.Utility},
			want:  []string{"libnvidia-ml.so." + inv.Version, "nvidia-smi", "nvidiactl", "socket", "gsp_ga10x.bin"},
			never: []string{"libcuda.so." + inv.Version, "nvidia-uvm", "nvidia-cuda-mps-control", "nvidia_icd.json"}},
		{caps: driver.DefaultCapabilities,
			want:  []string{"libcuda.so." + inv.Version, "libnvidia-ml.so." + inv.Version, "nvidia-uvm", "nvidia-cuda-mps-server", "nvidia.icd"},
			never: []string{"libGLX_nvidia.so." + inv.Version, "nvidia-modeset", "libnvcuvid.so." + inv.Version}},
		{caps: []driver.Capability{driver.Graphics},
			want:  []string{"libGLX_nvidia.so." + inv.Version, "nvidia_icd.json", "nvidia-drm_gbm.so", "10_nvidia.json"},
			never: []string{"libcuda.so." + inv.Version, "nvidia_drv.so"}},
		{caps: []driver.Capability{driver.Display},
			want:  []string{"nvidia-modeset", "nvidia_drv.so", "nvidiactl"},
			never: []string{"libGLX_nvidia.so." + inv.Version}},
		{caps: []driver.Capability{driver.Video},
			want:  []string{"libnvcuvid.so." + inv.Version, "libnvidia-encode.so." + inv.Version, "libvdpau_nvidia.so." + inv.Version},
			never: []string{"libcuda.so." + inv.Version}},
		{caps: []driver.Capability{driver.NGX},
			want: []string{"libnvidia-ngx.so." + inv.Version}},
	}
	for _, tt := range tests {
		files := inv.Files(tt.caps)
		names := map[string]bool{}
		for _, f := range files {
			names[path.Base(f.ContainerPath)] = true
		}
		for _, w := range tt.want {
			if devs[w] && !res.RealDeviceNodes {
				continue // regular files stand in for nodes: not listed
			}
			if !names[w] {
				t.Errorf("Files(%v) lacks %s", tt.caps, w)
			}
		}
		for _, n := range tt.never {
			if names[n] {
				t.Errorf("Files(%v) has %s", tt.caps, n)
			}
		}
		for _, f := range files {
			if f.Capability == driver.Compat32 {
				t.Errorf("Files(%v) has compat32 file %s", tt.caps, f.ContainerPath)
			}
		}
	}
	var nilInv *driver.Inventory
	if nilInv.Files(driver.AllCapabilities) != nil {
		t.Error("nil inventory has files")
	}
}

// TestDiscoverEscapingSymlinks plants links that point out of the driver
// root, at a real host file and at a real ELF library outside, and checks
// nothing outside the root is handed out.
func TestDiscoverEscapingSymlinks(t *testing.T) {
	root, res := buildRoot(t, fakedriver.Options{})
	v := res.Version
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")

	// A real library with the right name, outside the root.
	outside := t.TempDir()
	nvml := filepath.Join(lib, "libnvidia-ml.so."+v)
	outsideLib := filepath.Join(outside, "libnvidia-ml.so."+v)
	if b, err := os.ReadFile(nvml); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(outsideLib, b, 0o755); err != nil {
		t.Fatal(err)
	}

	links := map[string]string{
		"libcuda.so." + v:          "/etc/passwd",
		"libnvidia-ml.so." + v:     outsideLib,
		"libnvidia-cfg.so." + v:    "../../../../../../../../" + outside + "/libnvidia-ml.so." + v,
		"libnvidia-encode.so." + v: "../../../../../../../../etc",
	}
	for name, target := range links {
		p := filepath.Join(lib, name)
		os.Remove(p)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	// And the binaries directory pointing out of the root.
	smi := filepath.Join(root, "usr/bin/nvidia-smi")
	os.Remove(smi)
	os.Symlink("/bin/true", smi)

	inv, err := driver.Discover(driver.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range inv.All() {
		if f.Kind == driver.KindDevice {
			continue
		}
		if !strings.HasPrefix(f.HostPath, root+"/") {
			t.Errorf("%s has HostPath %s outside the root", f.ContainerPath, f.HostPath)
		}
	}
	for _, f := range inv.Libraries {
		switch path.Base(f.ContainerPath) {
		case "libcuda.so." + v, "libnvidia-ml.so." + v, "libnvidia-cfg.so." + v, "libnvidia-encode.so." + v:
			t.Errorf("escaping link selected: %+v", f)
		}
	}
	for _, want := range []string{"libcuda.so", "libnvidia-ml.so", "nvidia-smi"} {
		if !slices.Contains(inv.Missing, want) {
			t.Errorf("Missing = %v, want %s in it", inv.Missing, want)
		}
	}
}

// TestDiscoverPartial removes libcuda and checks the gap is reported while
// the rest is still found.
func TestDiscoverPartial(t *testing.T) {
	root, res := buildRoot(t, fakedriver.Options{})
	for _, l := range res.Libraries {
		if strings.HasPrefix(path.Base(l.Path), "libcuda.so.") {
			if err := os.Remove(filepath.Join(root, l.Path)); err != nil {
				t.Fatal(err)
			}
		}
	}
	inv, err := driver.Discover(driver.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(inv.Missing, "libcuda.so") || slices.Contains(inv.Missing, "libnvidia-ml.so") {
		t.Errorf("Missing = %v, want libcuda.so only among the libraries", inv.Missing)
	}
	if len(inv.Libraries) != len(res.Libraries)-1 {
		t.Errorf("found %d libraries, want %d", len(inv.Libraries), len(res.Libraries)-1)
	}
}

func TestDiscoverNoDriver(t *testing.T) {
	driver.SetHostVersionFiles(t)
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "usr/lib/x86_64-linux-gnu"), 0o755)
	_, err := driver.Discover(driver.Options{Root: root})
	if !errors.Is(err, driver.ErrNoDriver) {
		t.Fatalf("Discover(empty root) error = %v, want ErrNoDriver", err)
	}
	want := "no NVIDIA driver found under " + root + ": set driver-root in the Gantry configuration (/etc/gantry/config.toml; --driver-root for gantry and its plugins) to where the driver is installed (e.g. /run/nvidia/driver or /usr/local/nvidia), or, " + gpu.SimulateAdvice
	if err.Error() != want {
		t.Errorf("error = %q\nwant    %q", err, want)
	}
	// A root that does not exist is no driver either.
	if _, err := driver.Discover(driver.Options{Root: filepath.Join(root, "nope")}); !errors.Is(err, driver.ErrNoDriver) {
		t.Errorf("missing root: error = %v, want ErrNoDriver", err)
	}
	// An explicit version is trusted, and what is missing is listed.
	inv, err := driver.Discover(driver.Options{Root: root, Version: "550.54.15"})
	if err != nil || len(inv.Libraries) != 0 || !slices.Contains(inv.Missing, "libcuda.so") {
		t.Errorf("Discover(empty root, version) = %+v, %v", inv, err)
	}
	if _, err := driver.Discover(driver.Options{Root: root, Version: "latest"}); err == nil {
		t.Error("a malformed version override was accepted")
	}
}

// TestDiscoverVersionSources checks where the version comes from: the
// root's proc file, the host's files, the library names, the override.
func TestDiscoverVersionSources(t *testing.T) {
	root, _ := buildRoot(t, fakedriver.Options{Version: "535.104.05"})
	proc := filepath.Join(root, "proc/driver/nvidia/version")

	inv, err := driver.Discover(driver.Options{Root: root})
	if err != nil || inv.Version != "535.104.05" {
		t.Fatalf("from proc: %v, %v", inv, err)
	}
	os.Remove(proc)
	inv, err = driver.Discover(driver.Options{Root: root})
	if err != nil || inv.Version != "535.104.05" || len(inv.Libraries) == 0 {
		t.Fatalf("from the library names: %+v, %v", inv, err)
	}
	// A host module of another version wins over the names, and then the
	// libraries (of the wrong version) are not taken.
	host := filepath.Join(t.TempDir(), "version")
	os.WriteFile(host, []byte("550.54.15\n"), 0o644)
	driver.SetHostVersionFiles(t, host)
	inv, err = driver.Discover(driver.Options{Root: root})
	if err != nil || inv.Version != "550.54.15" || len(inv.Libraries) != 0 || !slices.Contains(inv.Missing, "libcuda.so") {
		t.Fatalf("host version: %+v, %v", inv, err)
	}
	inv, err = driver.Discover(driver.Options{Root: root, Version: "535.104.05"})
	if err != nil || len(inv.Libraries) == 0 {
		t.Fatalf("override: %+v, %v", inv, err)
	}
}

// TestDiscoverWithoutCache checks the directory search alone, and that a
// corrupt cache is a warning, not a failure.
func TestDiscoverWithoutCache(t *testing.T) {
	root, res := buildRoot(t, fakedriver.Options{})
	cache := filepath.Join(root, "etc/ld.so.cache")
	for _, tc := range []struct {
		name    string
		setup   func()
		warning bool
	}{
		{"missing", func() { os.Remove(cache) }, false},
		{"corrupt", func() { os.WriteFile(cache, []byte("glibc-ld.so.cache1.1 garbage"), 0o644) }, true},
	} {
		tc.setup()
		inv, err := driver.Discover(driver.Options{Root: root})
		if err != nil {
			t.Fatalf("%s cache: %v", tc.name, err)
		}
		if len(inv.Libraries) != len(res.Libraries) {
			t.Errorf("%s cache: %d libraries, want %d", tc.name, len(inv.Libraries), len(res.Libraries))
		}
		if (len(inv.Warnings) > 0) != tc.warning {
			t.Errorf("%s cache: warnings %v", tc.name, inv.Warnings)
		}
	}
}

// TestLibrarySearchPaths moves the driver to a directory only the option
// names.
func TestLibrarySearchPaths(t *testing.T) {
	root, res := buildRoot(t, fakedriver.Options{})
	os.Remove(filepath.Join(root, "etc/ld.so.cache"))
	from := filepath.Join(root, res.LibDir)
	to := filepath.Join(root, "opt/nvidia/lib")
	os.MkdirAll(filepath.Dir(to), 0o755)
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
	inv, err := driver.Discover(driver.Options{Root: root})
	if err != nil || !slices.Contains(inv.Missing, "libcuda.so") {
		t.Fatalf("without the option: Missing = %v, %v", inv.Missing, err)
	}
	inv, err = driver.Discover(driver.Options{Root: root, LibrarySearchPaths: []string{"opt/nvidia/lib"}})
	if err != nil || slices.Contains(inv.Missing, "libcuda.so") {
		t.Fatalf("with the option: Missing = %v, %v", inv.Missing, err)
	}
	found := false
	for _, f := range inv.Libraries {
		if f.ContainerPath == "/opt/nvidia/lib/libcuda.so."+inv.Version {
			found = true
		}
	}
	if !found {
		t.Errorf("libcuda not found in /opt/nvidia/lib: %+v", inv.Libraries)
	}
}

func TestStatDevice(t *testing.T) {
	root, res := buildRoot(t, fakedriver.Options{DeviceNodes: true, GPUs: 4})
	if !res.RealDeviceNodes {
		f, err := driver.StatDevice(root, "/dev/nvidia3")
		if !errors.Is(err, driver.ErrNotDevice) {
			t.Fatalf("StatDevice(regular file) = %+v, %v; want ErrNotDevice", f, err)
		}
		t.Skipf("no character devices (%v): checked only the regular-file case", res.Notes)
	}
	for p, want := range map[string][2]int64{
		"/dev/nvidia3":                 {fakedriver.NvidiaMajor, 3},
		"dev/nvidia0":                  {fakedriver.NvidiaMajor, 0},
		"/dev/nvidia-caps/nvidia-cap2": {fakedriver.CapsMajor, 2},
	} {
		f, err := driver.StatDevice(root, p)
		if err != nil {
			t.Fatalf("StatDevice(%s): %v", p, err)
		}
		cp := path.Clean("/" + p)
		if f.Major != want[0] || f.Minor != want[1] || f.ContainerPath != cp || f.HostPath != filepath.Join(root, cp) || f.Kind != driver.KindDevice {
			t.Errorf("StatDevice(%s) = %+v, want %d:%d", p, f, want[0], want[1])
		}
	}
	if _, err := driver.StatDevice(root, "/dev/nvidia9"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("StatDevice(missing) error = %v, want ErrNotExist", err)
	}
	// A device link out of the dev root resolves inside it.
	os.Symlink("/dev/null", filepath.Join(root, "dev/nvidia7"))
	if f, err := driver.StatDevice(root, "/dev/nvidia7"); err == nil {
		t.Errorf("StatDevice followed a link out of the root: %+v", f)
	}
	if _, err := driver.StatDevice(root, "/proc/driver/nvidia/version"); !errors.Is(err, driver.ErrNotDevice) {
		t.Errorf("StatDevice(regular file) error = %v, want ErrNotDevice", err)
	}
}

func BenchmarkDiscover(b *testing.B) {
	for _, layout := range []string{fakedriver.LayoutStandard, fakedriver.LayoutGKE} {
		b.Run(layout, func(b *testing.B) {
			root, _ := buildRoot(b, fakedriver.Options{Layout: layout, Compat32: true, DeviceNodes: true})
			b.ResetTimer()
			for b.Loop() {
				if _, err := driver.Discover(driver.Options{Root: root}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDiscoverHost measures Discover on this machine's own driver
// (root "/"), and logs what it found; it skips where no driver is loaded.
func BenchmarkDiscoverHost(b *testing.B) {
	if _, err := os.Stat("/proc/driver/nvidia/version"); err != nil {
		b.Skip("no NVIDIA driver loaded on this machine")
	}
	inv, err := driver.Discover(driver.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("driver %s: %d libraries, %d binaries, %d firmware, %d configs, %d sockets, %d device nodes; missing %v; warnings %v",
		inv.Version, len(inv.Libraries), len(inv.Binaries), len(inv.Firmware), len(inv.Configs), len(inv.Sockets), len(inv.DeviceNodes), inv.Missing, inv.Warnings)
	for _, f := range inv.All() {
		b.Logf("%-9s %-9s %s <- %s %s", f.Kind, f.Capability, f.ContainerPath, f.HostPath, f.SONAME)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := driver.Discover(driver.Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
