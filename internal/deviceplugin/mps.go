package deviceplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/mps"
)

// MPS sharing (sharing.mps): each device of a shared resource is offered
// `replicas` times, as with time-slicing, but the containers reach the GPU
// through one MPS control daemon per resource, which gantry-device-plugin
// mps-control-daemon runs on the node (mpsdaemon.go). Each client gets
// 1/replicas of the GPU's memory (set_default_device_pinned_mem_limit) and
// of its threads (set_default_active_thread_percentage).
//
// The host layout, under flags.mpsRoot (default /run/nvidia/mps), is
// NVIDIA's:
//
//	<root>/<resource>/pipe   the daemon's pipe directory (CUDA_MPS_PIPE_DIRECTORY)
//	<root>/<resource>/log    its log directory (CUDA_MPS_LOG_DIRECTORY)
//	<root>/<resource>/shm    the daemon's /dev/shm, shared with its clients only:
//	                         a tmpfs of its own, bounded (gantry.mpsShmSize),
//	                         nosuid, nodev, noexec
//
// (NVIDIA's plugin has one <root>/shm for every daemon: every client of
// every shared resource would read and fill one directory.)
// plus <root>/<resource>/.ready, which the daemon manager writes once the
// daemon answers and touches on every health check; the plugin offers the
// resource's replicas as healthy only while that file is fresh.
const (
	// DefaultMPSRoot is flags.mpsRoot when unset (NVIDIA's chart default).
	DefaultMPSRoot = "/run/nvidia/mps"
	// MPSContainerRoot is where containers find the pipe directory:
	// /mps/<resource>/pipe, as with NVIDIA's plugin.
	MPSContainerRoot = "/mps"
	// mpsReadyFile is the per-resource readiness file.
	mpsReadyFile = ".ready"
	// The variables MPS clients read.
	envMPSPipeDir       = mps.EnvPipeDir
	envMPSMemLimit      = mps.EnvMemLimit
	envMPSThreadPercent = mps.EnvThreadPercent
)

// mpsReadyMaxAge is how old the ready file may be before the daemon counts
// as gone (its manager died without removing it); the manager touches it
// every health check (MPSManager.Interval, default 5s).
var mpsReadyMaxAge = 30 * time.Second

// mpsPoll is how often the plugin looks at the ready files.
var mpsPoll = time.Second

// replicated is the sharing section in use and its key: sharing.mps when it
// lists resources, else sharing.timeSlicing (nil when neither does).
func (c *Config) replicated() (*ReplicatedResources, string) {
	if m := c.Sharing.MPS; m != nil && len(m.Resources) > 0 {
		return m, "sharing.mps"
	}
	if ts := c.Sharing.TimeSlicing; ts != nil && len(ts.Resources) > 0 {
		return ts, "sharing.timeSlicing"
	}
	return nil, ""
}

// MPSEnabled reports whether sharing.mps lists resources.
func (c *Config) MPSEnabled() bool {
	m := c.Sharing.MPS
	return m != nil && len(m.Resources) > 0
}

// MPSRoot is flags.mpsRoot or DefaultMPSRoot.
func (c *Config) MPSRoot() string {
	if c.Flags.MpsRoot != "" {
		return c.Flags.MpsRoot
	}
	return DefaultMPSRoot
}

// validateMPS checks sharing.mps: the keys as timeSlicing's, and what MPS
// cannot do.
func (c *Config) validateMPS() error {
	if !c.MPSEnabled() {
		return nil
	}
	if ts := c.Sharing.TimeSlicing; ts != nil && len(ts.Resources) > 0 {
		return badValue(c, "sharing.mps", "set", "sharing.timeSlicing is set too; a node shares its GPUs one way: remove one of the two sections")
	}
	if c.Flags.MigStrategy == MIGMixed {
		return badValue(c, "flags.migStrategy", "mixed", "MPS sharing (sharing.mps) does not work with MIG devices; use migStrategy none, or time-slicing")
	}
	return c.validateReplicated("sharing.mps", c.Sharing.MPS)
}

