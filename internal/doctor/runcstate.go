package doctor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/procfs"
)

// DefaultRuncRoot is where runc keeps its containers' state when it is run
// by hand or by a tool that gives no --root.
const DefaultRuncRoot = "/run/runc"

// runcState is a container runc was asked to create directly (no
// engine), read from its state directory: state.json names the bundle, whose
// config.json gantry-runtime edited in place before runc ran it.
type runcState struct {
	Root, ID, Bundle string
	Pid              int
	Start            uint64
	Spec             *specs.Spec
}

// findRuncState reads ROOT/ID/state.json and the bundle's config.json.
func findRuncState(root, id string) (*runcState, error) {
	if id == "" || strings.ContainsAny(id, "/\x00") || id == "." || id == ".." {
		return nil, fmt.Errorf("no runc container %q in %s", id, root)
	}
	b, err := os.ReadFile(filepath.Join(root, id, "state.json"))
	if err != nil {
		return nil, fmt.Errorf("no runc container %q in %s (--runc-root names another runc state directory)", id, root)
	}
	var st struct {
		ID  string `json:"id"`
		Pid int    `json:"init_process_pid"`
		// Start is the init process's start time (/proc/PID/stat field
		// 22), which tells it from a later process given the same PID.
		Start  uint64 `json:"init_process_start"`
		Config struct {
			Labels []string `json:"labels"`
		} `json:"config"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("runc container %s: %s is not runc's state: %v", id, filepath.Join(root, id, "state.json"), err)
	}
	c := &runcState{Root: root, ID: id, Pid: st.Pid, Start: st.Start}
	for _, l := range st.Config.Labels {
		if v, ok := strings.CutPrefix(l, "bundle="); ok {
			c.Bundle = v
		}
	}
	if c.Bundle == "" {
		return nil, fmt.Errorf("runc container %s: its state names no bundle", id)
	}
	spec, err := os.ReadFile(filepath.Join(c.Bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("runc container %s: %v", id, err)
	}
	if err := json.Unmarshal(spec, &c.Spec); err != nil || c.Spec == nil {
		return nil, fmt.Errorf("runc container %s: %s is not an OCI spec: %v", id, filepath.Join(c.Bundle, "config.json"), err)
	}
	return c, nil
}

// checkRuncState examines a container runc runs without an engine.
func checkRuncState(opts Options, c *runcState) []Check {
	who := fmt.Sprintf("runc container %s (root %s)", c.ID, c.Root)
	running := c.Pid > 0 && startTime(opts.Proc, c.Pid) == c.Start
	if c.Start == 0 && c.Pid > 0 {
		// A state without the start time: the process existing must do.
		_, err := os.Stat(filepath.Join(opts.Proc, fmt.Sprint(c.Pid)))
		running = err == nil
	}
	fx := containerFixes{restart: fix(fixRestartRunc, "DIR", c.Root, "ID", c.ID), recur: fix(fixRecurSpec)}
	return checkSpecAndAccess(opts, who, c.Spec, nil, " (bundle "+c.Bundle+")", "runc", c.Pid, running, fx)
}

// startTime is the start time of process pid, 0 when it cannot be read.
func startTime(proc string, pid int) uint64 {
	t, _ := procfs.StartTime(proc, pid)
	return t
}
