package readings

import (
	"fmt"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// Properties are facts about a GPU that stay the same while the driver is
// loaded and that discovery (gpu.Device) does not keep, because only
// nvidia-docker 1.0's /gpu/info reports them. A zero value (nil for
// ECCEnabled) means unknown: NVML does not support the query on this GPU or
// driver.
type Properties struct {
	// Cores is the number of CUDA cores (nvmlDeviceGetNumGpuCores).
	Cores int
	// PCIeMaxGeneration and PCIeMaxWidth are the fastest PCIe link the GPU
	// and its slot can run at together (nvmlDeviceGetMaxPcieLinkGeneration
	// and ...Width): a Gen 5 GPU in a Gen 4 slot reports 4.
	PCIeMaxGeneration int
	PCIeMaxWidth      int
	// MemoryBusWidthBits is the width of the memory interface
	// (nvmlDeviceGetMemoryBusWidth): 5120 on an H100 SXM.
	MemoryBusWidthBits int
	// ECCEnabled is the current ECC mode; nil where the GPU has no ECC.
	ECCEnabled *bool
}

// PCIePath is where the PCIe paths of two GPUs meet, nearest first: NVML's
// nvmlGpuTopologyLevel_t, as `nvidia-smi topo -m` shows it (PSB, PIX, PXB,
// PHB, NODE, SYS).
type PCIePath int

const (
	PCIePathUnknown PCIePath = iota
	// PCIePathSameBoard: two GPUs of one board (NVML_TOPOLOGY_INTERNAL).
	PCIePathSameBoard
	// PCIePathSingleSwitch: behind one PCIe switch (NVML_TOPOLOGY_SINGLE, PIX).
	PCIePathSingleSwitch
	// PCIePathMultipleSwitches: through several switches without the host
	// bridge (NVML_TOPOLOGY_MULTIPLE, PXB).
	PCIePathMultipleSwitches
	// PCIePathHostBridge: through a CPU's PCIe host bridge (NVML_TOPOLOGY_HOSTBRIDGE, PHB).
	PCIePathHostBridge
	// PCIePathSameNUMANode: through the host bridges of one NUMA node, one
	// CPU socket (NVML_TOPOLOGY_NODE, formerly NVML_TOPOLOGY_CPU; NODE).
	PCIePathSameNUMANode
	// PCIePathCrossNUMANode: across the link between CPU sockets
	// (NVML_TOPOLOGY_SYSTEM, SYS).
	PCIePathCrossNUMANode
)

// Peer is what the driver says of one GPU's path to another.
type Peer struct {
	// Path is where their PCIe paths meet.
	Path PCIePath
	// P2P is whether the driver lets the first GPU read the other's memory
	// directly (NVML's P2P status for reads, which is what CUDA's
	// cudaDeviceCanAccessPeer answers); nil when the driver cannot tell.
	// It is false on MIG-enabled GPUs, which have no peer access.
	P2P *bool
}

// Properties gives a simulated GPU's model's values.
func (r simReader) Properties(uuid string) (Properties, error) {
	d, ok := r.devices[uuid]
	if !ok {
		return Properties{}, fmt.Errorf("simulated GPU %s: no such GPU", uuid)
	}
	m := simModelOf(d.Name)
	p := Properties{Cores: m.cores, PCIeMaxGeneration: m.pcieGen, PCIeMaxWidth: m.pcieWidth, MemoryBusWidthBits: m.busBits}
	if m.cores != 0 { // a model the simulator knows: all data centre GPUs, ECC on
		on := true
		p.ECCEnabled = &on
	}
	return p, nil
}

// Peer derives the path between two simulated GPUs from their bus ids and
// NUMA nodes, as a real host of that shape has it: GPUs on neighbouring buses
// (the same PCI domain and high hex digit of the bus number, 1A and 1B) sit
// behind one PCIe switch (the guess package topology makes too); other GPUs
// of one NUMA node meet at its host bridges, GPUs of two nodes across the
// socket link. A host whose NUMA nodes are unknown is taken to have one.
// Peer access is allowed between any two GPUs but MIG-enabled ones.
func (r simReader) Peer(a, b string) (Peer, error) {
	da, okA := r.devices[a]
	db, okB := r.devices[b]
	if !okA || !okB || a == b {
		return Peer{}, fmt.Errorf("simulated GPUs %s and %s: want two GPUs of the host", a, b)
	}
	p2p := !da.MIGEnabled && !db.MIGEnabled
	p := Peer{P2P: &p2p}
	pa, errA := gpu.ParsePCIAddress(da.PCIBusID)
	pb, errB := gpu.ParsePCIAddress(db.PCIBusID)
	sameNode := da.NUMANode < 0 || db.NUMANode < 0 || da.NUMANode == db.NUMANode
	switch {
	case errA != nil || errB != nil:
		p.Path = PCIePathUnknown
	case !sameNode:
		p.Path = PCIePathCrossNUMANode
	case pa.Domain == pb.Domain && pa.Bus>>4 == pb.Bus>>4:
		p.Path = PCIePathSingleSwitch
	default:
		p.Path = PCIePathSameNUMANode
	}
	return p, nil
}
