package nvml

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// ErrDriverNotLoaded means the NVIDIA kernel module is not loaded: NVML
// cannot initialise and /proc/driver/nvidia is absent.
var ErrDriverNotLoaded = errors.New("the NVIDIA kernel driver is not loaded")

// ErrMIGNeedsNVML is returned by DiscoverProcfs when a GPU has MIG instances:
// their UUIDs are known only to NVML, so the caller must use Discover.
var ErrMIGNeedsNVML = errors.New("MIG devices need NVML")

// DiscoverProcfs reads the GPUs from the kernel driver's procfs files under
// procRoot (normally /proc), without loading NVML: a few small reads instead
// of NVML's initialisation, for paths where every millisecond counts. It
// fills index, minor, UUID, PCI bus id, name and NUMA node (from the sysfs
// tree beside procRoot: /sys for /proc, else <dir of procRoot>/sys), and the
// driver version. It cannot know the CUDA driver version, compute
// capability, brand, architecture, memory, MIG devices or NVLinks; those are
// left zero. GPUs the driver excludes are skipped and the rest ordered by PCI
// bus id, as NVML orders them, so indices agree with NVML's.
//
// It returns an error wrapping ErrMIGNeedsNVML when any GPU has MIG GPU
// instances (MIG device UUIDs come only from NVML), and one wrapping
// ErrDriverNotLoaded when procRoot has no driver/nvidia directory.
func DiscoverProcfs(procRoot string) (*gpu.System, error) {
	base := filepath.Join(procRoot, "driver", "nvidia")
	vfile := filepath.Join(base, "version")
	vdata, err := os.ReadFile(vfile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s is missing; load it (modprobe nvidia), or %s", ErrDriverNotLoaded, vfile, gpu.SimulateAdvice)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the driver version: %w", err)
	}
	version, err := ParseNVRMVersion(vdata)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", vfile, err)
	}
	sys := &gpu.System{Backend: "procfs", DriverVersion: version, Devices: []gpu.Device{}}

	entries, err := os.ReadDir(filepath.Join(base, "gpus"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("listing GPUs: %w", err)
	}
	type found struct {
		addr gpu.PCIAddress
		info information
	}
	var gpus []found
	for _, e := range entries {
		file := filepath.Join(base, "gpus", e.Name(), "information")
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("reading GPU information: %w", err)
		}
		info, err := parseInformation(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if info.Excluded {
			continue
		}
		addr, err := gpu.ParsePCIAddress(info.BusLocation)
		if err != nil {
			return nil, fmt.Errorf("%s: Bus Location: %w", file, err)
		}
		gpus = append(gpus, found{addr, info})
	}
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].addr.Compare(gpus[j].addr) < 0 })

	sysRoot := "/sys"
	if filepath.Clean(procRoot) != "/proc" {
		sysRoot = filepath.Join(filepath.Dir(filepath.Clean(procRoot)), "sys")
	}
	for i, g := range gpus {
		gis, _ := filepath.Glob(filepath.Join(base, "capabilities", "gpu"+strconv.Itoa(g.info.Minor), "mig", "gi*"))
		if len(gis) > 0 {
			return nil, fmt.Errorf("%w: GPU %s (%s) has MIG instances; discover GPUs with NVML instead", ErrMIGNeedsNVML, g.info.UUID, g.addr)
		}
		sys.Devices = append(sys.Devices, gpu.Device{
			Index:    i,
			Minor:    g.info.Minor,
			UUID:     g.info.UUID,
			PCIBusID: g.addr.String(),
			Name:     g.info.Model,
			NUMANode: sysfsNUMANode(sysRoot, g.addr),
		})
	}
	return sys, nil
}

// information is what DiscoverProcfs uses of
// /proc/driver/nvidia/gpus/<bus id>/information.
type information struct {
	Model       string
	UUID        string
	BusLocation string
	Minor       int
	Excluded    bool
}

// parseInformation reads the "Key: \t value" lines of an information file.
// Unknown keys are ignored (drivers add some); UUID, bus location and minor
// are required.
func parseInformation(data []byte) (information, error) {
	var info information
	minor := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		switch strings.TrimSpace(key) {
		case "Model":
			info.Model = value
		case "GPU UUID":
			info.UUID = value
		case "Bus Location":
			info.BusLocation = value
		case "Device Minor":
			minor = value
		case "GPU Excluded":
			info.Excluded = strings.EqualFold(value, "yes")
		}
	}
	if err := sc.Err(); err != nil {
		return information{}, fmt.Errorf("reading lines: %w", err)
	}
	if !strings.HasPrefix(info.UUID, "GPU-") {
		return information{}, fmt.Errorf("GPU UUID %q: want GPU-<hex>", info.UUID)
	}
	n, err := strconv.Atoi(minor)
	if err != nil || n < 0 || n > 255 {
		return information{}, fmt.Errorf("Device Minor %q: want 0 to 255", minor)
	}
	info.Minor = n
	if info.BusLocation == "" {
		return information{}, errors.New("no Bus Location line")
	}
	return info, nil
}

var versionRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9]+(\.[0-9]+)+$`) })

// ParseNVRMVersion returns the driver version ("580.159.04") from the text of
// /proc/driver/nvidia/version, whose first line is e.g.
// "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (...)"
// or, from older drivers, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ...".
func ParseNVRMVersion(data []byte) (string, error) {
	for line := range strings.SplitSeq(string(data), "\n") {
		rest, ok := strings.CutPrefix(line, "NVRM version:")
		if !ok {
			continue
		}
		for f := range strings.FieldsSeq(rest) {
			if versionRE().MatchString(f) {
				return f, nil
			}
		}
		return "", fmt.Errorf("no version number in %q", strings.TrimSpace(line))
	}
	return "", errors.New(`no "NVRM version:" line`)
}

// parseMIGMinors reads /proc/driver/nvidia-caps/mig-minors: lines of
// "<capability> <minor>", e.g. "gpu0/gi1/ci0/access 13".
func parseMIGMinors(data []byte) (map[string]int, error) {
	m := map[string]int{}
	for i, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.Atoi(f[len(f)-1])
		if len(f) != 2 || err != nil || n < 0 {
			return nil, fmt.Errorf("line %d %q: want \"<capability> <minor>\"", i+1, line)
		}
		m[f[0]] = n
	}
	return m, nil
}

// migCapMinors finds the capability minors of a MIG device in the driver's
// table when one was read, else computes them (the table is static; see
// gpu.MIGCapMinors).
func migCapMinors(table map[string]int, gpuMinor, gi, ci int) (int, int, error) {
	giKey := fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, gi)
	ciKey := fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, gi, ci)
	g, gok := table[giKey]
	c, cok := table[ciKey]
	if gok && cok {
		return g, c, nil
	}
	return gpu.MIGCapMinors(gpuMinor, gi, ci)
}

// sysfsNUMANode reads the GPU's NUMA node from sysfs; -1 when unknown.
func sysfsNUMANode(sysRoot string, addr gpu.PCIAddress) int {
	data, err := os.ReadFile(filepath.Join(sysRoot, "bus", "pci", "devices", addr.SysfsName(), "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}
