// Package shim is gantry-runtime, the OCI runtime engines register (as
// "nvidia" or "gantry") in place of runc.
//
// It takes runc's command line unchanged. For create and run it reads the
// bundle's config.json, decides what GPUs the container asks for (package
// request: NVIDIA_VISIBLE_DEVICES and the rest of NVIDIA's env contract, CDI
// annotations and names, the volume-mount device list), makes and applies
// the plan of the pipeline the three per-container front ends share (package
// inject) and rewrites config.json once, atomically; then, for every
// subcommand, it replaces itself with the low-level runtime through
// execve(2), so no extra process stays between the engine and runc.
//
// The hot path does no NVML initialisation and no file-system scan: GPUs come
// from /proc/driver/nvidia (or the simulator), the driver's files from an
// inventory cached in runtime.cache-dir and re-discovered only when the
// driver version or the host's ld.so.cache changes. Device nodes and mounts
// are left to runc; the SONAME links and ld.so.cache entries the image needs
// are written in-process through root-confined paths (package rootfs), so no
// hook program is forked per container and nothing from the image runs.
//
// Devices of other CDI kinds (names in cdi.k8s.io/ annotations) are injected
// through the CNCF CDI library from the spec directories. Their specs'
// hooks then run as root under runc; one without an env of its own would
// get the container's environment, the image's, so it is given the fixed
// edits.HookEnv first.
//
// A container that asks for nothing keeps a byte-identical config.json.
package shim

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/fastpath"
	"github.com/gantry-gpu/gantry/internal/inject"
	"github.com/gantry-gpu/gantry/internal/lowlevel"
	"github.com/gantry-gpu/gantry/internal/version"
)

const usage = `gantry-runtime: an OCI runtime for NVIDIA GPUs that wraps runc.

It takes runc's command line. On "create" and "run" it reads the bundle's
config.json, injects the GPUs and driver files the container asks for
(NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES, NVIDIA_REQUIRE_*, CDI
annotations and names), then executes the low-level runtime with the same
arguments. For "checkpoint" and "restore" of a GPU container it also moves the
CUDA state of its processes to host memory and back around the low-level
runtime's (the driver's process checkpoint API, through the gantry beside it;
CRIU 4.x): see "gantry checkpoint --help". Every other command goes to the
low-level runtime untouched.

Register it with an engine:
  gantry runtime configure --runtime docker|containerd|crio [--set-as-default]
then, for example:
  docker run --rm --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=0 IMAGE nvidia-smi

The create server, which saves each GPU create the start of this Go program:
  --create-server [--socket PATH]
      runs one, on /run/gantry/runtime.sock ($GANTRY_RUNTIME_SOCKET); it
      serves root callers running this very file, in its mount namespace,
      and a create without it runs in-process, as before. make install
      installs its systemd units (gantry-runtime-server.socket); gantry
      doctor checks it. See gantry-runtime --create-server --help.

Configuration: %s (or $%s), table [runtime]:
  low-level    the runtime executed (default runc; crun or an absolute path)
  cache-dir    cached driver inventory (default /run/gantry)
  log-file     one line per container handled (the engines hide stderr)
  gantry-path  the gantry binary asked for the GPUs when NVML is needed (MIG
               devices): this program links no NVML (default: the gantry
               beside it, then /usr/bin/gantry)
See "gantry config default" for every key.
`

