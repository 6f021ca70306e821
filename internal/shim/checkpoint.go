package shim

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/ctrckpt"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/inject"
	"github.com/gantry-gpu/gantry/internal/ocibundle"
)

// lockTimeoutMS bounds the CUDA lock's wait for a process's running GPU
// work (a long kernel) before the checkpoint gives up and the container
// goes on.
const lockTimeoutMS = 30000

// checkpoint handles runc's checkpoint and restore (package ctrckpt) for a
// GPU container, and reports whether it did: false means the command is
// the low-level runtime's alone (a container without GPUs, a checkpoint
// made without any CUDA process), and the caller executes it.
func checkpoint(inv Invocation, args []string, cfg config.Config, lowLevel string, stderr io.Writer) (code int, handled bool) {
	rt := ctrckpt.Runtime{Path: lowLevel, Global: args[:inv.Globals]}
	var restoreSpec []byte
	if inv.Command == "checkpoint" {
		st, err := rt.State(inv.ContainerID)
		if err != nil {
			return 0, false // the low-level runtime says why
		}
		raw, err := ocibundle.ReadSpec(st.Bundle)
		if err != nil {
			return 0, false
		}
		if gpu, _, err := ctrckpt.SpecGPUs(raw); err != nil || !gpu {
			return 0, false
		}
	} else {
		rec, found, err := ctrckpt.ReadRecord(inv.ImagePath)
		if err == nil {
			restoreSpec, err = ocibundle.ReadSpec(inv.Bundle)
		}
		if err != nil {
			report(stderr, inv, err)
			return 1, true
		}
		// A restore without CUDA state is the low-level runtime's alone,
		// unless its config.json carries GPUs Gantry injected (the request
		// is checked against them).
		if gpu, _, _ := ctrckpt.SpecGPUs(restoreSpec); (!found || rec.CUDAProcesses == 0) && !injected(restoreSpec) && !gpu {
			return 0, false
		}
	}
	o := ctrckpt.Options{
		Runtime: rt, Args: args, ID: inv.ContainerID, ImagePath: inv.ImagePath,
		LeaveRunning: inv.LeaveRunning, Detach: inv.Detach, PIDFile: inv.PIDFile,
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: stderr,
		Log: func(msg string) { logCheckpoint(cfg, inv, msg) },
		LogTimings: func(t ctrckpt.Timings) {
			logLine(cfg, map[string]any{"time": time.Now().Format(time.RFC3339Nano), "front-end": inject.FrontEndRuntime,
				"container": inv.ContainerID, "command": inv.Command, "timings": t})
			logEngine(inv, "gantry-runtime "+inv.Command+" timings: "+t.String(), t)
		},
	}
	if err := setupHost(&o, cfg); err != nil {
		report(stderr, inv, err)
		return 1, true
	}
	var err error
	if inv.Command == "checkpoint" {
		code, err = ctrckpt.Checkpoint(o)
	} else {
		code, err = ctrckpt.Restore(o, restoreSpec)
	}
	if err != nil {
		logCheckpoint(cfg, inv, "error: "+err.Error())
		report(stderr, inv, err)
		if code == 0 {
			code = 1
		}
	}
	return code, true
}

// setupHost finds the gantry binary (the CUDA calls), the driver's
// libcuda and the host's GPUs for o.
func setupHost(o *ctrckpt.Options, cfg config.Config) error {
	self, err := os.Executable()
	if err != nil {
		self = "/proc/self/exe"
	}
	gantry, err := discover.HelperPath(cfg, self)
	if err != nil {
		return fmt.Errorf("checkpointing a GPU container needs the gantry binary: %w", err)
	}
	sys, inv, err := inject.LoadHost(cfg)
	if err != nil {
		return fmt.Errorf("the driver and GPUs: %w", err)
	}
	lib := ""
	for _, l := range inv.Libraries {
		if l.SONAME == "libcuda.so.1" && l.Capability != driver.Compat32 {
			lib = l.HostPath
			break
		}
	}
	if lib == "" {
		return fmt.Errorf("no libcuda.so.1 among the driver's libraries under %s", orRoot(cfg.DriverRoot))
	}
	o.Helper = ctrckpt.Helper{Gantry: gantry, Lib: lib, LockTimeoutMS: lockTimeoutMS}
	o.DriverVersion = inv.Version
	o.CacheDir = cfg.Runtime.CacheDir
	o.RequestGPUs = func(raw []byte) ([]ctrckpt.GPU, error) {
		var peek inject.SpecFields
		if err := json.Unmarshal(raw, &peek); err != nil {
			return nil, err
		}
		ds, err := inject.RequestedGPUs(peek.Spec(), cfg, sys)
		if err != nil {
			return nil, err
		}
		var out []ctrckpt.GPU
		for _, d := range ds {
			out = append(out, ctrckpt.GPU{Minor: d.Minor, UUID: d.UUID, Name: d.Name})
		}
		return out, nil
	}
	o.GPUs = func(minors []int) ([]ctrckpt.GPU, error) {
		var out []ctrckpt.GPU
		for _, m := range minors {
			found := false
			for _, d := range sys.Devices {
				if d.Minor == m {
					out = append(out, ctrckpt.GPU{Minor: m, UUID: d.UUID, Name: d.Name})
					found = true
					break
				}
			}
			if !found {
				return nil, fmt.Errorf("/dev/nvidia%d is no GPU of this host", m)
			}
		}
		return out, nil
	}
	return nil
}

func orRoot(r string) string {
	if r == "" {
		return "/"
	}
	return r
}

// logCheckpoint appends one JSON line to runtime.log-file.
func logCheckpoint(cfg config.Config, inv Invocation, msg string) {
	if cfg.Runtime.LogFile == "" {
		return
	}
	logLine(cfg, map[string]any{
		"time": time.Now().Format(time.RFC3339Nano), "front-end": inject.FrontEndRuntime,
		"container": inv.ContainerID, "command": inv.Command, "msg": msg,
	})
}

// logLine appends fields as one JSON line to runtime.log-file.
func logLine(cfg config.Config, fields map[string]any) {
	if cfg.Runtime.LogFile == "" {
		return
	}
	line, _ := json.Marshal(fields)
	inject.AppendLine(cfg.Runtime.LogFile, line)
}

// logEngine appends an info line to the engine's runtime log (runc's
// global --log, which containerd's shim reads): JSON with the timings under
// "timings" when --log-format json, else runc's text format.
func logEngine(inv Invocation, msg string, t ctrckpt.Timings) {
	if inv.Log == "" {
		return
	}
	now := time.Now().Format(time.RFC3339Nano)
	var line []byte
	if inv.LogFormat == "json" {
		line, _ = json.Marshal(map[string]any{"level": "info", "msg": msg, "time": now, "timings": t})
	} else {
		line = []byte(fmt.Sprintf("time=%q level=info msg=%q", now, msg))
	}
	inject.AppendLine(inv.Log, line)
}

// injected reports whether config.json carries Gantry's injection mark.
func injected(raw []byte) bool {
	var peek struct {
		Annotations map[string]string `json:"annotations"`
	}
	if json.Unmarshal(raw, &peek) != nil {
		return false
	}
	_, ok := peek.Annotations[edits.InjectedAnnotation]
	return ok
}
