package legacyapi

import (
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
	"unicode/utf8"

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

// Options say what the server reports.
type Options struct {
	System *gpu.System
	Driver *driver.Inventory
	// Reader gives /gpu/status its readings; nil reports every reading unknown.
	Reader Reader
	// DevRoot is the directory holding dev/nvidia* (the driver root by default);
	// it decides whether /dev/nvidia-uvm-tools is offered.
	DevRoot string
	Logger  *slog.Logger
}

// Server answers the REST API.
type Server struct {
	opts Options
	mux  *http.ServeMux
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
	// VolumeDriver was "nvidia-docker" in the original; empty here, as the
	// volumes are host binds that need no driver.
	VolumeDriver string
	// Volumes are --volume values, "hostpath:containerpath:ro".
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
	a.Volumes = DriverBinds(s.opts.Driver)
	return a, nil
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
	UUID        string
	Path        string
	Model       *string
	Power       *uint // power limit, W
	CPUAffinity *uint // NUMA node
	PCI         struct {
		BusID     string
		BAR1      *uint64 // MiB
		Bandwidth *uint   // MB/s
	}
	Clocks   Clocks
	Topology []P2PLink
	Family   *string // architecture, "Hopper"
	Arch     *string // compute capability, "9.0"
	Cores    *uint
	Memory   struct {
		ECC       *bool
		Global    *uint // MiB
		Shared    *uint // KiB
		Constant  *uint // KiB
		L2Cache   *uint // KiB
		Bandwidth *uint // MB/s
	}
}

// Clocks are in MHz.
type Clocks struct {
	Cores  *uint
	Memory *uint
}

// P2PLink is a peer GPU and the kind of path to it (the original's numbering).
type P2PLink struct {
	BusID string
	Link  uint
}

func ptr[T any](v T) *T { return &v }

// GPUInfo gathers /gpu/info's facts. The power limit, BAR1 size and
// maximum clocks come from the Reader; a GPU it cannot read has them null.
func (s *Server) GPUInfo() Info {
	return s.info(s.readAll())
}

func (s *Server) info(samples []readings.Sample) Info {
	var info Info
	sys := s.opts.System
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
		if d.NUMANode >= 0 {
			di.CPUAffinity = ptr(uint(d.NUMANode))
		}
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
		sample := samples[i]
		di.Power = uintOf(sample.PowerLimitWatts)
		di.PCI.BAR1 = uint64Of(sample.BAR1TotalBytes / mib)
		di.Clocks.Cores = uintOf(sample.MaxSMClockMHz)
		di.Clocks.Memory = uintOf(sample.MaxMemoryClockMHz)
		info.Devices = append(info.Devices, di)
	}
	return info
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
				t.line(fmt.Sprintf("    %s - %d", l.BusID, l.Link))
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

// uintOf cuts a reading down to a whole number, as the original's integer
// divisions did; nil when unknown.
func uintOf(f float64) *uint {
	if math.IsNaN(f) || f < 0 {
		return nil
	}
	return ptr(uint(math.Floor(f)))
}

func uint64Of(f float64) *uint64 {
	if math.IsNaN(f) || f < 0 {
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
		power := "N/A"
		if ds.Power != nil && di.Power != nil {
			power = fmt.Sprintf("%d / %d W", *ds.Power, *di.Power)
		}
		t.row("  Power:", power)
		t.row("  Temperature:", num(ds.Temperature, " °C"))
		t.line("  Utilization")
		t.row("    GPU:", num(ds.Utilization.GPU, " %"))
		t.row("    Memory:", num(ds.Utilization.Memory, " %"))
		t.row("    Encoder:", num(ds.Utilization.Encoder, " %"))
		t.row("    Decoder:", num(ds.Utilization.Decoder, " %"))
		t.line("  Memory")
		global := "N/A"
		if ds.Memory.GlobalUsed != nil && di.Memory.Global != nil {
			global = fmt.Sprintf("%d / %d MiB", *ds.Memory.GlobalUsed, *di.Memory.Global)
		}
		t.row("    Global:", global)
		t.line("    ECC Errors")
		t.row("      L1 Cache:", num(ds.Memory.ECCErrors.L1Cache, ""))
		t.row("      L2 Cache:", num(ds.Memory.ECCErrors.L2Cache, ""))
		t.row("      Global:", num(ds.Memory.ECCErrors.Global, ""))
		t.line("  PCI")
		bar1 := "N/A"
		if ds.PCI.BAR1Used != nil && di.PCI.BAR1 != nil {
			bar1 = fmt.Sprintf("%d / %d MiB", *ds.PCI.BAR1Used, *di.PCI.BAR1)
		}
		t.row("    BAR1:", bar1)
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

func (t *text) row(label, value string) { t.rows = append(t.rows, textRow{label: label, value: value}) }

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
