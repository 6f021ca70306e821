package containerhook

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"syscall"

	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// CompatDir is where the official CUDA images keep the CUDA forward
// compatibility package: a libcuda (and its companions) newer than the host
// driver, which lets a new CUDA toolkit run on an older data-center driver.
const CompatDir = "/usr/local/cuda/compat"

// ForwardCompat decides whether the image's forward-compatibility libraries
// must be used on a host whose kernel driver is hostVersion, following
// NVIDIA's rule: the image holds exactly one libcuda.so.MAJOR.MINOR[.PATCH]
// in CompatDir and MAJOR is greater than the host driver's major version. It
// then returns every library in CompatDir (by SONAME, as UpdateLDCache finds
// them), which the caller puts in the container's ld.so.cache ahead of the
// host driver's, and a sentence saying what it decided and why.
//
// Nothing is used when the directory is absent, holds no or several
// libcuda.so versions, or is not newer than the host: the host driver's own
// libcuda is then the right one. Files are read through root, so a hostile
// CompatDir (a symlink to a host directory) resolves inside the image.
func ForwardCompat(root *rootfs.Root, hostVersion string) ([]Library, string, error) {
	hostMajor, err := major(hostVersion)
	if err != nil {
		return nil, "", fmt.Errorf("host driver version %q: %w", hostVersion, err)
	}
	// A compat directory holds a dozen libraries.
	names, err := root.ReadDirMax(CompatDir, 4096)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, "no " + CompatDir + " in the image", nil
	}
	if errors.Is(err, rootfs.ErrTooLarge) {
		return nil, fmt.Sprintf("the image's %s is not a compat directory (%v); not used", CompatDir, err), nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("listing the image's %s: %w", CompatDir, err)
	}
	var versions []string
	for _, n := range names {
		v, ok := strings.CutPrefix(n, "libcuda.so.")
		if ok && strings.Count(v, ".") >= 1 {
			versions = append(versions, v)
		}
	}
	if len(versions) != 1 {
		return nil, fmt.Sprintf("%s holds %d libcuda.so.X.Y files (want exactly one); not used", CompatDir, len(versions)), nil
	}
	compatMajor, err := major(versions[0])
	if err != nil {
		return nil, fmt.Sprintf("%s/libcuda.so.%s: unreadable version; not used", CompatDir, versions[0]), nil
	}
	if compatMajor <= hostMajor {
		return nil, fmt.Sprintf("%s is for driver %s, not newer than the host's %s; not used", CompatDir, versions[0], hostVersion), nil
	}
	native, _, err := hostABIs()
	if err != nil {
		return nil, "", err
	}
	// CUDA's forward-compatibility package is 64-bit only.
	entries, err := libraries(root, CompatDir, []abi{native})
	if err != nil {
		return nil, "", err
	}
	libs := make([]Library, 0, len(entries))
	for _, e := range entries {
		libs = append(libs, Library{SONAME: e.Name, Path: e.Path})
	}
	return libs, fmt.Sprintf("%s (driver %s) is newer than the host's %s: its %d libraries come first", CompatDir, versions[0], hostVersion, len(libs)), nil
}

func major(v string) (int, error) {
	m, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(m)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("not a version number")
	}
	return n, nil
}
