package legacyapi

import (
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/gantry-gpu/gantry/internal/gpu/readings"
)

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
