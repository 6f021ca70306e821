package sim

import (
	"crypto/sha256"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// ErrUnknownProfile is returned by Load for a name that is neither a built-in
// profile nor a file path.
var ErrUnknownProfile = errors.New("unknown simulated GPU profile")

// ErrInvalid is matched (errors.Is) by every error about the content of a
// description. Its text is not repeated in those errors, which start with the
// field at fault.
var ErrInvalid = errors.New("invalid simulated GPU description")

// invalid is an error about a description's content; it matches ErrInvalid.
type invalid struct{ msg string }

func (e *invalid) Error() string        { return e.msg }
func (e *invalid) Is(target error) bool { return target == ErrInvalid }

func invalidf(format string, args ...any) error {
	return &invalid{fmt.Sprintf(format, args...)}
}

//go:embed profiles/*.yaml
var profiles embed.FS

// Host is the file format: one simulated host. Optional fields are filled
// by Parse (see the package documentation for the defaults).
type Host struct {
	// DriverVersion is the kernel driver version, e.g. "580.159.04".
	DriverVersion string `json:"driverVersion" yaml:"driverVersion"`
	// CUDADriverVersion is "major.minor", e.g. "13.0".
	CUDADriverVersion string `json:"cudaDriverVersion" yaml:"cudaDriverVersion"`
	// Seed makes the generated UUIDs; defaults to the profile or file name.
	Seed    string       `json:"seed,omitempty" yaml:"seed,omitempty"`
	Devices []DeviceSpec `json:"devices" yaml:"devices"`
}

// DeviceSpec is one simulated GPU. Pointers mark fields whose zero value is
// meaningful, so that omitting them can pick a default.
type DeviceSpec struct {
	Name              string       `json:"name" yaml:"name"`
	UUID              string       `json:"uuid,omitempty" yaml:"uuid,omitempty"`
	Minor             *int         `json:"minor,omitempty" yaml:"minor,omitempty"`
	PCIBusID          string       `json:"pciBusID,omitempty" yaml:"pciBusID,omitempty"`
	MemoryMiB         uint64       `json:"memoryMiB" yaml:"memoryMiB"`
	ComputeCapability string       `json:"computeCapability" yaml:"computeCapability"`
	Architecture      string       `json:"architecture,omitempty" yaml:"architecture,omitempty"`
	Brand             string       `json:"brand,omitempty" yaml:"brand,omitempty"`
	NUMANode          *int         `json:"numaNode,omitempty" yaml:"numaNode,omitempty"`
	MIGEnabled        bool         `json:"migEnabled,omitempty" yaml:"migEnabled,omitempty"`
	MIGDevices        []MIGSpec    `json:"migDevices,omitempty" yaml:"migDevices,omitempty"`
	NVLinks           []NVLinkSpec `json:"nvlinks,omitempty" yaml:"nvlinks,omitempty"`
}

// MIGSpec is one MIG device (a GPU instance with one compute instance).
type MIGSpec struct {
	// Profile such as "1g.10gb" or "1c.3g.20gb".
	Profile string `json:"profile" yaml:"profile"`
	// GPUInstance defaults to the MIG device's position + 1.
	GPUInstance     *int   `json:"gpuInstance,omitempty" yaml:"gpuInstance,omitempty"`
	ComputeInstance int    `json:"computeInstance,omitempty" yaml:"computeInstance,omitempty"`
	MemoryMiB       uint64 `json:"memoryMiB,omitempty" yaml:"memoryMiB,omitempty"`
	UUID            string `json:"uuid,omitempty" yaml:"uuid,omitempty"`
}

// NVLinkSpec is a set of links from a GPU to a peer GPU or to the NVSwitch fabric.
type NVLinkSpec struct {
	// Peer is the other GPU's UUID or index; empty with Switch.
	Peer   string `json:"peer,omitempty" yaml:"peer,omitempty"`
	Links  int    `json:"links" yaml:"links"`
	Switch bool   `json:"switch,omitempty" yaml:"switch,omitempty"`
}

// Profiles lists the built-in profile names, sorted.
func Profiles() []string {
	entries, err := profiles.ReadDir("profiles")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(names)
	return names
}

// ProfileYAML returns the YAML text of a built-in profile, as an example for
// users writing their own.
func ProfileYAML(name string) ([]byte, error) {
	b, err := profiles.ReadFile(path.Join("profiles", name+".yaml"))
	if errors.Is(err, fs.ErrNotExist) || !validProfileName(name) {
		return nil, fmt.Errorf("%w %q: use one of %s or a path to a YAML file",
			ErrUnknownProfile, name, strings.Join(Profiles(), ", "))
	}
	return b, err
}

func validProfileName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "/\\.")
}

