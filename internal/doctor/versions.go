package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

// kernelVersion is the loaded module's driver version: the driver root's
// proc/driver/nvidia/version (a driver container's, or a fake root's),
// else the host's, read under opts.Proc and opts.Sys (so that a test, or
// doctor in a container with the host's /proc at /host/proc, reads the
// host it means). Both results are empty when no version file exists.
func kernelVersion(opts Options) (version, file string, err error) {
	root := opts.Config.DriverRoot
	var files []string
	if root != "/" && root != "" {
		files = append(files, filepath.Join(root, "proc/driver/nvidia/version"))
	}
	files = append(files, filepath.Join(opts.Proc, "driver/nvidia/version"), filepath.Join(opts.Sys, "module/nvidia/version"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		v, err := driver.ParseVersion(b)
		if err != nil {
			return "", f, fmt.Errorf("reading the driver version from %s: %w", f, err)
		}
		return v, f, nil
	}
	return "", "", nil
}

// compareVersions compares two driver versions number by number (missing
// numbers as 0): -1, 0 or 1.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
	}
	return 0
}

// checkVersions holds the kernel module's version against the user-space
// libraries the loader finds under the driver root (libnvidia-ml.so.1,
// libcuda.so.1, by the version in their file names) and, when NVML ran,
// against what NVML reports. The libraries are read from the files, so
// the mismatch is named even where NVML cannot start because of it
// ("Driver/library version mismatch"), and with simulated GPUs. Which
// side is older decides the fix: a module older than the libraries is the
// upgrade not yet loaded (reboot or reload the module, never downgrade
// the libraries); a module newer than them needs the libraries of its
// version.
func checkVersions(opts Options, kernel string, sys *gpu.System, nvml Check) Check {
	cfg := opts.Config
	libs := driver.LoaderLibraries(cfg.DriverRoot)
	var found, older, newer []string
	libVersion := ""
	for _, l := range libs {
		// A CUDA forward-compatibility libcuda (cuda-compat, a newer
		// branch's on purpose) is not the driver's.
		if l.Version == "" || strings.Contains(l.Path, "/compat/") {
			continue
		}
		desc := fmt.Sprintf("%s -> %s", l.SONAME, filepath.Join(cfg.DriverRoot, l.Path))
		found = append(found, desc)
		switch compareVersions(kernel, l.Version) {
		case -1:
			older = append(older, desc)
			libVersion = l.Version
		case 1:
			newer = append(newer, desc)
			libVersion = l.Version
		}
	}
	switch {
	case len(older) > 0:
		return fail(CheckVersions, fix(fixModuleOlder),
			"the loaded kernel module is driver %s but the user-space libraries are %s (%s): the libraries were upgraded and the old module is still loaded (NVML: \"Driver/library version mismatch\"); every GPU container fails until the module of the libraries is loaded",
			kernel, libVersion, strings.Join(older, ", "))
	case len(newer) > 0:
		return fail(CheckVersions, fix(fixModuleNewer, "VERSION", kernel),
			"the loaded kernel module is driver %s but the user-space libraries are the older %s (%s): NVML and CUDA refuse a module of another version (\"Driver/library version mismatch\")",
			kernel, libVersion, strings.Join(newer, ", "))
	}
	libsEv := "user-space libraries not found by their SONAME under " + cfg.DriverRoot
	if len(found) > 0 {
		libsEv = "the user-space libraries match (" + strings.Join(found, ", ") + ")"
	}
	switch {
	case isSim(cfg) && sys != nil:
		return pass(CheckVersions, "driver %s (kernel module), %s; simulated GPUs report driver %s, CUDA %s",
			kernel, libsEv, sys.DriverVersion, sys.CUDADriverVersion)
	case sys == nil || nvml.Status != Pass:
		return pass(CheckVersions, "driver %s (kernel module), %s; CUDA version unknown without NVML (see %s)", kernel, libsEv, CheckNVML)
	case sys.DriverVersion != kernel:
		return fail(CheckVersions, fix(fixVersions),
			"NVML reports driver %s but the kernel module is %s (Driver/library version mismatch)", sys.DriverVersion, kernel)
	}
	return pass(CheckVersions, "driver %s, CUDA %s; %s", sys.DriverVersion, sys.CUDADriverVersion, libsEv)
}
