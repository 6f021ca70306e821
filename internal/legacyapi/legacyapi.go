package legacyapi

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/gantry-gpu/gantry/internal/dockervol"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/readings"
)

// DriverVolume is the name of the original's one volume, which ?vol= may name.
const DriverVolume = "nvidia_driver"

// driverMount is where the original's volume, and our binds, appear in a container.
const driverMount = "/usr/local/nvidia"

// Control device nodes every GPU container needs; nvidia-uvm-tools only when the host has it.
const (
	devCtl      = "/dev/nvidiactl"
	devUVM      = "/dev/nvidia-uvm"
	devUVMTools = "/dev/nvidia-uvm-tools"
)

// Reader reads a GPU's current values (readings.NewNVML, readings.NewSim).
type Reader interface {
	Read(uuid string) (readings.Sample, error)
}

// InfoReader is a Reader that also gives /gpu/info's fixed facts, as both of
// package readings' Readers do. With a Reader that is not one, those facts
// are null, and P2P Available lists only the NVLink peers discovery saw.
type InfoReader interface {
	Reader
	Properties(uuid string) (readings.Properties, error)
	Peer(a, b string) (readings.Peer, error)
}

// Options say what the server reports.
type Options struct {
	System *gpu.System
	Driver *driver.Inventory
	// Reader gives /gpu/status its readings; nil reports every reading unknown.
	Reader Reader
	// DevRoot is the directory holding dev/nvidia* (the driver root by default);
	// it decides whether /dev/nvidia-uvm-tools is offered.
	DevRoot string
	// VolumePlugin says that nvidia-docker's volume plugin (package
	// dockervol) serves the driver beside this API: /docker/cli then
	// answers as the original did, with the volume nvidia_driver_<version>
	// and its driver, instead of binds of the host's files.
	VolumePlugin bool
	Logger       *slog.Logger
}

// Server answers the REST API.
type Server struct {
	opts Options
	mux  *http.ServeMux

	mu sync.Mutex
	// fixed holds /gpu/info's facts that cannot change while the driver is
	// loaded, once all of them were read (the original read all of
	// /gpu/info once, at start).
	fixed *fixedFacts
}

// New makes a Server.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Server{opts: opts, mux: http.NewServeMux()}
	routes := map[string]http.HandlerFunc{
		"/gpu/info":        s.gpuInfo,
		"/gpu/info/json":   s.gpuInfoJSON,
		"/gpu/status":      s.gpuStatus,
		"/gpu/status/json": s.gpuStatusJSON,
		"/docker/cli":      s.dockerCLI,
		"/docker/cli/json": s.dockerCLIJSON,
		"/mesos/cli":       s.mesosCLI,
	}
	for p, h := range routes {
		s.mux.HandleFunc(p, h)
		s.mux.HandleFunc("/v1.0"+p, h)
	}
	return s
}

// ServeHTTP refuses every method but GET and HEAD, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method "+r.Method+" not allowed: this API is read-only, use GET", http.StatusMethodNotAllowed)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// ---- /docker/cli

// DockerArgs is /docker/cli/json's body.
type DockerArgs struct {
	// VolumeDriver is "nvidia-docker" when the volume plugin serves the
	// driver (Options.VolumePlugin), as in the original; empty otherwise,
	// as the volumes are then host binds that need no driver.
	VolumeDriver string
	// Volumes are --volume values: "nvidia_driver_<version>:/usr/local/nvidia:ro"
	// with the volume plugin, else "hostpath:containerpath:ro".
	Volumes []string
	// Devices are --device values, the control nodes first; HOST:CONTAINER
	// when the nodes are under a dev root other than /.
	Devices []string
}

// Words returns the arguments as docker run takes them.
func (a DockerArgs) Words() []string {
	var out []string
	if a.VolumeDriver != "" {
		out = append(out, "--volume-driver="+a.VolumeDriver)
	}
	for _, v := range a.Volumes {
		out = append(out, "--volume="+v)
	}
	for _, d := range a.Devices {
		out = append(out, "--device="+d)
	}
	return out
}