// IsPath reports whether Load takes spec as a file path rather than a profile name.
func IsPath(spec string) bool {
	if strings.Contains(spec, "/") {
		return true
	}
	switch strings.ToLower(filepath.Ext(spec)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// Load returns the simulated host named by spec: a built-in profile name
// (see Profiles) or the path of a YAML or JSON file. System.Backend is
// "sim:<spec>".
func Load(spec string) (*gpu.System, error) {
	var (
		data []byte
		err  error
		seed string
	)
	if IsPath(spec) {
		data, err = os.ReadFile(spec)
		if err != nil {
			return nil, fmt.Errorf("reading simulated GPU file (for --gpus sim:FILE; profiles are %s): %w", strings.Join(Profiles(), ", "), err)
		}
		seed = strings.TrimSuffix(filepath.Base(spec), filepath.Ext(spec))
	} else {
		data, err = ProfileYAML(spec)
		if err != nil {
			return nil, err
		}
		seed = spec
	}
	sys, err := Parse(data, seed)
	if err != nil {
		return nil, fmt.Errorf("simulated GPUs %s: %w", spec, err)
	}
	sys.Backend = "sim:" + spec
	return sys, nil
}

// Parse reads a description (YAML or JSON; unknown keys are an error), fills
// the defaults and validates it. seed makes the UUIDs left out of the text
// when the text sets no seed of its own. The result's Backend is empty.
func Parse(data []byte, seed string) (*gpu.System, error) {
	var h Host
	if err := decodeStrict(data, &h); err != nil {
		return nil, invalidf("%s", err)
	}
	if h.Seed == "" {
		h.Seed = seed
	}
	return h.build()
}

var (
	versionRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9]+(\.[0-9]+){1,2}$`) })
	uuidHex   = `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`
	gpuUUIDRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^GPU-` + uuidHex + `$`) })
	migUUIDRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^MIG-` + uuidHex + `$`) })
	// A MIG profile: [<c>c.]<g>g.<mem>gb[+<attribute>...], e.g. 1g.10gb,
	// 1c.3g.20gb, 1g.10gb+me.
	migProfileRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([0-9]+c\.)?[0-9]+g\.[0-9]+gb(\+[a-z0-9.]+)*$`) })
	migMemRE     = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`g\.([0-9]+)gb`) })
)

// wholeVersion turns "13" into "13.0", for a version written as a bare
// number.
func wholeVersion(s string) string {
	if s != "" && strings.Trim(s, "0123456789") == "" {
		return s + ".0"
	}
	return s
}