// Main runs gantry-runtime with runc's arguments (without the program name).
// It returns only on failure, or after --help; otherwise it has become the
// low-level runtime.
func Main(args []string, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
		fmt.Fprintf(stderr, usage, config.DefaultPath, config.EnvPath)
		return 0
	}
	cwd, err := os.Getwd()
	if err != nil {
		cwd = "."
	}
	inv, perr := ParseArgs(args, cwd)
	cfg, cfgPath, cerr := config.Load("")
	if cerr != nil {
		if perr == nil && inv.Modifies() {
			report(stderr, inv, fmt.Errorf("%v", cerr))
			return 1
		}
		// Never block state, kill or delete on a broken config file: the
		// engine could not clean up its containers.
		cfg = config.Default()
	}
	lowLevel, err := FindRuntime(cfg.Runtime.LowLevel)
	if err != nil {
		report(stderr, inv, fmt.Errorf("%v (set runtime.low-level in %s)", err, orDefault(cfgPath)))
		return 1
	}
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-v") {
		fmt.Fprintf(os.Stdout, "gantry-runtime %s (low-level runtime %s)\n", version.Version, lowLevel)
	}
	if perr == nil && inv.Modifies() {
		startup := startupMillis()
		rec, err := Modify(inv.Bundle, cfg)
		rec.Container, rec.StartupMS = inv.ContainerID, startup
		if err == nil {
			rec.Notes = append(rec.Notes, lowLevelNote(cfg, lowLevel)...)
		}
		rec.Log(cfg, err)
		if err != nil {
			report(stderr, inv, err)
			return 1
		}
	}
	if perr == nil && inv.Checkpoints() {
		if code, handled := checkpoint(inv, args, cfg, lowLevel, stderr); handled {
			return code
		}
	}
	// The C constructor ran this create's Go on one CPU; the low-level
	// runtime, and the container it starts, get the caller's CPUs back.
	if err := fastpath.RestoreAffinity(); err != nil {
		report(stderr, inv, fmt.Errorf("restoring the CPU affinity gantry-runtime was started with: %w", err))
		return 1
	}
	argv := append([]string{lowLevel}, args...)
	err = syscall.Exec(lowLevel, argv, os.Environ())
	report(stderr, inv, fmt.Errorf("executing %s: %w", lowLevel, err))
	return 1
}

// lowLevelNote is the warning about the low-level runtime's version
// (package lowlevel: a release with a known container escape), once per
// binary: the first create that runs it logs it.
func lowLevelNote(cfg config.Config, lowLevel string) []string {
	w, err := lowlevel.CheckOnce(cfg.Runtime.CacheDir, lowLevel)
	switch {
	case w != "":
		return []string{w}
	case err != nil:
		return []string{"the low-level runtime's version is unknown: " + err.Error()}
	}
	return nil
}

func orDefault(p string) string {
	if p == "" {
		return config.DefaultPath
	}
	return p
}

// DefaultPath is searched for the low-level runtime when PATH is unset or
// empty (the C fast path uses the same list).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// FindRuntime resolves the low-level runtime: an absolute path as given, a
// name through PATH, skipping any entry that is this executable (an
// installer that put gantry-runtime in PATH as "runc" must not make us exec
// ourselves forever).
func FindRuntime(name string) (string, error) {
	if strings.Contains(name, "/") {
		if _, err := os.Stat(name); err != nil {
			return "", fmt.Errorf("low-level runtime %s: %w", name, err)
		}
		return name, nil
	}
	self, _ := os.Stat("/proc/self/exe")
	path := os.Getenv("PATH")
	if path == "" {
		// Some engines call the runtime with an empty environment (Podman
		// for delete and kill): look where runc and crun are installed.
		path = DefaultPath
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		st, err := os.Stat(p)
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			continue
		}
		if self != nil && os.SameFile(self, st) {
			continue
		}
		return p, nil
	}
	return "", fmt.Errorf("low-level runtime %q not found in PATH (%s): install runc or crun, or set runtime.low-level to its absolute path", name, path)
}

// report prints err on stderr and, when the engine passed --log, appends
// it there in runc's format: containerd and Docker show the runtime's last
// logged error to the user.
func report(stderr io.Writer, inv Invocation, err error) {
	msg := "gantry-runtime: " + err.Error()
	if inv.ContainerID != "" {
		msg = fmt.Sprintf("gantry-runtime: container %s: %v", inv.ContainerID, err)
	}
	fmt.Fprintln(stderr, msg)
	if inv.Log == "" {
		return
	}
	var line []byte
	if inv.LogFormat == "json" {
		line, _ = json.Marshal(map[string]string{"level": "error", "msg": msg, "time": time.Now().Format(time.RFC3339Nano)})
	} else {
		line = []byte(fmt.Sprintf("time=%q level=error msg=%q", time.Now().Format(time.RFC3339Nano), msg))
	}
	inject.AppendLine(inv.Log, line)
}
