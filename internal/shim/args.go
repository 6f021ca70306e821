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
}

// Modifies reports whether the command creates a container, the only case
// where gantry-runtime edits the bundle.
func (inv Invocation) Modifies() bool { return inv.Command == "create" || inv.Command == "run" }

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
	if !inv.Modifies() {
		return inv, nil
	}
	bundle := ""
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
		if !createValueFlags[name] {
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return inv, fmt.Errorf("runc %s flag %s needs a value", inv.Command, a)
			}
			i++
			val = args[i]
		}
		if name == "bundle" || name == "b" {
			bundle = val
		}
	}
	if bundle == "" {
		bundle = cwd
	} else if !filepath.IsAbs(bundle) {
		bundle = filepath.Join(cwd, bundle)
	}
	inv.Bundle = filepath.Clean(bundle)
	return inv, nil
}

// splitFlag turns "--name=value", "-name" into its parts.
func splitFlag(a string) (name, val string, hasVal bool) {
	s := strings.TrimLeft(a, "-")
	name, val, hasVal = strings.Cut(s, "=")
	return name, val, hasVal
}