func (h *Host) build() (*gpu.System, error) {
	sys := &gpu.System{
		DriverVersion:     h.DriverVersion,
		CUDADriverVersion: wholeVersion(h.CUDADriverVersion),
		Devices:           make([]gpu.Device, 0, len(h.Devices)),
	}
	if !versionRE().MatchString(sys.DriverVersion) {
		return nil, invalidf("driverVersion: %q: want a driver version such as \"580.159.04\"", h.DriverVersion)
	}
	if _, _, err := gpu.ParseComputeCapability(sys.CUDADriverVersion); err != nil {
		return nil, invalidf("cudaDriverVersion: %q: want major.minor in quotes, e.g. \"13.0\"", h.CUDADriverVersion)
	}
	seen := map[string]string{} // UUIDs, minors and bus ids already used -> by whom
	claim := func(kind, value, who string) error {
		key := kind + "\x00" + value
		if prev, ok := seen[key]; ok {
			return invalidf("%s: %s %s is also used by %s", who, kind, value, prev)
		}
		seen[key] = who
		return nil
	}
	for i := range h.Devices {
		d, err := h.device(i)
		if err != nil {
			return nil, err
		}
		who := fmt.Sprintf("devices[%d]", i)
		if err := claim("uuid", d.UUID, who); err != nil {
			return nil, err
		}
		if err := claim("minor", strconv.Itoa(d.Minor), who); err != nil {
			return nil, err
		}
		if err := claim("pciBusID", d.PCIBusID, who); err != nil {
			return nil, err
		}
		for j, m := range d.MIGDevices {
			mwho := fmt.Sprintf("devices[%d].migDevices[%d]", i, j)
			if err := claim("uuid", m.UUID, mwho); err != nil {
				return nil, err
			}
			if err := claim("gpuInstance/computeInstance", fmt.Sprintf("%d/%d/%d", i, m.GPUInstance, m.ComputeInstance), mwho); err != nil {
				return nil, err
			}
		}
		sys.Devices = append(sys.Devices, d)
	}
	for i := range h.Devices {
		links, err := h.nvlinks(i, sys.Devices)
		if err != nil {
			return nil, err
		}
		sys.Devices[i].NVLinks = links
	}
	return sys, nil
}

// device fills the defaults of devices[i] and checks its fields.
func (h *Host) device(i int) (gpu.Device, error) {
	s := h.Devices[i]
	bad := func(field, format string, args ...any) (gpu.Device, error) {
		return gpu.Device{}, invalidf("devices[%d].%s: %s", i, field, fmt.Sprintf(format, args...))
	}
	d := gpu.Device{
		Index:             i,
		Minor:             i,
		UUID:              s.UUID,
		Name:              s.Name,
		Brand:             s.Brand,
		Architecture:      s.Architecture,
		ComputeCapability: wholeVersion(s.ComputeCapability),
		MemoryMiB:         s.MemoryMiB,
		NUMANode:          -1,
		MIGEnabled:        s.MIGEnabled,
	}
	if s.Name == "" {
		return bad("name", "missing: give the product name, e.g. \"NVIDIA H100 80GB HBM3\"")
	}
	if s.Minor != nil {
		d.Minor = *s.Minor
	}
	if d.Minor < 0 || d.Minor > 255 {
		return bad("minor", "%d: want 0 to 255", d.Minor)
	}
	if d.UUID == "" {
		d.UUID = "GPU-" + uuidFrom(h.Seed, "gpu", strconv.Itoa(i))
	} else if !gpuUUIDRE().MatchString(d.UUID) {
		return bad("uuid", "%q: want GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx in lower-case hex", d.UUID)
	}
	if s.PCIBusID == "" {
		d.PCIBusID = gpu.PCIAddress{Bus: uint8(i + 1)}.String()
		if i >= 255 {
			d.PCIBusID = gpu.PCIAddress{Domain: uint32(i / 255), Bus: uint8(i%255 + 1)}.String()
		}
	} else {
		a, err := gpu.ParsePCIAddress(s.PCIBusID)
		if err != nil {
			return bad("pciBusID", "%v", err)
		}
		d.PCIBusID = a.String()
	}
	if s.MemoryMiB == 0 {
		return bad("memoryMiB", "missing: give the memory in MiB, e.g. 81559")
	}
	major, minor, err := gpu.ParseComputeCapability(d.ComputeCapability)
	if err != nil {
		return bad("computeCapability", "%q: want major.minor in quotes, e.g. \"9.0\"", s.ComputeCapability)
	}
	if d.Architecture == "" {
		d.Architecture = gpu.ArchitectureOf(major, minor)
	}
	if d.Brand == "" {
		d.Brand = "unknown"
	}
	if !gpu.IsBrand(d.Brand) {
		return bad("brand", "%q: use one of %s", d.Brand, strings.Join(gpu.Brands, ", "))
	}
	if s.NUMANode != nil {
		d.NUMANode = *s.NUMANode
	}
	if d.NUMANode < -1 {
		return bad("numaNode", "%d: want a node number, or -1 for unknown", d.NUMANode)
	}
	if len(s.MIGDevices) > 0 && !s.MIGEnabled {
		return bad("migDevices", "%d MIG devices on a GPU with migEnabled false: set migEnabled: true", len(s.MIGDevices))
	}
	for j, ms := range s.MIGDevices {
		m, err := h.migDevice(i, j, d, ms)
		if err != nil {
			return gpu.Device{}, err
		}
		d.MIGDevices = append(d.MIGDevices, m)
	}
	return d, nil
}

