package doctor

import (
	"strings"

	"github.com/gantry-gpu/gantry/internal/ctrckpt"
	"github.com/gantry-gpu/gantry/internal/discover"
)

// checkpointEnginePATH is the PATH gantry-runtime, and so runc and CRIU,
// get when an engine checkpoints a container: the running containerd's
// (its shims pass it on; Docker checkpoints through it too), else the
// running CRI-O's, else Options.ServicePATH (enginePATH).
func checkpointEnginePATH(opts Options) (path, source string) {
	for _, p := range []engineProcess{containerdProcess(opts), crioProcess(opts)} {
		if pid, _ := findDaemon(opts.Proc, p); pid != "" {
			return enginePATH(opts.Proc, opts.ServicePATH, p)
		}
	}
	return enginePATH(opts.Proc, opts.ServicePATH, containerdProcess(opts))
}

// checkNetworkLock warns when CRIU's default network lock cannot run with
// the engine's PATH (path, from source) and no CRIU configuration file
// (configs) picks the lock: then gantry-runtime refuses the checkpoint of
// a GPU container with a network namespace of its own (ctrckpt.Assess).
// Not a failure: a container on the host's network is still checkpointed.
func checkNetworkLock(path, source string, configs []string) Check {
	// runc runs criu from the engine's PATH too (containerd: "criu binary
	// not found").
	criu, ok := discover.LookPathIn("criu", path)
	if !ok {
		return skip(CheckNetworkLock, "no criu in the engine's PATH %q (%s): checkpointing is not set up (see %s)", path, source, CheckContainerCheckpoint)
	}
	if ctrckpt.CRIUNetworkLockSet(configs) {
		return pass(CheckNetworkLock, "a CRIU configuration file (one of %s) chooses the network lock (network-lock): CRIU %s does what it says", strings.Join(configs, ", "), criu)
	}
	var found, missing []string
	for _, prog := range ctrckpt.NetworkLockPrograms {
		if p, ok := discover.LookPathIn(prog, path); ok {
			found = append(found, p)
		} else {
			missing = append(missing, prog)
		}
	}
	if len(missing) == 0 {
		return pass(CheckNetworkLock, "CRIU's network lock can run: %s in the engine's PATH (%s)", strings.Join(found, " and "), source)
	}
	verb := "is"
	if len(missing) > 1 {
		verb = "are"
	}
	return warn(CheckNetworkLock, fixNetworkLock,
		"%s %s not in the engine's PATH %q (%s), and no CRIU configuration file (%s) has a network-lock line: CRIU's dump locks a container's own network namespace with iptables-restore and ip6tables-restore, so gantry-runtime refuses to checkpoint a GPU container with a network namespace of its own (every Kubernetes pod, a bridged Podman or Docker container); containers on the host's network are checkpointed",
		strings.Join(missing, " and "), verb, path, source, strings.Join(configs, ", "))
}
