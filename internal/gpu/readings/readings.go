// Package readings reads a GPU's live values (utilisation, memory,
// temperature, power, clocks, ECC error counts, PCIe throughput and the
// processes using it) through NVML, or deterministic ones for simulated
// GPUs. It is kept apart from package metrics so that front ends that only
// need readings (gantry serve, the CLI) do not link Prometheus and gRPC.
//
// Both Readers (NewNVML, NewSim) also have two methods that nvidia-docker
// 1.0's /gpu/info needs and nothing else does, so they are not part of the
// Reader interface: Properties(uuid), a GPU's fixed facts (CUDA cores, the
// fastest PCIe link, memory bus width, ECC mode), and Peer(a, b), where the
// PCIe paths of two GPUs meet and whether the driver allows peer access
// between them.
package readings

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// Sample is one reading of a GPU. A value the GPU cannot report (NVML says
// it is not supported, such as utilisation on a MIG-enabled GPU, or the call
// fails) is NaN, never 0: consumers leave it out or show it as unknown.
type Sample struct {
	UtilizationPercent       float64
	MemoryUtilizationPercent float64
	// Encoder and decoder (NVENC/NVDEC) utilisation over NVML's sampling period.
	EncoderUtilizationPercent float64
	DecoderUtilizationPercent float64

	MemoryUsedBytes    float64
	MemoryTotalBytes   float64
	TemperatureCelsius float64
	PowerWatts         float64
	// PowerLimitWatts is the power management limit.
	PowerLimitWatts float64

	// Current and maximum clocks of the streaming multiprocessors (the
	// "cores" of nvidia-docker's API) and of the memory.
	SMClockMHz        float64
	MemoryClockMHz    float64
	MaxSMClockMHz     float64
	MaxMemoryClockMHz float64

	BAR1UsedBytes  float64
	BAR1TotalBytes float64

	// PCIe throughput, bytes per second; NVML measures it over a 20 ms window.
	PCIeRXBytesPerSecond float64
	PCIeTXBytesPerSecond float64

	// Volatile (since the driver loaded) uncorrected ECC error counts, by
	// location, as nvidia-docker 1.0 reported them; NaN when ECC is off or
	// the GPU does not count that location.
	ECCErrorsL1Cache      float64
	ECCErrorsL2Cache      float64
	ECCErrorsDeviceMemory float64

	// Processes using the GPU (compute and graphics, each PID once), in
	// NVML's order; nil when there are none or they cannot be listed.
	Processes []Process
}

// Process is a process with a context on a GPU.
type Process struct {
	// PID in the host's PID namespace, as NVML reports it (a containerised
	// process shows with its host PID).
	PID uint32
	// Name is the process's argv[0] (else its comm), read from /proc; empty
	// when the process is gone or not visible from here.
	Name string
	// UsedMemoryBytes is the GPU memory the process holds; NaN when NVML does
	// not know it (NVML_VALUE_NOT_AVAILABLE).
	UsedMemoryBytes float64
}

// Unknown is a Sample with every value unknown.
func Unknown() Sample {
	n := math.NaN()
	return Sample{
		UtilizationPercent: n, MemoryUtilizationPercent: n,
		EncoderUtilizationPercent: n, DecoderUtilizationPercent: n,
		MemoryUsedBytes: n, MemoryTotalBytes: n,
		TemperatureCelsius: n, PowerWatts: n, PowerLimitWatts: n,
		SMClockMHz: n, MemoryClockMHz: n, MaxSMClockMHz: n, MaxMemoryClockMHz: n,
		BAR1UsedBytes: n, BAR1TotalBytes: n,
		PCIeRXBytesPerSecond: n, PCIeTXBytesPerSecond: n,
		ECCErrorsL1Cache: n, ECCErrorsL2Cache: n, ECCErrorsDeviceMemory: n,
	}
}

// Reader reads a GPU's current values by UUID.
type Reader interface {
	Read(uuid string) (Sample, error)
}

