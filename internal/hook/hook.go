// Package hook is gantry-hook, the OCI prestart hook front end, also installed
// as nvidia-container-runtime-hook so that Docker's --gpus flag (and Compose's
// GPU reservations) work with the engine's own runc and no runtime registered.
//
// Docker adds a prestart hook running `nvidia-container-runtime-hook prestart`
// (looked up in PATH) to every container started with --gpus, and puts
// NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES in the container's
// env. runc runs the hook after it has created the container's namespaces,
// mounted its root filesystem and set up its cgroup, but before the container
// process starts, with the OCI state (id, pid, bundle) on stdin.
//
// Main then does what gantry-runtime does to config.json, from outside: it
// reads the request from the bundle's config.json (package request), finds the
// GPUs and driver files (package discover), computes the edits (package
// edits, which also checks NVIDIA_REQUIRE_*), makes the device nodes and bind
// mounts appear in the container's mount namespace and opens its device
// cgroup for the nodes (package nsmount), and finally creates the SONAME
// links and the ld.so.cache entries in the root filesystem as the container
// will see it (package containerhook, through /proc/PID/root, where the new
// mounts are visible). Nothing from the image is executed, and the image's
// env (LD_PRELOAD, LD_LIBRARY_PATH) never reaches this process: runc gives a
// hook only the env written in its hook entry.
package hook

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/containerhook"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/nsmount"
	"github.com/gantry-gpu/gantry/internal/ocibundle"
	"github.com/gantry-gpu/gantry/internal/request"
	"github.com/gantry-gpu/gantry/internal/rootfs"
	"github.com/gantry-gpu/gantry/internal/version"
)

const help = `Usage: gantry-hook [--config FILE] [--no-cgroups] PHASE < STATE
       (also installed as nvidia-container-runtime-hook)

An OCI hook that gives a container the GPUs it asks for. Container runtimes
run it, not people: runc runs it with the container's OCI state on stdin.

Docker's --gpus flag adds this hook to the container by the name
nvidia-container-runtime-hook, found in PATH, with PHASE "prestart", and sets
NVIDIA_VISIBLE_DEVICES (and NVIDIA_DRIVER_CAPABILITIES) in the container. So:

  ln -s gantry-runtime /usr/bin/nvidia-container-runtime-hook
  docker run --gpus '"device=1"' debian nvidia-smi -L

needs no runtime registered in daemon.json. For Podman or CRI-O, an OCI hooks.d
entry (/usr/share/containers/oci/hooks.d/gantry.json) does the same:

  {"version": "1.0.0",
   "hook": {"path": "/usr/bin/gantry-hook", "args": ["gantry-hook", "prestart"]},
   "when": {"always": true}, "stages": ["prestart"]}

PHASE prestart (or createRuntime): reads the request from the bundle's
config.json (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES,
NVIDIA_REQUIRE_*, the volume-mount device list when enabled), and for a
container that asks for GPUs creates their device nodes, bind-mounts the
driver's libraries, programs and firmware read-only, allows the nodes in the
device cgroup (v1 devices.allow, or v2's BPF device program), and adds the
libraries to the container's ld.so.cache. A container that asks for nothing is
not touched. Any error (an unknown device, an unmet NVIDIA_REQUIRE_CUDA) is one
line on stderr and exit code 1, and the runtime does not start the container.
Every other PHASE (poststart, poststop, ...) does nothing and exits 0.

Configuration: /etc/gantry/config.toml, or the file in $GANTRY_CONFIG or
--config (gpus, driver-root, dev-root, runtime.*; see gantry config default).
runtime.log-file, when set, gets one line per container handled.

Flags:
  --config FILE   configuration file (default $GANTRY_CONFIG or /etc/gantry/config.toml)
  --no-cgroups    do not change the device cgroup (access is granted another way;
                  runtime.no-cgroups = true in the configuration does the same)
  --version       print the version
  --help          this text
`

// Main runs the hook with args (without the program name) and the OCI state
// on stdin, and returns the exit code.
func Main(args []string, stdin io.Reader, stderr io.Writer) int {
	fs := flag.NewFlagSet("gantry-hook", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfgPath := fs.String("config", "", "")
	noCgroups := fs.Bool("no-cgroups", false, "")
	showVersion := fs.Bool("version", false, "")
	// NVIDIA's hook takes -debug FILE; accepted and ignored so that
	// existing hook entries keep working.
	fs.String("debug", "", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, help)
			return 0
		}
		fmt.Fprintf(stderr, "gantry-hook: %v (see gantry-hook --help)\n", err)
		return 2
	}
	if *showVersion {
		fmt.Fprintf(stderr, "gantry-hook %s\n", version.Version)
		return 0
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "gantry-hook: no PHASE given: container runtimes run this hook as `gantry-hook prestart` with the container state on stdin (see gantry-hook --help)")
		return 2
	}
	switch fs.Arg(0) {
	case "prestart", "createRuntime":
	case "help":
		fmt.Fprint(stderr, help)
		return 0
	default:
		// poststart, poststop, ...: nothing to undo, the namespace and
		// cgroup go away with the container.
		return 0
	}
	r, err := prestart(stdin, *cfgPath, *noCgroups)
	logResult(r, err)
	if err != nil {
		fmt.Fprintf(stderr, "gantry-hook: %s\n", oneLine(err.Error()))
		return 1
	}
	return 0
}