// DockerCLI computes the arguments for the GPUs named by dev and the volumes
// named by vol, both in the query syntax (space or comma separated; "" or "*" for all).
func (s *Server) DockerCLI(dev, vol string) (*DockerArgs, error) {
	devs, err := SelectDevices(s.opts.System, dev)
	if err != nil {
		return nil, err
	}
	if names := splitList(vol); !(len(names) == 0 || len(names) == 1 && names[0] == "*") {
		for _, n := range names {
			if n != DriverVolume {
				return nil, fmt.Errorf("invalid volume: %s (the only volume is %s)", n, DriverVolume)
			}
		}
	}
	nodes := []string{devCtl, devUVM}
	if s.hasUVMTools() {
		nodes = append(nodes, devUVMTools)
	}
	for _, d := range devs {
		nodes = append(nodes, d.DevicePath())
	}
	a := &DockerArgs{}
	root := s.devRoot()
	for _, n := range nodes {
		if root == "/" {
			a.Devices = append(a.Devices, n)
		} else {
			// The nodes live under a dev root (a driver container's
			// /run/nvidia/driver): HOST:CONTAINER.
			a.Devices = append(a.Devices, filepath.Join(root, n)+":"+n)
		}
	}
	if s.opts.VolumePlugin {
		a.VolumeDriver = dockervol.PluginName
		a.Volumes = []string{dockervol.DockerVolume(s.driverVersion())}
	} else {
		a.Volumes = DriverBinds(s.opts.Driver)
	}
	return a, nil
}

func (s *Server) driverVersion() string {
	if s.opts.Driver != nil && s.opts.Driver.Version != "" {
		return s.opts.Driver.Version
	}
	return s.opts.System.DriverVersion
}

func (s *Server) devRoot() string {
	root := s.opts.DevRoot
	if root == "" && s.opts.Driver != nil {
		root = s.opts.Driver.Root
	}
	if root == "" {
		return "/"
	}
	return filepath.Clean(root)
}

func (s *Server) hasUVMTools() bool {
	_, err := os.Stat(filepath.Join(s.devRoot(), devUVMTools))
	return err == nil
}

// SelectDevices picks GPUs by index or UUID prefix ("GPU-..."), in index
// order, each once; an empty list or "*" picks all.
func SelectDevices(sys *gpu.System, spec string) ([]gpu.Device, error) {
	ids := splitList(spec)
	if len(ids) == 0 || len(ids) == 1 && ids[0] == "*" {
		return sys.Devices, nil
	}
	chosen := map[int]bool{}
next:
	for _, id := range ids {
		if strings.HasPrefix(id, "GPU-") {
			for i, d := range sys.Devices {
				if strings.HasPrefix(d.UUID, id) {
					chosen[i] = true
					continue next
				}
			}
		} else if n, err := strconv.Atoi(id); err == nil && n >= 0 && n < len(sys.Devices) {
			chosen[n] = true
			continue
		}
		return nil, fmt.Errorf("invalid device: %s (give GPU indexes 0-%d or UUIDs, separated by + or ,)", id, len(sys.Devices)-1)
	}
	var out []gpu.Device
	for i, d := range sys.Devices {
		if chosen[i] {
			out = append(out, d)
		}
	}
	return out, nil
}

func splitList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' })
}

// DriverBinds returns the read-only binds that stand in for the original's
// nvidia_driver volume: the driver's own directory at /usr/local/nvidia when
// all its programs and libraries live under one directory named for NVIDIA,
// else one bind per file into /usr/local/nvidia/{bin,lib64,lib}.
func DriverBinds(inv *driver.Inventory) []string {
	if inv == nil {
		return []string{}
	}
	var files []driver.File
	files = append(files, inv.Binaries...)
	files = append(files, inv.Libraries...)
	if len(files) == 0 {
		return []string{}
	}
	if dir := ownDirectory(files); dir != "" {
		return []string{dir + ":" + driverMount + ":ro"}
	}
	out := []string{}
	seen := map[string]bool{}
	add := func(host, ctr string) {
		if !seen[ctr] {
			seen[ctr] = true
			out = append(out, host+":"+ctr+":ro")
		}
	}
	for _, f := range inv.Binaries {
		add(f.HostPath, path.Join(driverMount, "bin", path.Base(f.ContainerPath)))
	}
	for _, f := range inv.Libraries {
		sub := "lib64"
		if f.Capability == driver.Compat32 {
			sub = "lib"
		}
		name := f.SONAME
		if name == "" {
			name = path.Base(f.ContainerPath)
		}
		add(f.HostPath, path.Join(driverMount, sub, name))
	}
	return out
}

