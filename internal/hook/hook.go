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
// reads the request from the bundle's config.json and makes the plan through
// the runtime's own pipeline (package inject: the GPUs and the driver
// inventory, cached in runtime.cache-dir, and the edits, which check
// NVIDIA_REQUIRE_* first), makes the device nodes and bind mounts appear in
// the container's mount namespace and opens its device cgroup for the nodes
// (package nsmount), and finally has the pipeline create the SONAME links and
// the ld.so.cache entries in the root filesystem as the container will see
// it (through /proc/PID/root, where the new mounts are visible), and write
// the runtime's log record. Nothing from the image is executed, and the image's
// env (LD_PRELOAD, LD_LIBRARY_PATH) never reaches this process: runc gives a
// hook only the env written in its hook entry.
package hook

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/containerhook"
	"github.com/gantry-gpu/gantry/internal/inject"
	"github.com/gantry-gpu/gantry/internal/nsmount"
	"github.com/gantry-gpu/gantry/internal/ocibundle"
	"github.com/gantry-gpu/gantry/internal/procfs"
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

With gantry-runtime's create server running (gantry-runtime --create-server,
socket $GANTRY_RUNTIME_SOCKET or /run/gantry/runtime.sock), a plain
"prestart" line is done by the server, the same work without starting Go;
anything it cannot serve runs here as without it.

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

// Names are the program names the hook answers to: Gantry's, the one
// Docker's --gpus runs, and the one NVIDIA's hooks.d file names. The
// binaries dispatch on them; package fastpath's constructor knows them too
// (it starts the hook on one CPU).
var Names = []string{"gantry-hook", "nvidia-container-runtime-hook", "nvidia-container-toolkit"}

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
	raw, err := ocibundle.ReadAtMost(stdin, ocibundle.MaxStateSize, "the container state on stdin")
	var st ocispecs.State
	if err == nil {
		// A state that is none is said before the configuration is read,
		// and leaves no log line.
		st, err = containerhook.ParseState(raw)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gantry-hook: %s\n", oneLine(err.Error()))
		return 1
	}
	cfg, _, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "gantry-hook: %s\n", oneLine(err.Error()))
		return 1
	}
	rec := inject.NewRecord(inject.FrontEndHook, "", "")
	err = Prestart(st, cfg, Caller{PID: os.Getpid()}, *noCgroups || cfg.Runtime.NoCgroups, rec)
	// runtime.log-file gets the line the runtime writes, with the same
	// keys: the engines swallow a hook's stderr when it succeeds.
	rec.Log(cfg, err)
	if err != nil {
		fmt.Fprintf(stderr, "gantry-hook: %s\n", oneLine(err.Error()))
		return 1
	}
	return 0
}

// Caller is the hook's process: this one, or the create server's caller
// (shim's server runs Prestart for gantry-hook's C constructor).
type Caller struct {
	PID int
	// Alive, when set, reports an error once PID no longer names the
	// caller (it exited; the pid may be reused): checked after the
	// container was verified against the caller's parent, before anything
	// changes.
	Alive func() error
}

