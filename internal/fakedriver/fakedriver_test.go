package fakedriver

import (
	"debug/elf"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/ldcache"
)

func needGCC(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not found: a fake driver is built with gcc")
	}
}

func build(t testing.TB, opts Options) (string, *Result) {
	t.Helper()
	needGCC(t)
	root := t.TempDir()
	res, err := Build(root, opts)
	if err != nil {
		t.Fatal(err)
	}
	return root, res
}

func TestBuildLayouts(t *testing.T) {
	for _, layout := range []string{LayoutStandard, LayoutGKE} {
		t.Run(layout, func(t *testing.T) {
			root, res := build(t, Options{Layout: layout, GPUs: 3, DeviceNodes: true, Compat32: true})
			if res.Version != DefaultVersion || res.CUDAVersion != 12040 || res.Layout != layout {
				t.Errorf("Result header = %q %d %q", res.Version, res.CUDAVersion, res.Layout)
			}

			// Every library is a real ELF object with the SONAME, word size
			// and file name we claim, and its SONAME link resolves to it.
			caps := map[driver.Capability]int{}
			for _, l := range res.Libraries {
				caps[l.Capability]++
				h := filepath.Join(root, l.Path)
				f, err := elf.Open(h)
				if err != nil {
					t.Errorf("%s: %v", l.Path, err)
					continue
				}
				sonames, _ := f.DynString(elf.DT_SONAME)
				class := f.Class
				f.Close()
				wantClass := elf.ELFCLASS64
				if l.Bits == 32 {
					wantClass = elf.ELFCLASS32
				}
				if len(sonames) != 1 || sonames[0] != l.SONAME || class != wantClass {
					t.Errorf("%s: SONAME %v class %v, want %s %v", l.Path, sonames, class, l.SONAME, wantClass)
				}
				if !strings.HasPrefix(path.Base(l.Path), strings.SplitN(l.SONAME, ".so", 2)[0]+".so.") {
					t.Errorf("%s: name does not match SONAME %s", l.Path, l.SONAME)
				}
				link, err := filepath.EvalSymlinks(filepath.Join(root, path.Dir(l.Path), l.SONAME))
				if err != nil || link != h {
					t.Errorf("%s: SONAME link resolves to %s, %v", l.Path, link, err)
				}
			}
			for _, c := range []driver.Capability{driver.Utility, driver.Compute, driver.Video, driver.Graphics, driver.Compat32} {
				if caps[c] < 2 {
					t.Errorf("%d %s libraries, want at least 2", caps[c], c)
				}
			}
			if caps[driver.NGX] < 1 {
				t.Error("no ngx library")
			}
			if !res.Compat32 {
				t.Logf("no compat32 libraries: %v", res.Notes)
			}

			b, err := os.ReadFile(filepath.Join(root, "proc/driver/nvidia/version"))
			if err != nil {
				t.Fatal(err)
			}
			if v, err := driver.ParseVersion(b); err != nil || v != DefaultVersion {
				t.Errorf("proc version file parses to %q, %v", v, err)
			}

			for _, group := range [][]string{res.Binaries, res.Firmware, res.Configs, res.Sockets, res.DeviceNodes} {
				for _, p := range group {
					if _, err := os.Stat(filepath.Join(root, p)); err != nil {
						t.Errorf("listed file missing: %v", err)
					}
				}
			}
			if len(res.DeviceNodes) != 3+6 {
				t.Errorf("device nodes = %v", res.DeviceNodes)
			}
			if os.Geteuid() == 0 && !res.RealDeviceNodes {
				t.Errorf("running as root but device nodes are not real: %v", res.Notes)
			}
			if res.RealDeviceNodes {
				var st unix.Stat_t
				if err := unix.Stat(filepath.Join(root, "dev/nvidia2"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != NvidiaMajor || unix.Minor(st.Rdev) != 2 {
					t.Errorf("dev/nvidia2 is not char 195:2: %+v, %v", st, err)
				}
			}
			var st unix.Stat_t
			if len(res.Sockets) > 0 {
				if err := unix.Stat(filepath.Join(root, res.Sockets[0]), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
					t.Errorf("%s is not a socket: %v", res.Sockets[0], err)
				}
			}
		})
	}
}

// TestLDCache checks the cache ldconfig wrote, through our own parser: the
// GKE layout lists each SONAME in the driver tree and again in /lib, as our
// GPU hosts' caches do.
func TestLDCache(t *testing.T) {
	for _, tc := range []struct {
		layout string
		want   []string
	}{
		{LayoutStandard, []string{"/lib/x86_64-linux-gnu/libcuda.so.1"}},
		{LayoutGKE, []string{"/usr/local/nvidia/lib64/libcuda.so.1", "/lib/libcuda.so.1"}},
	} {
		root, res := build(t, Options{Layout: tc.layout, Compat32: true})
		if !res.LDCache {
			t.Skipf("no ld.so.cache (needs ldconfig and root): %v", res.Notes)
		}
		c, err := ldcache.Open(filepath.Join(root, "etc/ld.so.cache"))
		if err != nil {
			t.Fatal(err)
		}
		got := c.Lookup("libcuda.so.1")
		// Either spelling of a merged-/usr directory is right.
		norm := func(ps []string) []string {
			var out []string
			for _, p := range ps {
				out = append(out, strings.TrimPrefix(p, "/usr"))
			}
			return out
		}
		if !slices.Equal(norm(got), norm(tc.want)) {
			t.Errorf("%s: Lookup(libcuda.so.1) = %v, want %v", tc.layout, got, tc.want)
		}
		if res.Compat32 {
			n := 0
			for _, e := range c.Entries {
				if e.Name == "libcuda.so.1" && strings.Contains(e.Path, "i386") {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s: %d 32-bit libcuda.so.1 entries, want 1", tc.layout, n)
			}
		}
	}
}

// TestDlopen compiles a program that loads the fake libcuda and libnvidia-ml
// through the root's SONAME links and calls them, as a CUDA program in a
// container would.
func TestDlopen(t *testing.T) {
	root, res := build(t, Options{Layout: LayoutGKE, CUDAVersion: "12.8"})
	src := filepath.Join(t.TempDir(), "probe.c")
	os.WriteFile(src, []byte(`#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
	void *cuda = dlopen(argv[1], RTLD_NOW), *nvml = dlopen(argv[2], RTLD_NOW);
	if (!cuda || !nvml) { printf("dlopen: %s\n", dlerror()); return 1; }
	int (*init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
	int (*ver)(int *) = (int (*)(int *))dlsym(cuda, "cuDriverGetVersion");
	int (*ninit)(void) = (int (*)(void))dlsym(nvml, "nvmlInit_v2");
	int (*dver)(char *, unsigned) = (int (*)(char *, unsigned))dlsym(nvml, "nvmlSystemGetDriverVersion");
	if (!init || !ver || !ninit || !dver) { printf("dlsym failed\n"); return 1; }
	int v = 0; char d[80];
	int r1 = init(0), r2 = ver(&v), r3 = ninit(), r4 = dver(d, sizeof d);
	printf("%d %d %d %d %d %s\n", r1, r2, v, r3, r4, d);
	return 0;
}
`), 0o644)
	bin := filepath.Join(t.TempDir(), "probe")
	if out, err := exec.Command("gcc", "-o", bin, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v: %s", err, out)
	}
	out, err := exec.Command(bin,
		filepath.Join(root, res.LibDir, "libcuda.so.1"),
		filepath.Join(root, res.LibDir, "libnvidia-ml.so.1")).CombinedOutput()
	if err != nil {
		t.Fatalf("probe: %v: %s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "0 0 12080 0 0 "+DefaultVersion; got != want {
		t.Errorf("probe printed %q, want %q", got, want)
	}
}

// TestPrograms runs the fake nvidia-smi and another driver program.
func TestPrograms(t *testing.T) {
	root, _ := build(t, Options{Version: "580.159.04"})
	out, err := exec.Command(filepath.Join(root, "usr/bin/nvidia-smi")).CombinedOutput()
	if err != nil {
		t.Fatalf("nvidia-smi: %v: %s", err, out)
	}
	if !strings.Contains(string(out), "fake") || !strings.Contains(string(out), "Driver Version: 580.159.04") || !strings.Contains(string(out), "CUDA Version: 13.0") {
		t.Errorf("nvidia-smi printed %q", out)
	}
	out, err = exec.Command(filepath.Join(root, "usr/bin/nvidia-debugdump")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nvidia-debugdump: fake") {
		t.Errorf("nvidia-debugdump printed %q, %v", out, err)
	}
}

// TestSMIIdentities: nvidia-smi -L names the GPUs it was given identities
// for (a simulated profile's models and UUIDs) and only those whose node it
// sees; it runs chrooted into a directory whose dev/ has nodes 0 to 2.
func TestSMIIdentities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs nvidia-smi chrooted")
	}
	ids := []Identity{
		{Minor: 0, UUID: "GPU-4f91bcb3-3e48-9102-8e22-ab4a3e0c4bce", Name: "NVIDIA H100 80GB HBM3"},
		{Minor: 2, UUID: "GPU-cccc", Name: `odd "name" \ 100%`},
		{Minor: 5, UUID: "GPU-not-visible", Name: "absent"},
	}
	root, res := build(t, Options{GPUs: 3, Identities: ids})
	jail := t.TempDir()
	smi, err := os.ReadFile(filepath.Join(root, "usr/bin/nvidia-smi"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range res.Notes {
		if strings.Contains(n, "dynamically linked") {
			t.Skip("nvidia-smi is not static here: cannot run it chrooted")
		}
	}
	if err := os.WriteFile(filepath.Join(jail, "nvidia-smi"), smi, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(jail, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"nvidia0", "nvidia1", "nvidia2"} {
		if err := os.WriteFile(filepath.Join(jail, "dev", n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("/nvidia-smi", "-L")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: jail}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nvidia-smi -L: %v: %s", err, out)
	}
	want := "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4f91bcb3-3e48-9102-8e22-ab4a3e0c4bce)\n" +
		"GPU 1: Fake NVIDIA GPU (UUID: GPU-fa4e0000-0000-4000-8000-000000000001)\n" +
		"GPU 2: odd \"name\" \\ 100% (UUID: GPU-cccc)\n"
	if string(out) != want {
		t.Errorf("nvidia-smi -L printed\n%s\nwant\n%s", out, want)
	}
}

// TestRebuild builds twice into the same root: the second build replaces
// files and links instead of failing on them.
func TestRebuild(t *testing.T) {
	root, _ := build(t, Options{Layout: LayoutGKE})
	if _, err := Build(root, Options{Layout: LayoutGKE, Version: "535.104.05"}); err != nil {
		t.Fatalf("second build: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/local/nvidia/lib64/libcuda.so.535.104.05")); err != nil {
		t.Error(err)
	}
}

func TestBuildRejects(t *testing.T) {
	needGCC(t)
	for _, opts := range []Options{
		{Version: "latest"},
		{Layout: "windows"},
		{GPUs: -1},
		{GPUs: 65},
		{CUDAVersion: "twelve"},
	} {
		if _, err := Build(t.TempDir(), opts); err == nil {
			t.Errorf("Build(%+v) succeeded", opts)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("Build(%+v) error not one line: %q", opts, err)
		}
	}
}

func TestCUDAVersionFor(t *testing.T) {
	for v, want := range map[string]int{
		"550.54.15":  12040,
		"535.104.05": 12020,
		"580.159.04": 13000,
		"470.256.02": 11040,
		"999.1":      13000,
		"390.157":    11000,
		"garbage":    11000,
	} {
		if got := CUDAVersionFor(v); got != want {
			t.Errorf("CUDAVersionFor(%s) = %d, want %d", v, got, want)
		}
	}
}