// ownDirectory returns the directory holding every file when it is a
// directory of the driver's own (its name mentions nvidia), else "".
func ownDirectory(files []driver.File) string {
	common := filepath.Dir(files[0].HostPath)
	for _, f := range files[1:] {
		for !within(f.HostPath, common) {
			common = filepath.Dir(common)
		}
	}
	// Walk up from the deepest common directory to the nearest one named
	// for NVIDIA (/usr/local/nvidia from /usr/local/nvidia/lib64).
	for d := common; d != "/" && d != "."; d = filepath.Dir(d) {
		if strings.Contains(strings.ToLower(filepath.Base(d)), "nvidia") {
			return d
		}
	}
	return ""
}

func within(p, dir string) bool {
	return dir == "/" || strings.HasPrefix(p, dir+"/")
}

func (s *Server) dockerCLI(w http.ResponseWriter, r *http.Request) {
	a, err := s.DockerCLI(r.FormValue("dev"), r.FormValue("vol"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	words := a.Words()
	for _, word := range words {
		if strings.ContainsAny(word, " \t\n") {
			// Clients split the text on spaces; a path with one would be cut.
			http.Error(w, fmt.Sprintf("argument %q holds white space, which the text form cannot carry: use /docker/cli/json", word), http.StatusInternalServerError)
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	// No trailing newline: the original's clients split the body on " ".
	io.WriteString(w, strings.Join(words, " "))
}

func (s *Server) dockerCLIJSON(w http.ResponseWriter, r *http.Request) {
	a, err := s.DockerCLI(r.FormValue("dev"), r.FormValue("vol"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	writeJSON(w, a)
}

// MesosCLI is /mesos/cli's body: the agent flags that advertise the GPUs
// to Mesos, as the original wrote them: the attribute gpus holds
// /gpu/info/json's body, zlib-compressed, in unpadded URL-safe base64; the
// resource gpus is the set of the GPUs' UUIDs.
func (s *Server) MesosCLI() (string, error) {
	var js bytes.Buffer
	if err := json.NewEncoder(&js).Encode(s.GPUInfo()); err != nil {
		return "", err
	}
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(js.Bytes())
	if err := zw.Close(); err != nil {
		return "", err
	}
	uuids := make([]string, 0, len(s.opts.System.Devices))
	for _, d := range s.opts.System.Devices {
		uuids = append(uuids, d.UUID)
	}
	return fmt.Sprintf("--attributes=gpus:%s --resources=gpus:{%s}",
		base64.RawURLEncoding.EncodeToString(z.Bytes()), strings.Join(uuids, ",")), nil
}

func (s *Server) mesosCLI(w http.ResponseWriter, r *http.Request) {
	out, err := s.MesosCLI()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, out)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// ---- /gpu/info

// Info is /gpu/info/json's body.
type Info struct {
	Version struct{ Driver, CUDA string }
	Devices []DeviceInfo
}

// DeviceInfo is one GPU in the original's shape. Pointers are null when unknown.
type DeviceInfo struct {
	UUID  string
	Path  string
	Model *string
	Power *uint // power limit, W
	// CPUAffinity is the GPU's NUMA node; 0 on a host without NUMA, as the
	// original reported it.
	CPUAffinity *uint
	PCI         struct {
		BusID string
		BAR1  *uint64 // MiB
		// Bandwidth is the fastest link's, per direction: lanes times the
		// MB/s of one lane of that generation.
		Bandwidth *uint // MB/s
	}
	Clocks Clocks
	// Topology lists the GPUs this one can access directly, by bus id in
	// index order, with the kind of link to each; null when there are none.
	Topology []P2PLink
	Family   *string // architecture, "Hopper"
	Arch     *string // compute capability, "9.0"
	Cores    *uint   // CUDA cores
	Memory   struct {
		ECC    *bool // the current ECC mode
		Global *uint // MiB
		// Shared (per multiprocessor), Constant and L2Cache came from
		// CUDA's device properties (cudaDeviceProp's
		// sharedMemPerMultiprocessor, totalConstMem, l2CacheSize), which
		// NVML has no call for; they are always null.
		Shared   *uint // KiB
		Constant *uint // KiB
		L2Cache  *uint // KiB
		// Bandwidth is the original's formula on NVML's values: twice
		// (double data rate) the maximum memory clock in MHz times the bus
		// width in bytes.
		Bandwidth *uint // MB/s
	}
}

// Clocks are in MHz.
type Clocks struct {
	Cores  *uint
	Memory *uint
}

// P2PLink is a peer GPU and the kind of path to it.
type P2PLink struct {
	BusID string
	Link  LinkType
}

// LinkType is the kind of path between two GPUs, numbered as the
// original's P2PLinkType: 0 to 6 are the levels where their PCIe paths meet,
// and 7 and up, as NVIDIA's later bindings extended that enum, n NVLinks
// between them (7 for one, 24 for eighteen). JSON carries the number, the
// text form the name.
type LinkType uint

const (
	LinkUnknown      LinkType = iota // N/A
	LinkCrossCPU                     // across CPU sockets (NVML_TOPOLOGY_SYSTEM)
	LinkSameCPU                      // through one socket's host bridges (NVML_TOPOLOGY_NODE)
	LinkHostBridge                   // through one host bridge
	LinkMultiSwitch                  // through several PCIe switches
	LinkSingleSwitch                 // behind one PCIe switch
	LinkSameBoard                    // two GPUs of one board
	// LinkNVLink is one NVLink; LinkNVLink+n-1 is n of them.
	LinkNVLink
)

// NVLinks returns the LinkType of n NVLinks (n >= 1).
func NVLinks(n int) LinkType { return LinkNVLink + LinkType(n-1) }

var linkNames = []string{"N/A", "Cross CPU socket", "Same CPU socket", "Host PCI bridge",
	"Multiple PCI switches", "Single PCI switch", "Same board"}

var nvlinkCounts = []string{"Single NVLink", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine",
	"Ten", "Eleven", "Twelve", "Thirteen", "Fourteen", "Fifteen", "Sixteen", "Seventeen", "Eighteen"}

// String is the name the original's text form printed; NVLink counts past
// eighteen, which NVIDIA's enum stops at, are given in digits.
func (t LinkType) String() string {
	switch {
	case t < LinkNVLink:
		return linkNames[t]
	case t == LinkNVLink:
		return nvlinkCounts[0]
	case int(t-LinkNVLink) < len(nvlinkCounts):
		return nvlinkCounts[t-LinkNVLink] + " NVLinks"
	}
	return strconv.Itoa(int(t-LinkNVLink)+1) + " NVLinks"
}

// pcieLink is the LinkType of a PCIe meeting point.
func pcieLink(p readings.PCIePath) LinkType {
	switch p {
	case readings.PCIePathSameBoard:
		return LinkSameBoard
	case readings.PCIePathSingleSwitch:
		return LinkSingleSwitch
	case readings.PCIePathMultipleSwitches:
		return LinkMultiSwitch
	case readings.PCIePathHostBridge:
		return LinkHostBridge
	case readings.PCIePathSameNUMANode:
		return LinkSameCPU
	case readings.PCIePathCrossNUMANode:
		return LinkCrossCPU
	}
	return LinkUnknown
}

// pcieLaneMBps is one PCIe lane's bandwidth per direction in MB/s, by
// generation: the transfer rate less the line code (8b/10b to Gen 2,
// 128b/130b for Gen 3 to 5, FLIT mode from Gen 6). Gens 1 to 4 are the
// original's table; it had no later ones and so reported 0 for them.
var pcieLaneMBps = map[int]uint{1: 250, 2: 500, 3: 985, 4: 1969, 5: 3938, 6: 7563, 7: 15125}

func ptr[T any](v T) *T { return &v }

// GPUInfo gathers /gpu/info's facts. The power limit, BAR1 size and
// maximum clocks come from the Reader, read per request; cores, PCIe link,
// memory bus width, ECC mode and the peers from an InfoReader, read once.
// A GPU the Reader cannot read has those facts null.
func (s *Server) GPUInfo() Info {
	return s.info(s.readAll())
}

func (s *Server) info(samples []readings.Sample) Info {
	var info Info
	sys := s.opts.System
	fixed := s.fixedFacts()
	info.Version.Driver = sys.DriverVersion
	info.Version.CUDA = sys.CUDADriverVersion
	info.Devices = []DeviceInfo{}
	for i, d := range sys.Devices {
		var di DeviceInfo
		di.UUID = d.UUID
		di.Path = d.DevicePath()
		if d.Name != "" {
			di.Model = ptr(d.Name)
		}
		// The original read the device's numa_node in sysfs and reported
		// node 0 when it was missing or -1 (a host without NUMA).
		di.CPUAffinity = ptr(uint(max(d.NUMANode, 0)))
		di.PCI.BusID = d.PCIBusID
		if d.Architecture != "" {
			di.Family = ptr(d.Architecture)
		}
		if d.ComputeCapability != "" {
			di.Arch = ptr(d.ComputeCapability)
		}
		if d.MemoryMiB > 0 {
			di.Memory.Global = ptr(uint(d.MemoryMiB))
		}
		sample, props := samples[i], fixed.props[i]
		di.Power = uintOf(sample.PowerLimitWatts)
		di.PCI.BAR1 = uint64Of(sample.BAR1TotalBytes / mib)
		di.Clocks.Cores = uintOf(sample.MaxSMClockMHz)
		di.Clocks.Memory = uintOf(sample.MaxMemoryClockMHz)
		if props.Cores > 0 {
			di.Cores = ptr(uint(props.Cores))
		}
		if lane, ok := pcieLaneMBps[props.PCIeMaxGeneration]; ok && props.PCIeMaxWidth > 0 {
			di.PCI.Bandwidth = ptr(lane * uint(props.PCIeMaxWidth))
		}
		di.Memory.ECC = props.ECCEnabled
		if di.Clocks.Memory != nil && props.MemoryBusWidthBits > 0 {
			// The original: 2 * (memoryClockRate kHz / 1000) * (memoryBusWidth / 8).
			di.Memory.Bandwidth = ptr(2 * *di.Clocks.Memory * uint(props.MemoryBusWidthBits/8))
		}
		di.Topology = fixed.topology[i]
		info.Devices = append(info.Devices, di)
	}
	return info
}

// fixedFacts are the facts of /gpu/info that stay the same while the
// driver is loaded, by device position.
type fixedFacts struct {
	props    []readings.Properties
	topology [][]P2PLink
}

// fixedFacts returns the cached facts, reading them when none are cached.
// Facts read with an error are returned but not kept, so a GPU that could
// not be read is tried again on the next request.
func (s *Server) fixedFacts() fixedFacts {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fixed != nil {
		return *s.fixed
	}
	f, complete := s.readFixed()
	if complete {
		s.fixed = &f
	}
	return f
}

func (s *Server) readFixed() (fixedFacts, bool) {
	devs := s.opts.System.Devices
	f := fixedFacts{props: make([]readings.Properties, len(devs)), topology: make([][]P2PLink, len(devs))}
	ir, _ := s.opts.Reader.(InfoReader)
	complete := true
	fail := func(err error) {
		if complete {
			s.opts.Logger.Warn("reading GPU properties for /gpu/info", "err", err)
		}
		complete = false
	}
	for i, d := range devs {
		if ir == nil {
			continue
		}
		p, err := ir.Properties(d.UUID)
		if err != nil {
			fail(err)
			continue
		}
		f.props[i] = p
	}
	for i, a := range devs {
		for j, b := range devs {
			if i == j {
				continue
			}
			var peer readings.Peer
			if ir != nil {
				var err error
				if peer, err = ir.Peer(a.UUID, b.UUID); err != nil {
					fail(err)
				}
			}
			if l, ok := p2pLink(a, b, peer); ok {
				f.topology[i] = append(f.topology[i], P2PLink{BusID: b.PCIBusID, Link: l})
			}
		}
	}
	return f, complete
}

// p2pLink is the entry of P2P Available for peer b of GPU a, and whether
// there is one. As in the original, only GPUs that may access each other's
// memory directly are listed (what it asked CUDA's cudaDeviceCanAccessPeer,
// NVML's P2P status here); none can in MIG mode. NVLinks, from discovery,
// come before the PCIe level, as in NVIDIA's later bindings. A pair the
// driver says nothing of is listed only when NVLink joins it.
func p2pLink(a, b gpu.Device, peer readings.Peer) (LinkType, bool) {
	if a.MIGEnabled || b.MIGEnabled || peer.P2P != nil && !*peer.P2P {
		return 0, false
	}
	if n := nvlinksBetween(a, b); n > 0 {
		return NVLinks(n), true
	}
	if peer.P2P == nil && peer.Path == readings.PCIePathUnknown {
		return 0, false
	}
	return pcieLink(peer.Path), true
}

// nvlinksBetween counts the NVLinks joining two GPUs: direct links (listed
// on either side; NVML lists both), plus for two GPUs on an NVSwitch fabric
// the smaller of their link counts into it, which is the count
// `nvidia-smi topo -m` shows between them (NV18 on an HGX H100), and the
// measure package topology ranks pairs by.
func nvlinksBetween(a, b gpu.Device) int {
	direct := func(d gpu.Device, peer string) (n int) {
		for _, l := range d.NVLinks {
			if !l.Switch && l.PeerUUID == peer {
				n += l.Links
			}
		}
		return n
	}
	fabric := func(d gpu.Device) (n int) {
		for _, l := range d.NVLinks {
			if l.Switch {
				n += l.Links
			}
		}
		return n
	}
	return max(direct(a, b.UUID), direct(b, a.UUID)) + min(fabric(a), fabric(b))
}

func (s *Server) gpuInfoJSON(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, s.GPUInfo())
}

func (s *Server) gpuInfo(w http.ResponseWriter, r *http.Request) {
	info := s.GPUInfo()
	t := newText(w)
	t.line("")
	t.row("Driver version:", info.Version.Driver)
	t.row("Supported CUDA version:", info.Version.CUDA)
	for i, d := range info.Devices {
		t.line("")
		t.line(fmt.Sprintf("Device #%d", i))
		t.row("  Model:", str(d.Model))
		t.row("  UUID:", d.UUID)
		t.row("  Path:", d.Path)
		t.row("  Family:", str(d.Family))
		t.row("  Arch:", str(d.Arch))
		t.row("  Cores:", num(d.Cores, ""))
		t.row("  Power:", num(d.Power, " W"))
		cpu := "N/A"
		if d.CPUAffinity != nil {
			cpu = fmt.Sprintf("NUMA node%d", *d.CPUAffinity)
		}
		t.row("  CPU Affinity:", cpu)
		t.line("  PCI")
		t.row("    Bus ID:", d.PCI.BusID)
		t.row("    BAR1:", num(d.PCI.BAR1, " MiB"))
		t.row("    Bandwidth:", num(d.PCI.Bandwidth, " MB/s"))
		t.line("  Memory")
		ecc := "N/A"
		if d.Memory.ECC != nil {
			ecc = strconv.FormatBool(*d.Memory.ECC)
		}
		t.row("    ECC:", ecc)
		t.row("    Global:", num(d.Memory.Global, " MiB"))
		t.row("    Constant:", num(d.Memory.Constant, " KiB"))
		t.row("    Shared:", num(d.Memory.Shared, " KiB"))
		t.row("    L2 Cache:", num(d.Memory.L2Cache, " KiB"))
		t.row("    Bandwidth:", num(d.Memory.Bandwidth, " MB/s"))
		t.line("  Clocks")
		t.row("    Cores:", num(d.Clocks.Cores, " MHz"))
		t.row("    Memory:", num(d.Clocks.Memory, " MHz"))
		if len(d.Topology) == 0 {
			t.row("  P2P Available:", "None")
		} else {
			t.line("  P2P Available")
			for _, l := range d.Topology {
				t.line(fmt.Sprintf("    %s - %s", l.BusID, l.Link))
			}
		}
	}
	t.line("")
	t.flush()
}

// ---- /gpu/status

// Status is /gpu/status/json's body.
type Status struct {
	Devices []DeviceStatus
}

// DeviceStatus is one GPU's readings in the original's shape and units
// (whole numbers, cut down as the original divided them); null when unknown.
type DeviceStatus struct {
	Power       *uint // W
	Temperature *uint // °C
	Utilization struct {
		GPU     *uint // %
		Memory  *uint
		Encoder *uint
		Decoder *uint
	}
	Memory struct {
		GlobalUsed *uint64 // MiB
		// Volatile uncorrected ECC errors by location.
		ECCErrors struct {
			L1Cache *uint64
			L2Cache *uint64
			Global  *uint64 // device memory
		}
	}
	// Clocks are the current SM and memory clocks.
	Clocks Clocks
	PCI    struct {
		BAR1Used   *uint64 // MiB
		Throughput struct {
			RX *uint // MB/s
			TX *uint
		}
	}
	// Processes are null when there are none, as in the original.
	Processes []Process
}

// Process is a process using a GPU.
type Process struct {
	PID uint
	// Name is argv[0]; empty when the process is not visible from here.
	Name string
	// MemoryUsed is in MiB; null when NVML cannot tell.
	MemoryUsed *uint64
}

const mib = 1 << 20

// usedOf is "used / total UNIT", as the original printed power, memory and
// BAR1; "N/A" when either is unknown.
func usedOf[A, B ~uint | ~uint64](used *A, total *B, unit string) string {
	if used == nil || total == nil {
		return "N/A"
	}
	return fmt.Sprintf("%d / %d%s", *used, *total, unit)
}

// uintOf cuts a reading down to a whole number, as the original's integer
// divisions did; nil when unknown.
func uintOf(f float64) *uint {
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return nil
	}
	return ptr(uint(math.Floor(f)))
}

func uint64Of(f float64) *uint64 {
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return nil
	}
	return ptr(uint64(math.Floor(f)))
}

// readAll reads every GPU once. A GPU the Reader cannot read has every
// value unknown; the first error is logged.
func (s *Server) readAll() []readings.Sample {
	out := make([]readings.Sample, len(s.opts.System.Devices))
	for i, d := range s.opts.System.Devices {
		out[i] = readings.Unknown()
		if s.opts.Reader == nil {
			continue
		}
		sample, err := s.opts.Reader.Read(d.UUID)
		if err != nil {
			s.opts.Logger.Warn("reading GPU", "gpu", d.Index, "uuid", d.UUID, "err", err)
			continue
		}
		out[i] = sample
	}
	return out
}

// GPUStatus reads every GPU once.
func (s *Server) GPUStatus() Status {
	return status(s.readAll())
}

func status(samples []readings.Sample) Status {
	st := Status{Devices: []DeviceStatus{}}
	for _, sample := range samples {
		var ds DeviceStatus
		ds.Power = uintOf(sample.PowerWatts)
		ds.Temperature = uintOf(sample.TemperatureCelsius)
		ds.Utilization.GPU = uintOf(sample.UtilizationPercent)
		ds.Utilization.Memory = uintOf(sample.MemoryUtilizationPercent)
		ds.Utilization.Encoder = uintOf(sample.EncoderUtilizationPercent)
		ds.Utilization.Decoder = uintOf(sample.DecoderUtilizationPercent)
		ds.Memory.GlobalUsed = uint64Of(sample.MemoryUsedBytes / mib)
		ds.Memory.ECCErrors.L1Cache = uint64Of(sample.ECCErrorsL1Cache)
		ds.Memory.ECCErrors.L2Cache = uint64Of(sample.ECCErrorsL2Cache)
		ds.Memory.ECCErrors.Global = uint64Of(sample.ECCErrorsDeviceMemory)
		ds.Clocks.Cores = uintOf(sample.SMClockMHz)
		ds.Clocks.Memory = uintOf(sample.MemoryClockMHz)
		ds.PCI.BAR1Used = uint64Of(sample.BAR1UsedBytes / mib)
		ds.PCI.Throughput.RX = uintOf(sample.PCIeRXBytesPerSecond / 1e6)
		ds.PCI.Throughput.TX = uintOf(sample.PCIeTXBytesPerSecond / 1e6)
		for _, p := range sample.Processes {
			ds.Processes = append(ds.Processes, Process{PID: uint(p.PID), Name: p.Name, MemoryUsed: uint64Of(p.UsedMemoryBytes / mib)})
		}
		st.Devices = append(st.Devices, ds)
	}
	return st
}

func (s *Server) gpuStatusJSON(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, s.GPUStatus())
}

func (s *Server) gpuStatus(w http.ResponseWriter, r *http.Request) {
	samples := s.readAll()
	st, info := status(samples), s.info(samples)
	t := newText(w)
	for i, ds := range st.Devices {
		di := info.Devices[i]
		t.line("")
		t.line(fmt.Sprintf("Device #%d", i))
		// As in the original, the power and BAR1 lines show "used / total"
		// or N/A, and need both.
		t.row("  Power:", usedOf(ds.Power, di.Power, " W"))
		t.row("  Temperature:", num(ds.Temperature, " °C"))
		t.line("  Utilization")
		t.row("    GPU:", num(ds.Utilization.GPU, " %"))
		t.row("    Memory:", num(ds.Utilization.Memory, " %"))
		t.row("    Encoder:", num(ds.Utilization.Encoder, " %"))
		t.row("    Decoder:", num(ds.Utilization.Decoder, " %"))
		t.line("  Memory")
		t.row("    Global:", usedOf(ds.Memory.GlobalUsed, di.Memory.Global, " MiB"))
		t.line("    ECC Errors")
		t.row("      L1 Cache:", num(ds.Memory.ECCErrors.L1Cache, ""))
		t.row("      L2 Cache:", num(ds.Memory.ECCErrors.L2Cache, ""))
		t.row("      Global:", num(ds.Memory.ECCErrors.Global, ""))
		t.line("  PCI")
		t.row("    BAR1:", usedOf(ds.PCI.BAR1Used, di.PCI.BAR1, " MiB"))
		t.line("    Throughput")
		t.row("      RX:", num(ds.PCI.Throughput.RX, " MB/s"))
		t.row("      TX:", num(ds.PCI.Throughput.TX, " MB/s"))
		t.line("  Clocks")
		t.row("    Cores:", num(ds.Clocks.Cores, " MHz"))
		t.row("    Memory:", num(ds.Clocks.Memory, " MHz"))
		if len(ds.Processes) == 0 {
			t.row("  Processes:", "None")
		} else {
			t.line("  Processes")
			for _, p := range ds.Processes {
				t.row("    - PID:", strconv.FormatUint(uint64(p.PID), 10))
				t.row("      Name:", str(&p.Name))
				t.row("      Memory:", num(p.MemoryUsed, " MiB"))
			}
		}
	}
	t.line("")
	t.flush()
}

// ---- text helpers

func str(p *string) string {
	if p == nil || *p == "" {
		return "N/A"
	}
	return *p
}

func num[T uint | uint64](p *T, unit string) string {
	if p == nil {
		return "N/A"
	}
	return fmt.Sprintf("%d%s", *p, unit)
}

// text lays out "Label:  value" rows as the original's tabwriter did: the
// values of a run of rows are aligned two spaces after the run's longest
// label, and a line without a value (a heading, a blank line) ends the run.
type text struct {
	w    io.Writer
	rows []textRow
}

type textRow struct {
	label, value string
	heading      bool
}

func newText(w io.Writer) *text {
	if rw, ok := w.(http.ResponseWriter); ok {
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	return &text{w: w}
}

// row adds "label: value". The value is printable: a process's name comes
// from its argv[0], which a container's process sets as it likes, and a
// newline in it would forge rows of the text.
func (t *text) row(label, value string) {
	t.rows = append(t.rows, textRow{label: label, value: printable(value)})
}

// printable replaces control characters and invalid UTF-8 with '?'.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return '?'
		}
		return r
	}, s)
}

// line is a row without a value.
func (t *text) line(s string) { t.rows = append(t.rows, textRow{label: s, heading: true}) }

func (t *text) flush() {
	var b strings.Builder
	for start := 0; start < len(t.rows); {
		if t.rows[start].heading {
			b.WriteString(t.rows[start].label + "\n")
			start++
			continue
		}
		end, width := start, 0
		for ; end < len(t.rows) && !t.rows[end].heading; end++ {
			width = max(width, utf8.RuneCountInString(t.rows[end].label))
		}
		for _, r := range t.rows[start:end] {
			fmt.Fprintf(&b, "%-*s  %s\n", width, r.label, r.value)
		}
		start = end
	}
	io.WriteString(t.w, b.String())
}