// result says what prestart did, for the log file.
type result struct {
	cfg     config.Config
	id      string
	devices string
	skipped bool
}

func prestart(stdin io.Reader, cfgPath string, noCgroups bool) (*result, error) {
	raw, err := ocibundle.ReadAtMost(stdin, ocibundle.MaxStateSize, "the container state on stdin")
	if err != nil {
		return nil, err
	}
	var st ocispecs.State
	if err := json.Unmarshal(raw, &st); err != nil || st.Bundle == "" {
		return nil, containerhook.ErrNoState
	}
	if st.Pid <= 0 {
		return nil, fmt.Errorf("container %s: the state on stdin has no pid (run this hook as prestart or createRuntime, when the container process exists)", st.ID)
	}
	bundle, root, err := containerhook.ReadState(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	specPath := ocibundle.SpecPath(bundle)
	b, err := ocibundle.ReadSpec(bundle)
	if err != nil {
		return nil, err
	}
	var spec ocispecs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("%s: not an OCI runtime spec: %w", specPath, err)
	}
	cfg, _, err := config.Load(cfgPath)
	if err != nil {
		return nil, err
	}
	res := &result{cfg: cfg, id: st.ID}
	if _, done := spec.Annotations[edits.InjectedAnnotation]; done {
		// gantry-runtime injected the GPUs into the spec already.
		res.skipped = true
		return res, nil
	}

	req, err := request.Parse(request.InputFromSpec(&spec), discover.RequestOptions(cfg))
	if err != nil {
		return res, err
	}
	// CDI names are the engine's to inject (it resolved them before runc
	// ran); this hook serves the env and mount requests only.
	if req.Devices.Mode == request.Void {
		res.skipped = true
		return res, nil
	}

	sys, err := discover.GPUs(cfg, true)
	if err != nil {
		return res, err
	}
	inv, err := discover.Driver(cfg)
	if err != nil {
		return res, err
	}
	if len(inv.Missing) > 0 {
		return res, fmt.Errorf("the driver under %s is incomplete (missing %s): fix the installation or set driver-root in the Gantry configuration (%s, or the file in $%s)", inv.Root, strings.Join(inv.Missing, ", "), config.DefaultPath, config.EnvPath)
	}
	sel, err := edits.Resolve(sys, req.Devices)
	if err != nil {
		return res, err
	}
	var names []string
	for _, s := range sel {
		names = append(names, s.Name())
	}
	res.devices = strings.Join(names, ",")
	if res.devices == "" {
		res.devices = req.Devices.Mode.String()
	}
	e, err := edits.Build(sys, inv, req, edits.Options{DevRoot: cfg.EffectiveDevRoot()})
	if err != nil {
		return res, err
	}
	if e.Empty() {
		return res, nil
	}

	proc, err := verifyContainer(st.Pid, st.ID, root)
	if err != nil {
		return res, err
	}
	defer proc.close()
	if err := nsmount.Apply(st.Pid, root, e, nsmount.Options{NoCgroups: noCgroups || cfg.Runtime.NoCgroups}); err != nil {
		return res, err
	}
	if err := finishRootfs(st.Pid, root, e, inv); err != nil {
		return res, err
	}
	// The pid named the verified process throughout only if it is still
	// alive now; otherwise fail the container (runc then removes it).
	return res, proc.alive()
}

// finishRootfs makes the SONAME links and the ld.so.cache entries (with
// CUDA forward compatibility, as gantry-runtime does), in the root filesystem
// as the container's mount namespace shows it, reached through /proc/PID/root.
// A warning (an unreadable cache in the image, replaced) does not fail the
// container.
func finishRootfs(pid int, root string, e *edits.Edits, inv *driver.Inventory) error {
	if len(e.Symlinks) == 0 && len(e.LibraryDirs) == 0 {
		return nil
	}
	r, err := rootfs.Open("/proc/" + strconv.Itoa(pid) + "/root" + filepath.Clean(root))
	if err != nil {
		return fmt.Errorf("opening the container's root filesystem: %w", err)
	}
	defer r.Close()
	return containerhook.ApplyEdits(r, e, inv, true, nil)
}

// logResult appends one line to runtime.log-file, if configured: the engines
// swallow a hook's stderr when it succeeds.
func logResult(r *result, err error) {
	if r == nil || r.cfg.Runtime.LogFile == "" {
		return
	}
	var what string
	switch {
	case err != nil:
		what = "error: " + oneLine(err.Error())
	case r.skipped:
		what = "no GPU requested"
	default:
		what = "devices " + r.devices
	}
	// The same JSON lines as gantry-runtime's, in the same file.
	rec := map[string]any{"time": time.Now().Format(time.RFC3339Nano), "front-end": "gantry-hook", "container": r.id, "result": what}
	line, _ := json.Marshal(rec)
	f, ferr := os.OpenFile(r.cfg.Runtime.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if ferr != nil {
		return
	}
	_, _ = f.Write(append(line, '\n'))
	f.Close()
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
