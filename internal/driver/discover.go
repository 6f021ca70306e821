package driver

import (
	"cmp"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"sync"
)

// Options says where to look for the driver.
type Options struct {
	// Root is the driver root: the directory the driver is installed under
	// as if it were "/" ("/" by default; /run/nvidia/driver for the GPU
	// operator's driver container).
	Root string
	// DevRoot is where /dev is found for the control device nodes; Root
	// by default.
	DevRoot string
	// LibrarySearchPaths are extra library directories, inside Root,
	// searched after ld.so.cache and the standard directories.
	LibrarySearchPaths []string
	// Version overrides the driver version instead of reading it from the
	// kernel module or the library names.
	Version string
}

// Discover finds the driver files under opts.Root. It parses the root's
// ld.so.cache once, reads a fixed handful of directories once each, stats
// known names, and runs nothing, so it takes a few milliseconds.
//
// It returns an error wrapping ErrNoDriver when no driver version can be
// found. Once the version is known, missing pieces do not fail it: they are
// listed in Inventory.Missing.
func Discover(opts Options) (*Inventory, error) {
	root := opts.Root
	if root == "" {
		root = "/"
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("driver root %q: %w", opts.Root, err)
	}
	devRoot := opts.DevRoot
	if devRoot == "" {
		devRoot = root
	}
	if opts.Version != "" && !IsVersion(opts.Version) {
		return nil, fmt.Errorf("driver version %q: use the form 550.54.15", opts.Version)
	}

	inv := &Inventory{Root: root, Version: opts.Version}
	r := newResolver(root)

	if inv.Version == "" {
		v, _, err := versionFromFiles(root)
		if err != nil {
			return nil, err
		}
		inv.Version = v
	}

	// The driver's programs, sockets and control devices (and its firmware,
	// when the version is known already) do not depend on its libraries:
	// they are looked for at the same time, with a resolver of their own
	// (a resolver is not safe for concurrent use).
	known := inv.Version
	var others sync.WaitGroup
	others.Go(func() {
		or := newResolver(root)
		inv.Binaries = findBinaries(or)
		if known != "" {
			inv.Firmware = findFirmware(or, known)
		}
		inv.Sockets = findSockets(or)
		inv.DeviceNodes = findDevices(devRoot)
	})
	// So are the configuration files (not the X server modules, looked for
	// beside libcuda first).
	var configFiles []File
	if known != "" {
		others.Go(func() { configFiles = findConfigFiles(newResolver(root), known) })
	}

	scan := &libraryScan{r: r, seen: map[string]bool{}, asked: map[string]bool{}}
	if cachePath, err := r.Resolve("/etc/ld.so.cache"); err == nil {
		if err := scan.fromCache(r.host(cachePath)); err != nil {
			inv.Warnings = append(inv.Warnings, fmt.Sprintf("ignoring %s (searching the library directories only): %v", r.host(cachePath), err))
		}
	}
	done := map[string]bool{}
	for _, d := range libraryDirs {
		scan.fromDir(d, done)
	}
	for _, d := range opts.LibrarySearchPaths {
		scan.fromDir(path.Clean("/"+d), done)
	}

	if inv.Version == "" {
		inv.Version = versionFromLibraries(scan.cands)
	}
	if inv.Version == "" {
		others.Wait()
		return nil, noDriverError(root)
	}

	inv.Libraries = selectLibraries(r, scan.cands, inv.Version)
	if known == "" {
		inv.Firmware = findFirmware(r, inv.Version)
		configFiles = findConfigFiles(r, inv.Version)
	}
	modules := findModules(r, inv.Version, inv.Libraries)
	others.Wait()
	inv.Configs = append(configFiles, modules...)
	inv.Missing = missing(inv)

	for _, g := range []*[]File{&inv.Libraries, &inv.Binaries, &inv.Firmware, &inv.Configs, &inv.Sockets, &inv.DeviceNodes} {
		slices.SortStableFunc(*g, func(a, b File) int { return cmp.Compare(a.ContainerPath, b.ContainerPath) })
	}
	return inv, nil
}

// missing lists the core pieces Discover did not find.
func missing(inv *Inventory) []string {
	var out []string
	has := func(files []File, pred func(File) bool) bool { return slices.ContainsFunc(files, pred) }
	for _, stem := range []string{"libcuda.so", "libnvidia-ml.so"} {
		if !has(inv.Libraries, func(f File) bool {
			return f.Capability != Compat32 && path.Base(f.ContainerPath) == stem+"."+inv.Version
		}) {
			out = append(out, stem)
		}
	}
	if !has(inv.Binaries, func(f File) bool { return path.Base(f.ContainerPath) == "nvidia-smi" }) {
		out = append(out, "nvidia-smi")
	}
	if !has(inv.DeviceNodes, func(f File) bool { return f.ContainerPath == "/dev/nvidiactl" }) {
		out = append(out, "/dev/nvidiactl")
	}
	return out
}
