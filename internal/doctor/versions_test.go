package doctor

import (
	"path/filepath"
	"strings"
	"testing"
)

// nvrm is the kernel module's version line for version v.
func nvrm(v string) string {
	return "NVRM version: NVIDIA UNIX x86_64 Kernel Module  " + v + "  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
}

// The libraries upgraded (550.54.15 under the driver root, as the fake
// driver builds them) while the old module (535.104.05) is still loaded:
// the versions check FAILs naming both, and the fix is to load the new
// module (reboot or rmmod/modprobe), never to install the module's
// version of the libraries. The checks that look for the module's version
// of the files are skipped, so no downgrade is advised anywhere.
func TestKernelModuleOlderThanLibraries(t *testing.T) {
	h := newHost(t)
	lib := filepath.Join(h.res.Root, h.res.LibDir, "libnvidia-ml.so.550.54.15")
	h.write(t, filepath.Join(h.res.Root, "proc/driver/nvidia/version"), nvrm("535.104.05"))
	checks := Run(h.opts)
	c := expect(t, checks, CheckVersions, Fail, []string{"535.104.05", "550.54.15", "libnvidia-ml.so.1 -> " + lib, "old module is still loaded"}, "reboot")
	for _, w := range []string{"rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia", "modprobe nvidia", "do not downgrade"} {
		if !strings.Contains(c.Fix, w) {
			t.Errorf("fix %q lacks %q", c.Fix, w)
		}
	}
	for _, name := range []string{CheckDriverFiles, CheckLoaderCache, CheckCDISpecs} {
		expect(t, checks, name, Skip, []string{CheckVersions + " did not pass"}, "")
	}
	for _, ch := range checks {
		if strings.Contains(ch.Fix, "535.104.05") || strings.Contains(ch.Fix, "reinstall") {
			t.Errorf("%s advises a downgrade: %s", ch.Name, ch.Fix)
		}
	}
	t.Logf("%s\nfix: %s", c.Evidence, c.Fix)

	// The fix works: once the module of the libraries is loaded (its
	// version file says 550.54.15, as after the reboot), all pass.
	h.write(t, filepath.Join(h.res.Root, "proc/driver/nvidia/version"), nvrm("550.54.15"))
	checks = Run(h.opts)
	expect(t, checks, CheckVersions, Pass, []string{"550.54.15", "libraries match"}, "")
	expect(t, checks, CheckDriverFiles, Pass, nil, "")
}

// The reverse: a module newer than the libraries. The fix installs the
// libraries of the module's version.
func TestKernelModuleNewerThanLibraries(t *testing.T) {
	h := newHost(t)
	h.write(t, filepath.Join(h.res.Root, "proc/driver/nvidia/version"), nvrm("560.35.03"))
	c := expect(t, Run(h.opts), CheckVersions, Fail, []string{"560.35.03", "older 550.54.15"}, "install the user-space libraries of driver 560.35.03")
	if strings.Contains(c.Fix, "rmmod") {
		t.Errorf("fix reloads the module: %s", c.Fix)
	}
}

func TestCompareVersions(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{{"535.104.05", "550.54.15", -1}, {"550.54.15", "550.54.15", 0}, {"550.100", "550.54.15", 1}, {"550.54", "550.54.0", 0}} {
		if got := compareVersions(tc.a, tc.b); got != tc.want {
			t.Errorf("compareVersions(%s, %s) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