// checkMPSShared refuses what an MPS daemon cannot serve among the devices
// that sharing.mps.resources[i] shares.
func checkMPSShared(i int, shared []Device, replicas int, sys *gpu.System) error {
	key := fmt.Sprintf("sharing.mps.resources[%d]", i)
	for _, d := range shared {
		if d.MIG {
			return fmt.Errorf("%w: %s: MIG device %s (%s): MPS sharing does not work with MIG devices; use migStrategy none or time-slicing", ErrConfig, key, d.Index, d.UUID)
		}
		g := gpuByUUID(sys, d.GPU)
		if g == nil {
			continue
		}
		if limit := mps.MaxClients(g.ComputeCapability); replicas > limit {
			return fmt.Errorf("%w: %s.replicas: %d is more than the %d clients an MPS server takes on GPU %d (%s, compute capability %s); use at most %d",
				ErrConfig, key, replicas, limit, g.Index, g.Name, g.ComputeCapability, limit)
		}
	}
	return nil
}

// MPSDaemonSpec is what one MPS control daemon serves: a shared resource
// and its GPUs.
type MPSDaemonSpec struct {
	Resource string
	Replicas int
	// GPUs in index order; the daemon sees them (CUDA_VISIBLE_DEVICES) in
	// this order, so ordinal i is GPUs[i].
	GPUs []MPSGPU
}

// MPSGPU is one GPU of an MPS daemon.
type MPSGPU struct {
	UUID      string
	Index     int
	MemoryMiB uint64
}

// MemLimitMiB is each client's pinned device memory on g: an equal share.
func (s MPSDaemonSpec) MemLimitMiB(g MPSGPU) uint64 { return g.MemoryMiB / uint64(s.Replicas) }

// ThreadPercentage is each client's share of the GPU's threads.
func (s MPSDaemonSpec) ThreadPercentage() int { return 100 / s.Replicas }

// MPSDaemonSpecs are the daemons the resources of sys need (one per
// resource shared through MPS); c and res as for New.
func MPSDaemonSpecs(res []Resource, sys *gpu.System) []MPSDaemonSpec {
	var out []MPSDaemonSpec
	for _, r := range res {
		if !r.MPS {
			continue
		}
		spec := MPSDaemonSpec{Resource: r.Name, Replicas: r.Replicas}
		for _, d := range r.Devices {
			if d.Replica < 0 {
				continue // a whole GPU beside the replicas (devices: a subset, no rename)
			}
			if slices.ContainsFunc(spec.GPUs, func(g MPSGPU) bool { return g.UUID == d.GPU }) {
				continue
			}
			g := MPSGPU{UUID: d.GPU, Index: d.GPUIndex}
			if dev := gpuByUUID(sys, d.GPU); dev != nil {
				g.MemoryMiB = dev.MemoryMiB
			}
			spec.GPUs = append(spec.GPUs, g)
		}
		slices.SortFunc(spec.GPUs, func(a, b MPSGPU) int { return a.Index - b.Index })
		out = append(out, spec)
	}
	return out
}

// mpsPaths are a resource's directories under an MPS root.
type mpsPaths struct{ dir, pipe, log, ready, shm string }

func mpsPathsFor(root, resource string) mpsPaths {
	dir := filepath.Join(root, resource)
	return mpsPaths{
		dir: dir, pipe: filepath.Join(dir, "pipe"), log: filepath.Join(dir, "log"),
		ready: filepath.Join(dir, mpsReadyFile), shm: filepath.Join(dir, "shm"),
	}
}

// mpsReady reports whether the resource's daemon is up: its ready file
// exists and is fresh.
func mpsReady(root, resource string) bool {
	st, err := os.Stat(mpsPathsFor(root, resource).ready)
	return err == nil && st.Mode().IsRegular() && time.Since(st.ModTime()) < mpsReadyMaxAge
}

