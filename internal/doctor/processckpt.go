package doctor

import (
	"fmt"
	"strings"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/ctrckpt"
	"github.com/gantry-gpu/gantry/internal/cudackpt"
	"github.com/gantry-gpu/gantry/internal/driver"
)

// CheckContainerCheckpoint is advice on checkpointing GPU containers
// (gantry-runtime checkpoint and restore, package ctrckpt).
const CheckContainerCheckpoint = "container checkpoint"

// CheckNetworkLock is whether CRIU's default network lock can run for a
// container in a network namespace of its own (networklock.go).
const CheckNetworkLock = "checkpoint network lock"

// CheckContentStore is whether others can read containerd's content store,
// where a task's checkpoint keeps the container's memory (contentstore.go).
const CheckContentStore = "checkpoint content store"

func init() {
	Checks = append(Checks, CheckDef{
		Name:    CheckContainerCheckpoint,
		Needs:   []Need{NeedDriver},
		Summary: "advice only: CRIU 4.x works and the driver has the CUDA process checkpoint API",
		run: func(e *env) []Check {
			return one(checkContainerCheckpoint(e.opts.Config, e.result(CheckKernel).Status == Pass))
		},
		Verifies: "What checkpoint and restore of GPU containers (`runc checkpoint`/`restore` through gantry-runtime) need: `criu` on PATH is version 4 or later and `criu check` passes (Debian 12's CRIU 3.17 fails on current kernels; `scripts/install-criu.sh` installs 4.1.1), and the driver's libcuda has the CUDA process checkpoint API (`cuCheckpointProcessLock` and the rest: driver r570 or later) and GPU remapping on restore (r580). Advice, never a failure: INFO says what is missing. The driver cannot checkpoint processes using CUDA IPC, MPS or UVM managed memory shared across processes; such a container's checkpoint fails and it goes on running.",
	})
	Checks = append(Checks, CheckDef{
		Name:    CheckNetworkLock,
		Needs:   []Need{NeedDriver},
		Summary: "CRIU's network lock can run: iptables-restore and ip6tables-restore on the engine's PATH",
		run: func(e *env) []Check {
			path, source := checkpointEnginePATH(e.opts)
			return one(checkNetworkLock(path, source, e.opts.CRIUConfigs))
		},
		Verifies: "Whether CRIU's default network lock can run where the engine runs gantry-runtime: CRIU's dump of a container with a network namespace of its own (every Kubernetes pod, a bridged Podman or Docker container) locks its network with `iptables-restore` and `ip6tables-restore`, looked up in the PATH runc hands it, the engine's (the running containerd's, else CRI-O's, from its `/proc/PID/environ`; else systemd's default service PATH). Without them the dump fails (\"Locking network failed\"), so gantry-runtime refuses such a checkpoint before the CUDA lock. PASS when both are there, or when `/etc/criu/runc.conf` or `/etc/criu/default.conf` has a `network-lock` line (CRIU then does what it says); WARN (not a failure; exit code 0: a container on the host's network is still checkpointed) naming what is missing, with the fix; SKIP when there is no `criu` on that PATH (checkpointing is not set up there: see container checkpoint).",
		Failures: []FailureDoc{
			{"WARN: iptables-restore or ip6tables-restore is not in the engine's PATH and no CRIU configuration picks network-lock", fixNetworkLock},
		},
	})
	Checks = append(Checks, CheckDef{
		Name:    CheckContentStore,
		Needs:   []Need{NeedDriver},
		Summary: "others cannot read containerd's content store, where task checkpoints keep the container's memory",
		run: func(e *env) []Check {
			return one(checkContentStore(e.containerdRoot()))
		},
		Verifies: "Whether users other than root can read the blobs of containerd's content store (`ROOT/io.containerd.content.v1.content/blobs/sha256`; ROOT is `--containerd-root`, else the running containerd's root from its CRI status, else `root` in its config.toml, else `/var/lib/containerd`). `ctr tasks checkpoint`, `ctr containers checkpoint` and the kubelet's checkpoint keep the CRIU image there, the whole memory of the container and of its CUDA processes. containerd writes each blob 0444 in directories it makes 0755, so the directories above decide: containerd releases before the fix of CVE-2024-25621 make its root 0711 and keep an existing root's mode; those with it (1.7.29, 2.0.7, 2.1.5, 2.2.0 and later; Debian 12's 1.6.20~ds1-1+deb12u2) make it 0700 and chmod it back to 0700 at every start. PASS when a directory on the way keeps others out; WARN (not a failure; exit code 0) when every directory lets them through, with the fix; SKIP when there is no containerd root.",
		Failures: []FailureDoc{
			{"WARN: every directory down to the blobs lets others search it (a root of 0711: containerd before the CVE-2024-25621 fix, or a chmod since)", fixContentStore},
		},
	})
}

// checkContainerCheckpoint is INFO unless everything checkpointing needs
// is there (PASS).
func checkContainerCheckpoint(cfg config.Config, kernel bool) Check {
	var missing, have []string
	if c := ctrckpt.FindCRIU(); c.Problem != "" {
		missing = append(missing, c.Problem)
	} else {
		have = append(have, fmt.Sprintf("CRIU %s at %s (criu check: %s)", c.Version, c.Path, c.Check))
	}
	switch {
	case isSim(cfg):
		have = append(have, "driver API not checked (GPUs simulated)")
	case !kernel:
		have = append(have, "driver API not checked (no kernel driver)")
	default:
		lib, version := "", ""
		if inv, err := driver.Discover(driver.Options{Root: cfg.DriverRoot, DevRoot: cfg.DevRoot}); err == nil {
			version = inv.Version
			for _, l := range inv.Libraries {
				if l.SONAME == "libcuda.so.1" && l.Capability != driver.Compat32 {
					lib = l.HostPath
					break
				}
			}
		}
		if _, err := cudackpt.Supported(lib, false); err != nil {
			missing = append(missing, "CUDA process checkpoint API: "+err.Error())
		} else if _, err := cudackpt.Supported(lib, true); err != nil {
			have = append(have, "the CUDA process checkpoint API, without GPU remapping ("+err.Error()+")")
		} else {
			have = append(have, "the CUDA process checkpoint API with GPU remapping")
			// The probe's kept verdict (a restore onto other GPUs runs it).
			switch v, found, err := cudackpt.ReadCache(cfg.Runtime.CacheDir, version); {
			case cfg.Runtime.CacheDir == "":
			case err != nil:
				missing = append(missing, "the kept remap verdict: "+err.Error())
			case !found:
				have = append(have, "restore onto other GPUs not probed yet (gantry checkpoint --probe-remap)")
			case !v.Allows():
				have = append(have, "restore onto other GPUs is refused: "+v.String())
			default:
				have = append(have, "restore onto other GPUs: "+v.Remap)
			}
		}
	}
	if len(missing) > 0 {
		return info(CheckContainerCheckpoint, "GPU containers cannot be checkpointed: %s%s", strings.Join(missing, "; "), suffix(have))
	}
	return pass(CheckContainerCheckpoint, "%s", strings.Join(have, "; "))
}

func suffix(have []string) string {
	if len(have) == 0 {
		return ""
	}
	return " (found: " + strings.Join(have, "; ") + ")"
}
