package legacyapi

import (
	"io"
	"log/slog"
	"net/http"
	"sync"

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