// watchMPS keeps the servers of MPS resources informed of their daemon's
// readiness, waking their streams on each change, until ctx is done.
func (p *Plugin) watchMPS(ctx context.Context) {
	root := p.cfg.MPSRoot()
	tick := time.NewTicker(mpsPoll)
	defer tick.Stop()
	for {
		for _, s := range p.servers {
			if !s.res.MPS {
				continue
			}
			up := mpsReady(root, s.res.Name)
			if s.mpsUp.Swap(up) != up {
				if up {
					p.log.Info("MPS control daemon ready; offering the replicas", "resource", s.res.Name)
				} else {
					p.log.Warn("MPS control daemon not ready; replicas offered as unhealthy until it is",
						"resource", s.res.Name, "readyFile", mpsPathsFor(root, s.res.Name).ready)
				}
				s.notify()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// hasMPS reports whether some resource is shared through MPS.
func (p *Plugin) hasMPS() bool {
	return slices.ContainsFunc(p.servers, func(s *server) bool { return s.res.MPS })
}

// mpsAvailable is false for a replica of an MPS resource whose daemon is
// not ready (a whole GPU beside the replicas does not need the daemon).
func (s *server) mpsAvailable(d *Device) bool { return !s.res.MPS || d.Replica < 0 || s.mpsUp.Load() }

// mpsCheck refuses an allocation while the daemon is not ready: the
// kubelet does not allocate unhealthy devices, but one that allocated just
// before the daemon went away must not start a container that cannot reach it.
func (s *server) mpsCheck(devs []*Device) error {
	if !s.res.MPS || !slices.ContainsFunc(devs, func(d *Device) bool { return !s.mpsAvailable(d) }) {
		return nil
	}
	return status.Errorf(codes.Unavailable, "%s: the MPS control daemon is not ready (%s missing or stale); check the gantry-mps-control-daemon pod of this node",
		s.res.Name, mpsPathsFor(s.p.cfg.MPSRoot(), s.res.Name).ready)
}

// addMPS adds what a client of the resource's MPS daemon needs: the pipe
// directory and the daemon's /dev/shm, and, when the container's replicas
// are all of one GPU, its memory and thread limits scaled to the number of
// replicas it got (the daemon's defaults cover one replica per client).
// devs are sorted (compareDevices).
func (s *server) addMPS(r *pluginapi.ContainerAllocateResponse, devs []*Device) {
	devs = slices.DeleteFunc(slices.Clone(devs), func(d *Device) bool { return d.Replica < 0 })
	if len(devs) == 0 {
		return // whole GPUs only: no MPS client
	}
	paths := mpsPathsFor(s.p.cfg.MPSRoot(), s.res.Name)
	pipe := filepath.Join(MPSContainerRoot, s.res.Name, "pipe")
	r.Envs[envMPSPipeDir] = pipe
	r.Mounts = append(r.Mounts,
		&pluginapi.Mount{ContainerPath: pipe, HostPath: paths.pipe, ReadOnly: true},
		&pluginapi.Mount{ContainerPath: "/dev/shm", HostPath: paths.shm},
	)
	gpu0 := devs[0].GPU
	if slices.ContainsFunc(devs, func(d *Device) bool { return d.GPU != gpu0 }) {
		return
	}
	n := len(devs)
	reps := s.res.Replicas
	r.Envs[envMPSThreadPercent] = strconv.Itoa(min(100, 100*n/reps))
	if g := gpuByUUID(s.p.sys, gpu0); g != nil && g.MemoryMiB > 0 {
		// The container sees this one GPU, as device 0.
		r.Envs[envMPSMemLimit] = fmt.Sprintf("0=%dM", g.MemoryMiB/uint64(reps)*uint64(n))
	}
}

// gpuByUUID is the GPU of sys with that UUID, nil if none.
func gpuByUUID(sys *gpu.System, uuid string) *gpu.Device {
	for i := range sys.Devices {
		if sys.Devices[i].UUID == uuid {
			return &sys.Devices[i]
		}
	}
	return nil
}
