package legacyapi

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/readings"
)

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