func (h *Host) migDevice(i, j int, parent gpu.Device, s MIGSpec) (gpu.MIGDevice, error) {
	bad := func(field, format string, args ...any) (gpu.MIGDevice, error) {
		return gpu.MIGDevice{}, invalidf("devices[%d].migDevices[%d].%s: %s", i, j, field, fmt.Sprintf(format, args...))
	}
	m := gpu.MIGDevice{
		Index:           j,
		Parent:          i,
		UUID:            s.UUID,
		Profile:         strings.TrimPrefix(s.Profile, "MIG "),
		GPUInstance:     j + 1,
		ComputeInstance: s.ComputeInstance,
		MemoryMiB:       s.MemoryMiB,
	}
	if !migProfileRE().MatchString(m.Profile) {
		return bad("profile", "%q: want a MIG profile such as \"1g.10gb\" or \"1c.3g.20gb\"", s.Profile)
	}
	if s.GPUInstance != nil {
		m.GPUInstance = *s.GPUInstance
	}
	if m.MemoryMiB == 0 {
		gb, _ := strconv.ParseUint(migMemRE().FindStringSubmatch(m.Profile)[1], 10, 32)
		m.MemoryMiB = gb * 1024
	}
	if m.UUID == "" {
		m.UUID = "MIG-" + uuidFrom(h.Seed, "gpu", strconv.Itoa(i), "mig", strconv.Itoa(j))
	} else if !migUUIDRE().MatchString(m.UUID) {
		return bad("uuid", "%q: want MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx in lower-case hex", m.UUID)
	}
	var err error
	m.GICapMinor, m.CICapMinor, err = gpu.MIGCapMinors(parent.Minor, m.GPUInstance, m.ComputeInstance)
	if err != nil {
		return bad("gpuInstance", "%v", err)
	}
	return m, nil
}

// nvlinks resolves the links of devices[i] to peers among devs.
func (h *Host) nvlinks(i int, devs []gpu.Device) ([]gpu.NVLink, error) {
	var out []gpu.NVLink
	for k, l := range h.Devices[i].NVLinks {
		bad := func(field, format string, args ...any) ([]gpu.NVLink, error) {
			return nil, invalidf("devices[%d].nvlinks[%d].%s: %s", i, k, field, fmt.Sprintf(format, args...))
		}
		if l.Links <= 0 || l.Links > 36 {
			return bad("links", "%d: want 1 to 36 (NVML's most links per GPU)", l.Links)
		}
		if l.Switch {
			if l.Peer != "" {
				return bad("peer", "%q with switch: true: links go either to a peer GPU or to the NVSwitch", l.Peer)
			}
			out = append(out, gpu.NVLink{Switch: true, Links: l.Links})
			continue
		}
		peer := -1
		if n, err := strconv.Atoi(l.Peer); err == nil {
			if n >= 0 && n < len(devs) {
				peer = n
			}
		} else {
			for p := range devs {
				if devs[p].UUID == l.Peer {
					peer = p
				}
			}
		}
		switch {
		case l.Peer == "":
			return bad("peer", "missing: give the peer GPU's index or UUID, or set switch: true")
		case peer < 0:
			return bad("peer", "%q: no GPU has that index or UUID", l.Peer)
		case peer == i:
			return bad("peer", "%q: a GPU cannot link to itself", l.Peer)
		}
		out = append(out, gpu.NVLink{PeerUUID: devs[peer].UUID, Links: l.Links})
	}
	return out, nil
}

// uuidFrom makes the 8-4-4-4-12 hex body of a UUID from a hash of its parts,
// so the same description always yields the same UUIDs.
func uuidFrom(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	b := sum[:16]
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