// ProcessName returns the name of a host process as nvidia-smi shows it:
// argv[0] from PROC/PID/cmdline, else (a kernel thread, or a process that
// cleared its arguments) PROC/PID/comm. It returns "" when the process is
// gone or not visible in this PID namespace. proc is normally "/proc".
func ProcessName(proc string, pid uint32) string {
	dir := filepath.Join(proc, strconv.FormatUint(uint64(pid), 10))
	if b, err := os.ReadFile(filepath.Join(dir, "cmdline")); err == nil {
		if arg0, _, _ := bytes.Cut(b, []byte{0}); len(arg0) > 0 {
			return string(arg0)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil {
		return strings.TrimSpace(string(b))
	}
	return ""
}

// simReader gives simulated GPUs steady values made from their UUIDs, so
// that dashboards and tests see distinct, repeatable numbers.
type simReader struct {
	devices map[string]gpu.Device
}

// NewSim returns the Reader of a simulated system.
func NewSim(sys *gpu.System) Reader {
	r := simReader{devices: map[string]gpu.Device{}}
	for _, d := range sys.Devices {
		r.devices[d.UUID] = d
	}
	return r
}

// simModel holds a model's limits and fixed properties, so that a simulated
// GPU's readings stay within what the real part shows.
type simModel struct {
	match                  string // a word of the product name
	powerLimitW, idleW     uint32
	maxSMMHz, maxMemoryMHz uint32
	bar1MiB                uint64
	// CUDA cores, the PCIe link (generation, lanes) and the memory bus
	// width in bits, as NVML reports them on the real part; 0 for unknown.
	cores, pcieGen, pcieWidth, busBits int
}

var simModels = []simModel{
	{"H100", 700, 70, 1980, 2619, 131072, 16896, 5, 16, 5120},
	{"H200", 700, 75, 1980, 3201, 262144, 16896, 5, 16, 6016}, // 6016 bits: NVML and CUDA on a real H200
	{"A100", 400, 55, 1410, 1215, 65536, 6912, 4, 16, 5120},
	{"L40S", 350, 35, 2520, 9001, 65536, 18176, 4, 16, 384},
	{"", 300, 30, 1500, 1500, 256, 0, 0, 0, 0}, // any other GPU: its properties unknown
}

func simModelOf(name string) simModel {
	for _, m := range simModels {
		if strings.Contains(name, m.match) {
			return m
		}
	}
	return simModels[len(simModels)-1]
}

// simNames are the programs the simulated processes run.
var simNames = []string{"python3", "/usr/bin/tritonserver", "/opt/conda/bin/python", "./train", "ollama"}

// Read derives each value from a hash of the UUID and the value's name.
// A simulated GPU has zero to two processes; one without processes idles
// (no utilisation, idle power, a low SM clock), as a real one does. A MIG-enabled GPU has no
// utilisation and no volatile ECC counts, as NVML gives none for one.
func (r simReader) Read(uuid string) (Sample, error) {
	d, ok := r.devices[uuid]
	if !ok {
		return Unknown(), fmt.Errorf("simulated GPU %s: no such GPU", uuid)
	}
	pick := func(field string, n uint32) uint32 {
		h := fnv.New32a()
		h.Write([]byte(uuid + "/" + field))
		return h.Sum32() % n
	}
	m := simModelOf(d.Name)
	const mib = 1 << 20
	totalMiB := d.MemoryMiB
	reservedMiB := min(512, totalMiB/8)

	s := Unknown()
	s.MemoryTotalBytes = float64(totalMiB * mib)
	s.PowerLimitWatts = float64(m.powerLimitW)
	s.MaxSMClockMHz, s.MaxMemoryClockMHz = float64(m.maxSMMHz), float64(m.maxMemoryMHz)
	s.BAR1TotalBytes = float64(m.bar1MiB * mib)
	s.MemoryClockMHz = float64(m.maxMemoryMHz) // HBM and GDDR run at full clock

	n := int(pick("processes", 3))
	usedMiB := reservedMiB
	for i := range n {
		share := (totalMiB - reservedMiB) * uint64(10+pick("memory"+strconv.Itoa(i), 30)) / 100
		s.Processes = append(s.Processes, Process{
			PID:             1000 + pick("pid"+strconv.Itoa(i), 4_000_000),
			Name:            simNames[pick("name"+strconv.Itoa(i), uint32(len(simNames)))],
			UsedMemoryBytes: float64(share * mib),
		})
		usedMiB += share
	}
	s.MemoryUsedBytes = float64(usedMiB * mib)
	s.BAR1UsedBytes = float64((2 + uint64(n)*8) * mib)
	if major, _, _ := strings.Cut(d.ComputeCapability, "."); major != "" && major < "9" && len(major) == 1 {
		// An H100 counts no L1 or L2 errors of its own (NVML: not
		// supported); older GPUs do.
		s.ECCErrorsL1Cache, s.ECCErrorsL2Cache = 0, 0
	}
	s.ECCErrorsDeviceMemory = float64(pick("ecc", 8) / 7) // one GPU in eight has seen an error
	if n == 0 {
		s.UtilizationPercent, s.MemoryUtilizationPercent = 0, 0
		s.EncoderUtilizationPercent, s.DecoderUtilizationPercent = 0, 0
		s.SMClockMHz = float64(m.maxSMMHz / 5) // an idle H100: 390 of 1980 MHz
		s.PowerWatts = float64(m.idleW)
		s.PCIeRXBytesPerSecond, s.PCIeTXBytesPerSecond = float64(pick("rx", 200)*1000), float64(pick("tx", 200)*1000)
		s.TemperatureCelsius = float64(28 + pick("temperature", 8))
	} else {
		s.UtilizationPercent = float64(20 + pick("utilization", 81))
		s.MemoryUtilizationPercent = float64(5 + pick("memory utilization", 60))
		s.EncoderUtilizationPercent = float64(pick("encoder", 3) * 7) // 0, 7 or 14: few jobs encode video
		s.DecoderUtilizationPercent = float64(pick("decoder", 4) * 9)
		s.SMClockMHz = float64(m.maxSMMHz - pick("sm clock", m.maxSMMHz/4))
		s.PowerWatts = float64(m.idleW + pick("power", m.powerLimitW-m.idleW))
		s.PCIeRXBytesPerSecond = float64((100 + pick("rx", 20000)) * 1000 * 100)
		s.PCIeTXBytesPerSecond = float64((100 + pick("tx", 5000)) * 1000 * 100)
		s.TemperatureCelsius = float64(40 + pick("temperature", 40))
	}
	if d.MIGEnabled {
		// As on real GPUs: NVML has no utilisation for a MIG-enabled GPU, and
		// its volatile ECC counts only through the MIG devices.
		s.UtilizationPercent, s.MemoryUtilizationPercent = math.NaN(), math.NaN()
		s.EncoderUtilizationPercent, s.DecoderUtilizationPercent = math.NaN(), math.NaN()
		s.ECCErrorsL1Cache, s.ECCErrorsL2Cache, s.ECCErrorsDeviceMemory = math.NaN(), math.NaN(), math.NaN()
	}
	return s, nil
}
