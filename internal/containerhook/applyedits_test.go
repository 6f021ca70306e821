package containerhook_test

// inject.ApplyEdits (the rootfs step of the runtime, the prestart hook and
// nvidia-container-cli configure) calls this package's cache writer; its
// 32-bit test stays here, beside the gcc -m32 fixtures it runs (exported to
// this external test package by export_test.go), since package inject
// imports containerhook and an in-package test could not import inject.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/containerhook"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/inject"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// The in-process front ends' path (inject.ApplyEdits from the host
// inventory, no library read): a fake driver with compat32 libraries,
// discovered as on a host, edits for a container asking for
// compute,utility,compat32, the library files placed where runc's bind
// mounts would put them. Both loaders find
// their own libcuda in /usr/lib/{x86_64,i386}-linux-gnu.
func TestCompat32ApplyEditsFakeDriver(t *testing.T) {
	containerhook.NeedCompat32Exec(t)
	drv, err := fakedriver.Build(filepath.Join(t.TempDir(), "driver"), fakedriver.Options{Compat32: true})
	if err != nil {
		t.Fatal(err)
	}
	if !drv.Compat32 {
		t.Fatalf("fakedriver built no compat32 libraries although gcc -m32 links: %v", drv.Notes)
	}
	inv, err := driver.Discover(driver.Options{Root: drv.Root})
	if err != nil {
		t.Fatal(err)
	}
	const lib32 = "/usr/lib/i386-linux-gnu"
	for _, tc := range []struct {
		caps   []driver.Capability
		want32 string // probe32's output; "" for a failure
	}{
		{[]driver.Capability{driver.Compute, driver.Utility, driver.Compat32}, fmt.Sprintf("bits=32 cuda=%d path=%s/libcuda.so.1", drv.CUDAVersion, lib32)},
		{[]driver.Capability{driver.Compute, driver.Utility}, ""},
	} {
		t.Run(fmt.Sprint(tc.caps), func(t *testing.T) {
			e := edits.Common(inv, tc.caps)
			dir := containerhook.Image32(t, func(dir string) {
				for _, m := range e.Mounts {
					if !strings.Contains(m.ContainerPath, ".so") {
						continue
					}
					containerhook.Mkdirs(t, dir, filepath.Dir(m.ContainerPath))
					containerhook.CopyFile(t, m.HostPath, filepath.Join(dir, m.ContainerPath))
				}
			})
			r, err := rootfs.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if err := inject.ApplyEdits(r, e, inv, false, nil); err != nil {
				t.Fatal(err)
			}
			w64 := fmt.Sprintf("bits=64 cuda=%d path=%s/libcuda.so.1", drv.CUDAVersion, drv.LibDir)
			if out, err := containerhook.RunIn(t, dir, containerhook.Probe64); err != nil || out != w64 {
				t.Errorf("probe64: %q, %v; want %q", out, err, w64)
			}
			out, err := containerhook.RunIn(t, dir, containerhook.Probe32)
			switch {
			case tc.want32 == "" && err == nil:
				t.Errorf("probe32 found libcuda without compat32: %q", out)
			case tc.want32 != "" && (err != nil || out != tc.want32):
				t.Errorf("probe32: %q, %v; want %q", out, err, tc.want32)
			}
			conf, _ := os.ReadFile(filepath.Join(dir, containerhook.ConfFile))
			if listed := strings.Contains(string(conf), lib32+"\n"); listed != (tc.want32 != "") {
				t.Errorf("%s lists %s: %v, want %v:\n%s", containerhook.ConfFile, lib32, listed, tc.want32 != "", conf)
			}
		})
	}
}
