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

// GPUInfo gathers /gpu/info's facts.
func (s *Server) GPUInfo() Info {
	var info Info
	sys := s.opts.System
	info.Version.Driver = sys.DriverVersion
	info.Version.CUDA = sys.CUDADriverVersion
	info.Devices = []DeviceInfo{}
	for _, d := range sys.Devices {
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
	t.flush()
}

// ---- /gpu/status

// Status is /gpu/status/json's body.
type Status struct {
	Devices []DeviceStatus
}

// DeviceStatus is one GPU's readings in the original's shape; null when unknown.
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
		ECCErrors  struct {
			L1Cache *uint64
			L2Cache *uint64
			Global  *uint64
		}
	}
	// Clocks are not read yet (the metrics Reader has no clocks): null.
	Clocks Clocks
	PCI    struct {
		BAR1Used   *uint64
		Throughput struct {
			RX *uint
			TX *uint
		}
	}
	// Processes are not read yet (the metrics Reader has no process list): null.
	Processes []Process
}

// Process is a process using a GPU.
type Process struct {
	PID        uint
	Name       string
	MemoryUsed uint64 // MiB
}

func uintOf(f float64) *uint {
	if math.IsNaN(f) || f < 0 {
		return nil
	}
	return ptr(uint(math.Round(f)))
}

// GPUStatus reads every GPU once.
func (s *Server) GPUStatus() (Status, error) {
	st := Status{Devices: []DeviceStatus{}}
	for _, d := range s.opts.System.Devices {
		sample := readings.Unknown()
		if s.opts.Reader != nil {
			var err error
			sample, err = s.opts.Reader.Read(d.UUID)
			if err != nil {
				return st, fmt.Errorf("reading GPU %d (%s): %w", d.Index, d.UUID, err)
			}
		}
		var ds DeviceStatus
		ds.Power = uintOf(sample.PowerWatts)
		ds.Temperature = uintOf(sample.TemperatureCelsius)
		ds.Utilization.GPU = uintOf(sample.UtilizationPercent)
		ds.Utilization.Memory = uintOf(sample.MemoryUtilizationPercent)
		if used := uintOf(sample.MemoryUsedBytes / (1 << 20)); used != nil {
			ds.Memory.GlobalUsed = ptr(uint64(*used))
		}
		st.Devices = append(st.Devices, ds)
	}
	return st, nil
}

func (s *Server) gpuStatusJSON(w http.ResponseWriter, r *http.Request) {
	st, err := s.GPUStatus()
	if err != nil {
		s.opts.Logger.Error("gpu status", "err", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, st)
}

func (s *Server) gpuStatus(w http.ResponseWriter, r *http.Request) {
	st, err := s.GPUStatus()
	if err != nil {
		s.opts.Logger.Error("gpu status", "err", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	info := s.GPUInfo()
	t := newText(w)
	for i, ds := range st.Devices {
		t.line("")
		t.line(fmt.Sprintf("Device #%d", i))
		power := "N/A"
		if ds.Power != nil {
			power = fmt.Sprintf("%d W", *ds.Power)
			if lim := info.Devices[i].Power; lim != nil {
				power = fmt.Sprintf("%d / %d W", *ds.Power, *lim)
			}
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
		if ds.Memory.GlobalUsed != nil && info.Devices[i].Memory.Global != nil {
			global = fmt.Sprintf("%d / %d MiB", *ds.Memory.GlobalUsed, *info.Devices[i].Memory.Global)
		}
		t.row("    Global:", global)
		t.line("    ECC Errors")
		t.row("      L1 Cache:", num(ds.Memory.ECCErrors.L1Cache, ""))
		t.row("      L2 Cache:", num(ds.Memory.ECCErrors.L2Cache, ""))
		t.row("      Global:", num(ds.Memory.ECCErrors.Global, ""))
		t.line("  PCI")
		t.row("    BAR1:", num(ds.PCI.BAR1Used, " MiB"))
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
				t.row("      Name:", p.Name)
				t.row("      Memory:", fmt.Sprintf("%d MiB", p.MemoryUsed))
			}
		}
	}
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

// text lays out "Label:  value" rows with the values of a block aligned, as
// the original's tabwriter output was.
type text struct {
	w    io.Writer
	rows [][2]string
}

func newText(w io.Writer) *text {
	if rw, ok := w.(http.ResponseWriter); ok {
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	return &text{w: w}
}

func (t *text) row(label, value string) { t.rows = append(t.rows, [2]string{label, value}) }

// line is a row without a value; it does not widen the label column.
func (t *text) line(s string) { t.rows = append(t.rows, [2]string{s, "\x00"}) }

func (t *text) flush() {
	width := 0
	for _, r := range t.rows {
		if r[1] != "\x00" && len([]rune(r[0])) > width {
			width = len([]rune(r[0]))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		if r[1] == "\x00" {
			b.WriteString(r[0] + "\n")
			continue
		}
		fmt.Fprintf(&b, "%-*s  %s\n", width, r[0], r[1])
	}
	io.WriteString(t.w, b.String())
}
