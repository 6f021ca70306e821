package shim

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Invocation is what gantry-runtime needs to know of a runc command line.
// Everything else in it is passed to the low-level runtime untouched.
type Invocation struct {
	// Command is the runc subcommand ("create", "start", "delete", ...);
	// empty for a line with global flags only (runc --version).
	Command string
	// Bundle is the bundle directory of create and run: the --bundle/-b value,
	// made absolute against the working directory, or the working directory
	// itself (runc's default). Empty for other commands.
	Bundle string
	// ContainerID is the first argument after the subcommand's flags, if any.
	ContainerID string
	// Log and LogFormat are runc's global --log and --log-format: where the
	// engine reads the runtime's error messages from.
	Log, LogFormat string
	// Globals is the number of words before the subcommand (runc's global
	// flags).
	Globals int
	// For checkpoint and restore: ImagePath is --image-path, made absolute
	// (runc's default, ./checkpoint, when not given); LeaveRunning is
	// --leave-running or --pre-dump; Detach and PIDFile restore's --detach
	// and --pid-file.
	ImagePath    string
	LeaveRunning bool
	Detach       bool
	PIDFile      string
}

// Modifies reports whether the command creates a container, the only case
// where gantry-runtime edits the bundle: create, run, and restore (a
// container made from a checkpoint gets the GPUs its request names).
func (inv Invocation) Modifies() bool {
	return inv.Command == "create" || inv.Command == "run" || inv.Command == "restore"
}

// Checkpoints reports a checkpoint or restore (package ctrckpt).
func (inv Invocation) Checkpoints() bool {
	return inv.Command == "checkpoint" || inv.Command == "restore"
}

// runc's flags that take a value, global and of create/run. Boolean flags
// (--debug, --systemd-cgroup, --no-pivot, --detach, ...) need no list: an
// unknown flag is taken as boolean, which at worst makes us read a flag's
// value as the container ID, never as the bundle.
var (
	globalValueFlags = map[string]bool{"log": true, "log-format": true, "root": true, "criu": true, "rootless": true}
	createValueFlags = map[string]bool{
		"bundle": true, "b": true, "console-socket": true, "pidfd-socket": true,
		"pid-file": true, "preserve-fds": true,
	}
	// checkpoint's and restore's (runc 1.1 to 1.5).
	checkpointValueFlags = map[string]bool{
		"image-path": true, "work-path": true, "parent-path": true, "page-server": true,
		"status-fd": true, "manage-cgroups-mode": true, "empty-ns": true,
		"bundle": true, "b": true, "console-socket": true, "pid-file": true,
		"lsm-profile": true, "lsm-mount-context": true, "pidfd-socket": true,
	}
)

// ParseArgs reads runc's command line (without the program name) the way
// runc's own parser does: global flags, the subcommand, then its flags and
// arguments; flags are -x or --x, with the value as the next word or after
// "=". cwd resolves a relative bundle path.
func ParseArgs(args []string, cwd string) (Invocation, error) {
	var inv Invocation
	i := 0
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			break
		}
		name, val, hasVal := splitFlag(a)
		if !globalValueFlags[name] {
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return inv, fmt.Errorf("runc flag %s needs a value", a)
			}
			i++
			val = args[i]
		}
		switch name {
		case "log":
			inv.Log = val
		case "log-format":
			inv.LogFormat = val
		}
	}
	if i >= len(args) {
		return inv, nil
	}
	inv.Command = args[i]
	inv.Globals = i
	if !inv.Modifies() && !inv.Checkpoints() {
		return inv, nil
	}
	valueFlags := createValueFlags
	if inv.Checkpoints() {
		valueFlags = checkpointValueFlags
	}
	bundle, image := "", ""
	for i++; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			if i+1 < len(args) && inv.ContainerID == "" {
				inv.ContainerID = args[i+1]
			}
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			if inv.ContainerID == "" {
				inv.ContainerID = a
			}
			continue
		}
		name, val, hasVal := splitFlag(a)
		switch name {
		case "leave-running", "pre-dump":
			inv.LeaveRunning = inv.LeaveRunning || inv.Command == "checkpoint" && (val == "" || val == "true")
		case "detach", "d":
			inv.Detach = inv.Command == "restore" && (val == "" || val == "true")
		}
		if !valueFlags[name] {
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return inv, fmt.Errorf("runc %s flag %s needs a value", inv.Command, a)
			}
			i++
			val = args[i]
		}
		switch name {
		case "bundle", "b":
			bundle = val
		case "image-path":
			image = val
		case "pid-file":
			if inv.Checkpoints() {
				inv.PIDFile = val
			}
		}
	}
	if inv.Checkpoints() {
		if image == "" {
			image = "checkpoint"
		}
		inv.ImagePath = abs(image, cwd)
		if inv.PIDFile != "" {
			inv.PIDFile = abs(inv.PIDFile, cwd)
		}
	}
	if inv.Command == "checkpoint" {
		return inv, nil
	}
	if bundle == "" {
		bundle = cwd
	} else if !filepath.IsAbs(bundle) {
		bundle = filepath.Join(cwd, bundle)
	}
	inv.Bundle = filepath.Clean(bundle)
	return inv, nil
}

func abs(p, cwd string) string {
	if !filepath.IsAbs(p) {
		p = filepath.Join(cwd, p)
	}
	return filepath.Clean(p)
}

// splitFlag turns "--name=value", "-name" into its parts.
func splitFlag(a string) (name, val string, hasVal bool) {
	s := strings.TrimLeft(a, "-")
	name, val, hasVal = strings.Cut(s, "=")
	return name, val, hasVal
}