// Prestart gives the container the state st names (the OCI state on the
// hook's stdin, as containerhook.ParseState read and checked it) what its
// config.json asks for, under cfg, and adds what it did to rec. The
// container's init must be a child of the hook's parent (the runtime), see
// verifyContainer.
func Prestart(st ocispecs.State, cfg config.Config, hook Caller, noCgroups bool, rec *inject.Record) error {
	rec.Container = st.ID
	if st.Pid <= 0 {
		return fmt.Errorf("container %s: the state on stdin has no pid (run this hook as prestart or createRuntime, when the container process exists)", st.ID)
	}
	rec.Bundle = st.Bundle
	// One prestart of a container at a time: the create server's and the
	// in-process one after the constructor gave up waiting for it. The
	// second one finds the first one's mark and leaves the container as
	// it is.
	dir, unlock, err := ocibundle.Lock(st.Bundle, ocibundle.LockWait)
	if err != nil {
		return fmt.Errorf("container %s: %w", st.ID, err)
	}
	defer unlock()
	mark := doneMark(st.Pid)
	if mark != "" && marked(dir, mark) {
		rec.Notes = append(rec.Notes, "the container was given its GPUs already (by the create server, after this hook stopped waiting for it): left as is")
		return nil
	}
	// The bundle's config.json, read once, and only the fields a request
	// and the root filesystem's path need.
	cb, err := ocibundle.ReadSpec(st.Bundle)
	if err != nil {
		return err
	}
	var spec inject.SpecFields
	if err := json.Unmarshal(cb, &spec); err != nil {
		return fmt.Errorf("parsing the bundle's %s: %w", ocibundle.SpecPath(st.Bundle), err)
	}
	root, err := containerhook.RootPath(st.Bundle, spec.RootPath())
	if err != nil {
		return err
	}
	if v, done := inject.Already(spec.Annotations); done {
		// gantry-runtime injected the GPUs into the spec already.
		rec.Notes = append(rec.Notes, inject.AlreadyNote(v))
		return nil
	}
	full := spec.Spec()
	req, err := inject.ReadRequest(full, cfg, rec)
	if err != nil {
		return err
	}
	rec.Phase("request")
	// CDI names are the engine's to inject (it resolved them before runc
	// ran); this hook serves the env and mount requests only.
	if req.Devices.Mode == request.Void {
		return nil
	}
	plan, err := inject.Prepare(cfg, req, inject.Options{ForwardCompat: true, SpecMounts: inject.MountPaths(full)}, rec)
	if err != nil {
		return err
	}
	if plan.Edits.Empty() {
		return nil
	}

	proc, err := verifyContainer(st.Pid, st.ID, root, hook.PID)
	if err != nil {
		return err
	}
	defer proc.close()
	if hook.Alive != nil {
		if err := hook.Alive(); err != nil {
			return fmt.Errorf("container %s: the hook's process %d: %w", st.ID, hook.PID, err)
		}
	}
	if err := nsmount.Apply(st.Pid, root, plan.Edits, nsmount.Options{NoCgroups: noCgroups}); err != nil {
		return err
	}
	rec.Phase("namespace")
	// The root filesystem as the container's mount namespace shows it,
	// where the new mounts are visible.
	err = plan.FinishRootfs(func() (*rootfs.Root, error) {
		r, err := rootfs.Open("/proc/" + strconv.Itoa(st.Pid) + "/root" + root)
		if err != nil {
			return nil, fmt.Errorf("opening the container's root filesystem: %w", err)
		}
		// runc pivots into it next and the runtime writes the files
		// again at every create: no fsync in the hot path.
		r.SkipSync()
		return r, nil
	}, nil)
	if err != nil {
		return err
	}
	rec.Phase("rootfs")
	// The pid named the verified process throughout only if it is still
	// alive now; otherwise fail the container (runc then removes it).
	if err := proc.alive(); err != nil {
		return err
	}
	setMark(dir, mark)
	return nil
}

// markPrefix names the file a finished prestart leaves in the bundle
// directory, for a second prestart of the same container (see Prestart).
const markPrefix = ".gantry-prestart-"

// doneMark is the mark's name for the container whose init is pid: this
// boot's ID, the pid and its start time (ticks since boot), so that a
// bundle directory an engine reuses for the container's next start
// (Podman's, which may outlive a reboot) does not count as done; "" when
// any of them cannot be read.
func doneMark(pid int) string {
	t, err := procfs.StartTime("/proc", pid)
	if err != nil {
		return ""
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	id := strings.TrimSpace(string(boot))
	if err != nil || id == "" || strings.ContainsAny(id, "/\x00") {
		return ""
	}
	return markPrefix + id + "-" + strconv.Itoa(pid) + "-" + strconv.FormatUint(t, 10)
}

func marked(dir int, mark string) bool {
	var st unix.Stat_t
	return unix.Fstatat(dir, mark, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// setMark leaves mark in the bundle directory and removes the marks of
// earlier starts. A mark that cannot be made only costs a second prestart
// its check.
func setMark(dir int, mark string) {
	if mark == "" {
		return
	}
	if fd, err := unix.Openat(dir, mark, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600); err == nil {
		unix.Close(fd)
	}
	d, err := os.Open("/proc/self/fd/" + strconv.Itoa(dir))
	if err != nil {
		return
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	for _, n := range names {
		if strings.HasPrefix(n, markPrefix) && n != mark {
			_ = unix.Unlinkat(dir, n, 0)
		}
	}
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
