package nvml

import (
	"errors"
	"strconv"
	"strings"
)

// Options control Discover.
type Options struct {
	// DriverRoot is where the driver is installed ("/" when empty); NVML is
	// looked for in its library directories when the dynamic loader does
	// not find it.
	DriverRoot string
	// Light skips what the container-create and CDI paths do not need
	// (the NVLink topology), to keep discovery fast.
	Light bool
}

// ErrNoNVML means libnvidia-ml.so.1 could not be loaded: no driver is
// installed, or it is not where Options.DriverRoot says.
var ErrNoNVML = errors.New("NVML (libnvidia-ml.so.1) not found")

const soname = "libnvidia-ml.so.1"

// libDirs are the directories under a driver root that hold NVML in the
// layouts Gantry supports (distribution packages, the .run installer, GKE's
// /usr/local/nvidia, the GPU operator's driver container).
var libDirs = []string{
	"usr/local/nvidia/lib64",
	"usr/lib/x86_64-linux-gnu",
	"usr/lib/aarch64-linux-gnu",
	"usr/lib64",
	"lib",
	"lib64",
}

// cudaVersion formats NVML's CUDA driver version (1000*major + 10*minor,
// e.g. 13000 or 12040) as "major.minor".
func cudaVersion(v int) string {
	return strconv.Itoa(v/1000) + "." + strconv.Itoa(v%1000/10)
}

// migProfile takes the profile from a MIG device's name:
// "NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb".
func migProfile(name string) string {
	if i := strings.LastIndex(name, "MIG "); i >= 0 {
		return strings.TrimSpace(name[i+len("MIG "):])
	}
	if i := strings.LastIndex(name, " "); i >= 0 {
		return name[i+1:]
	}
	return name
}
