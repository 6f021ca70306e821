package inject

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/request"
)

// Front ends, as the log record names them.
const (
	FrontEndRuntime = "gantry-runtime"
	FrontEndHook    = "gantry-hook"
	FrontEndCLI     = "nvidia-container-cli"
)

// Record is what one front end did to one container: the one line it
// appends to runtime.log-file (Log). Prepare and FinishRootfs fill it in;
// the front end adds what only it knows (the container's id, the bundle).
type Record struct {
	FrontEnd  string
	Container string
	Bundle    string
	// Changed is false when the container asked for nothing (or had its
	// GPUs injected already): nothing was done to it.
	Changed bool
	// Source is where the request came from (env, annotations, mounts).
	Source request.Source
	// Devices are the selected devices' canonical names ("0", "1:0"), and
	// CDI the names injected from other vendors' CDI specs.
	Devices, CDI []string
	// Inventory and GPUs say whether the driver inventory and the GPU
	// list came from the cache ("cache") or were discovered ("discovery").
	Inventory, GPUs string
	// Layout is "tree" when the driver's files went in as one mount of the
	// driver tree (runtime.driver-layout), empty for a mount per file.
	Layout string
	// Notes are warnings and decisions worth a log line (ignored
	// capabilities, forward compatibility in use).
	Notes []string
	// Phases is where the time went, in milliseconds.
	Phases map[string]float64
	// StartupMS is the time before the front end's Go code ran (the
	// runtime's C constructor to Modify), when known.
	StartupMS float64
	// Server is set when gantry-runtime's create server did the work
	// (package createserver) instead of a Go start of gantry-runtime.
	Server bool
	// Edits is what was injected, named item by item at log-level debug.
	Edits *edits.Edits

	start, clock time.Time
}

// NewRecord starts the record (and its clock) of one container.
func NewRecord(frontEnd, container, bundle string) *Record {
	now := time.Now()
	return &Record{FrontEnd: frontEnd, Container: container, Bundle: bundle, start: now, clock: now}
}

// Phase records the time since the last phase (or NewRecord) under name.
func (r *Record) Phase(name string) {
	now := time.Now()
	if r.Phases == nil {
		r.Phases = map[string]float64{}
	}
	r.Phases[name] += float64(now.Sub(r.clock).Microseconds()) / 1000
	r.clock = now
}

// Log appends the record, with err if the container was refused, as one
// JSON line to cfg's runtime.log-file (if set): the engines hide a runtime's
// and a hook's stderr. The same keys for every front end; front-end says
// which one wrote it.
func (r *Record) Log(cfg config.Config, err error) {
	if r == nil || cfg.Runtime.LogFile == "" {
		return
	}
	rec := map[string]any{
		"time": time.Now().Format(time.RFC3339Nano), "front-end": r.FrontEnd, "container": r.Container,
		"took_ms": float64(time.Since(r.start).Microseconds()) / 1000,
	}
	if r.Bundle != "" {
		rec["bundle"] = r.Bundle
	}
	if r.Server {
		rec["server"] = true
	}
	if r.StartupMS > 0 {
		// From the first C constructor to Modify: Go runtime start, inits,
		// reading the configuration.
		rec["startup_ms"] = r.StartupMS
	}
	if err != nil {
		rec["error"] = err.Error()
	} else {
		rec["changed"] = r.Changed
		if r.Changed {
			rec["source"], rec["devices"], rec["inventory"], rec["gpus"] = r.Source, r.Devices, r.Inventory, r.GPUs
			if r.Layout != "" {
				rec["layout"] = r.Layout
			}
		}
		if len(r.CDI) > 0 {
			rec["cdi"] = r.CDI
		}
	}
	if len(r.Notes) > 0 {
		rec["notes"] = r.Notes
	}
	if len(r.Phases) > 0 {
		rec["phases_ms"] = r.Phases
	}
	if err == nil && cfg.LogLevel == "debug" && r.Edits != nil {
		rec["injected"] = injectedDetail(r.Edits)
	}
	b, _ := json.Marshal(rec)
	AppendLine(cfg.Runtime.LogFile, b)
}

// AppendLine appends line and a newline to the file p, creating it (mode
// 0600) if needed; failures are ignored (a log must not fail a container).
func AppendLine(p string, line []byte) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	// One write(2) per line: O_APPEND keeps concurrent writers' lines whole.
	_, _ = f.Write(append(line, '\n'))
	_ = f.Close()
}

// injectedDetail names every device node, mount, link and library folder
// injected (log-level debug), host side and container side, so a missing
// library or node can be told from one that was never looked for.
func injectedDetail(e *edits.Edits) map[string]any {
	var nodes, mounts, links []string
	for _, n := range e.DeviceNodes {
		nodes = append(nodes, fmt.Sprintf("%s (%s %d:%d)", n.Path, n.HostPath, n.Major, n.Minor))
	}
	for _, m := range e.Mounts {
		mounts = append(mounts, m.HostPath+" -> "+m.ContainerPath)
	}
	for _, l := range e.Symlinks {
		links = append(links, l.Link+" -> "+l.Target)
	}
	return map[string]any{"device_nodes": nodes, "mounts": mounts, "symlinks": links, "library_dirs": e.LibraryDirs, "env": e.Env}
}
