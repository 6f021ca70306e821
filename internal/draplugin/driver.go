package draplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/cdispec"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/health"
	"github.com/gantry-gpu/gantry/internal/mps"
)

// CDIClass is the class of the per-claim CDI specs; the vendor is
// "k8s." + the driver name, as NVIDIA's DRA driver names its claim specs.
const CDIClass = "claim"

// DefaultCDIRoot is where the per-claim specs go: the transient CDI
// directory containerd and CRI-O read.
const DefaultCDIRoot = "/var/run/cdi"

// CheckpointFile is the checkpoint's name in the plugin data directory.
const CheckpointFile = "checkpoint.json"

// ErrDeviceInUse is wrapped by a claim's prepare error when one of its
// devices is prepared for another claim.
var ErrDeviceInUse = errors.New("device already prepared for another claim")

// Options configure a Driver.
type Options struct {
	// DriverName is the DRA driver name; "" means DefaultDriverName.
	DriverName string
	// NodeName names the pool the devices are published in.
	NodeName string
	// System and Inventory are the host's GPUs and driver files.
	System    *gpu.System
	Inventory *driver.Inventory
	// CDIRoot is where per-claim CDI specs are written ("" means
	// DefaultCDIRoot).
	CDIRoot string
	// Checkpoint is the checkpoint file's path.
	Checkpoint string
	// HookPath, DevRoot and Capabilities are as in cdispec.Options.
	HookPath string
	DevRoot  string
	// HostRoot is where the host's / is mounted in the plugin's container
	// ("" or "/" when the plugin sees the host's own files): the driver
	// root and DevRoot then lie under it, and it is taken off the host
	// paths in the specs, which the runtime reads on the host.
	HostRoot     string
	Capabilities []driver.Capability
	// Devices narrows the published GPUs (see Only); "" is all. The IMEX
	// channels under DevRoot and the GPUs bound to vfio-pci in SysRoot
	// are published besides (IMEXDevices, VFIODevices).
	Devices string
	// SysRoot is where sysfs is ("" means /sys).
	SysRoot string
	// Health watches the devices (health.NewNVML, health.NewSim); nil
	// turns the kubelet's DRA health service off.
	Health health.Source
	Log    *slog.Logger

	// StateDir holds the MPS daemons' directories (<StateDir>/mps/<id>),
	// at the same path on the host ("" means the checkpoint's directory).
	StateDir string
	// NvidiaSMI and MPSControl are the driver's nvidia-smi and
	// nvidia-cuda-mps-control in the plugin's view; "" finds them among
	// the Inventory's programs.
	NvidiaSMI, MPSControl string
	// MPSCheckInterval is how often an MPS daemon is asked whether it
	// answers (0: 5s); MPSTimeout bounds each run of a driver program and
	// the wait for a started daemon (0: 30s).
	MPSCheckInterval, MPSTimeout time.Duration
	// MPSShmSize is the size of each MPS daemon's shm, a tmpfs of its own
	// (0: mps.DefaultShmSize).
	MPSShmSize int64
}

// Driver is the DRA plugin: it implements kubeletplugin.DRAPlugin.
type Driver struct {
	name, pool, cdiRoot, cpPath, vendor string
	hostRoot                            string
	sys                                 *gpu.System
	specOpts                            cdispec.Options
	common                              specs.ContainerEdits
	devices                             []Device
	byName                              map[string]Device
	log                                 *slog.Logger

	mu sync.Mutex
	cp *checkpoint
	// lookup reads a claim from the API server (set by Start); nil: the
	// claims holding devices are never looked up.
	lookup func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)

	healthSrc  health.Source
	hmu        sync.Mutex
	healthBy   map[string]kubeletplugin.DeviceHealth // by device name; absent: healthy
	healthOK   bool                                  // false once the source has failed
	healthWake chan struct{}

	// Sharing (sharing.go): the driver programs, their environment, and
	// the supervised MPS daemons by ID (under mu).
	stateDir, smi, mpsControl, self string
	progEnv                         []string
	mpsInterval, mpsTimeout         time.Duration
	mpsShmSize                      int64
	// mpsAnswerWait, when set, bounds the wait for a started daemon to
	// answer instead of mpsTimeout (tests of a daemon that never does).
	mpsAnswerWait time.Duration
	runCtx        context.Context
	mpsRuns       map[string]*mpsRun
	mpsWG         sync.WaitGroup
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New builds a Driver and loads its checkpoint.
func New(o Options) (*Driver, error) {
	if o.DriverName == "" {
		o.DriverName = DefaultDriverName
	}
	if o.CDIRoot == "" {
		o.CDIRoot = DefaultCDIRoot
	}
	if o.NodeName == "" {
		return nil, errors.New("no node name: set NODE_NAME (the DaemonSet passes spec.nodeName) or --node-name")
	}
	if o.Checkpoint == "" {
		return nil, errors.New("no checkpoint path")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	vendor := "k8s." + o.DriverName
	if err := parser.ValidateVendorName(vendor); err != nil {
		return nil, fmt.Errorf("driver name %q does not make a CDI vendor: %w", o.DriverName, err)
	}
	devs, err := Devices(o.System)
	if err != nil {
		return nil, err
	}
	if devs, err = Only(o.System, devs, o.Devices); err != nil {
		return nil, err
	}
	imex, err := IMEXDevices(o.DevRoot)
	if err != nil {
		return nil, fmt.Errorf("IMEX channels: %w", err)
	}
	devs = append(devs, imex...)
	sysRoot := o.SysRoot
	if sysRoot == "" {
		sysRoot = "/sys"
	}
	if vfio, err := VFIODevices(sysRoot, o.DevRoot); err != nil {
		// The GPUs are published all the same; the vfio ones once fixed.
		o.Log.Warn("not publishing GPUs bound to vfio-pci (vfio.gpu.nvidia.com)", "err", err)
	} else {
		devs = append(devs, vfio...)
	}
	cp, err := readCheckpoint(o.Checkpoint, o.DriverName)
	if err != nil {
		return nil, err
	}
	d := &Driver{
		name: o.DriverName, pool: o.NodeName, cdiRoot: o.CDIRoot, cpPath: o.Checkpoint, vendor: vendor,
		hostRoot: filepath.Clean("/" + o.HostRoot),
		sys:      o.System,
		specOpts: cdispec.Options{HookPath: o.HookPath, DevRoot: o.DevRoot, Capabilities: o.Capabilities},
		devices:  devs, byName: map[string]Device{}, log: o.Log, cp: cp,
		healthSrc: o.Health, healthBy: map[string]kubeletplugin.DeviceHealth{}, healthOK: true, healthWake: make(chan struct{}),
	}
	d.stateDir, d.mpsInterval, d.mpsTimeout, d.mpsShmSize = o.StateDir, o.MPSCheckInterval, o.MPSTimeout, o.MPSShmSize
	if d.mpsShmSize <= 0 {
		d.mpsShmSize = mps.DefaultShmSize
	}
	if d.stateDir == "" {
		d.stateDir = filepath.Dir(o.Checkpoint)
	}
	if d.mpsTimeout <= 0 {
		d.mpsTimeout = 30 * time.Second
	}
	d.runCtx, d.mpsRuns = context.Background(), map[string]*mpsRun{}
	if d.self, err = os.Executable(); err != nil {
		return nil, fmt.Errorf("finding the plugin's own binary (it starts MPS daemons through it): %w", err)
	}
	d.programs(o.Inventory, o.NvidiaSMI, o.MPSControl)
	d.common = cdispec.CommonEdits(o.Inventory, d.specOpts)
	d.unroot(&d.common)
	for _, dev := range devs {
		d.byName[dev.Slice.Name] = dev
	}
	return d, nil
}

// Devices are the devices the driver publishes.
func (d *Driver) Devices() []Device { return d.devices }

// SpecPath is the CDI spec file of a claim.
func (d *Driver) SpecPath(claimUID types.UID) string {
	return filepath.Join(d.cdiRoot, cdi.GenerateTransientSpecName(d.vendor, CDIClass, string(claimUID))+".json")
}

// PrepareResourceClaims writes each claim's CDI spec and answers its CDI
// device IDs. A claim already in the checkpoint (prepared before, perhaps
// by an earlier run of the plugin) is answered from there without being
// prepared again; its spec is rewritten only when it has gone missing.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var added []string
	repods := false
	for _, c := range claims {
		start := time.Now()
		pc, fresh, err := d.prepare(ctx, c)
		if err != nil {
			d.log.Warn("prepare failed", "claim", c.Namespace+"/"+c.Name, "uid", c.UID, "err", err)
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		if addPods(&pc, c) && !fresh {
			d.cp.Claims[string(c.UID)] = pc
			repods = true
		}
		if fresh {
			d.cp.Claims[string(c.UID)] = pc
			added = append(added, string(c.UID))
			d.log.Info("prepared", "claim", c.Namespace+"/"+c.Name, "uid", c.UID, "devices", len(pc.Devices), "spec", pc.Spec,
				"took", time.Since(start).Round(time.Microsecond))
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: result(pc)}
	}
	if len(added) > 0 || repods {
		if err := d.cp.write(d.cpPath); err != nil {
			// Not recorded, not prepared: the kubelet's retry prepares
			// them again (their specs are rewritten in place).
			for _, uid := range added {
				pc := d.cp.Claims[uid]
				if uerr := d.undoSharing(pc.Namespace+"/"+pc.Name, pc.Sharing); uerr != nil {
					d.log.Warn("undoing a claim's sharing after a failed checkpoint write", "uid", uid, "err", uerr)
				}
				delete(d.cp.Claims, uid)
			}
			return nil, err
		}
	}
	return out, nil
}

func result(pc preparedClaim) []kubeletplugin.Device {
	var devs []kubeletplugin.Device
	for _, pd := range pc.Devices {
		devs = append(devs, kubeletplugin.Device{
			Requests: slices.Clone(pd.Requests), PoolName: pd.Pool, DeviceName: pd.Device,
			CDIDeviceIDs: slices.Clone(pd.CDIDeviceIDs),
		})
	}
	return devs
}

// prepare prepares one claim; fresh says whether the checkpoint must record it.
func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) (preparedClaim, bool, error) {
	if pc, ok := d.cp.Claims[string(c.UID)]; ok {
		if pc.Spec == "" {
			return pc, false, nil // none of our devices: no spec
		}
		if _, err := os.Stat(pc.Spec); err == nil {
			return pc, false, nil
		}
		// The spec is gone (a reboot emptied /var/run): write it anew.
	}
	if c.Status.Allocation == nil {
		return preparedClaim{}, false, fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)
	}
	plans, err := d.sharingPlans(c)
	if err != nil {
		return preparedClaim{}, false, err
	}
	shs, shareEdits, err := d.planSharing(string(c.UID), plans)
	if err != nil {
		return preparedClaim{}, false, err
	}
	pc := preparedClaim{Namespace: c.Namespace, Name: c.Name, Spec: d.SpecPath(c.UID), Sharing: shs}
	// The driver's files go with a GPU; a claim of only IMEX channels or
	// vfio GPUs gets their nodes, and NVIDIA_VISIBLE_DEVICES=void so that
	// a GPU runtime injects nothing either (as NVIDIA's driver does).
	spec := &specs.Spec{Kind: d.vendor + "/" + CDIClass, ContainerEdits: specs.ContainerEdits{Env: []string{edits.VisibleDevicesVoid}}}
	for _, r := range c.Status.Allocation.Devices.Results {
		if dev, ok := d.byName[r.Device]; ok && r.Driver == d.name && len(dev.Nodes) == 0 {
			spec.ContainerEdits = d.common
			break
		}
	}
	seen := map[string]bool{}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.name {
			continue
		}
		if r.Pool != d.pool {
			return preparedClaim{}, false, fmt.Errorf("claim %s/%s: device %s is from pool %q, this node's pool is %q", c.Namespace, c.Name, r.Device, r.Pool, d.pool)
		}
		dev, ok := d.byName[r.Device]
		if !ok {
			return preparedClaim{}, false, fmt.Errorf("claim %s/%s: device %q is not a device this plugin publishes on this node (it has %d; were the GPUs, their MIG layout or --devices changed since the claim was allocated?)", c.Namespace, c.Name, r.Device, len(d.devices))
		}
		admin := r.AdminAccess != nil && *r.AdminAccess
		if uid, other, ok := d.holder(r.Device, string(c.UID), admin); ok && !d.releaseStale(ctx, uid, r.Device) {
			return preparedClaim{}, false, fmt.Errorf("claim %s/%s: %s: %w (%s)", c.Namespace, c.Name, r.Device, ErrDeviceInUse, other)
		}
		cdiName := string(c.UID) + "-" + r.Device
		if !seen[r.Device] {
			seen[r.Device] = true
			var ce specs.ContainerEdits
			var err error
			if len(dev.Nodes) > 0 {
				ce, err = nodeEdits(d.specOpts.DevRoot, dev)
			} else {
				ce, err = cdispec.DeviceEdits(d.sys, dev.ID, d.specOpts)
			}
			if err != nil {
				return preparedClaim{}, false, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
			}
			d.unroot(&ce)
			if se, ok := shareEdits[r.Device]; ok {
				ce.Env = append(ce.Env, se.Env...)
				ce.Mounts = append(ce.Mounts, se.Mounts...)
			}
			spec.Devices = append(spec.Devices, specs.Device{Name: cdiName, ContainerEdits: ce})
		}
		pc.Devices = append(pc.Devices, preparedDevice{
			Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, UUID: dev.UUID, AdminAccess: admin,
			CDIDeviceIDs: []string{parser.QualifiedName(d.vendor, CDIClass, cdiName)},
		})
	}
	if len(spec.Devices) == 0 {
		// Nothing of ours in the claim: nothing to inject.
		pc.Spec = ""
		return pc, true, nil
	}
	v, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return preparedClaim{}, false, fmt.Errorf("claim %s/%s: CDI version: %w", c.Namespace, c.Name, err)
	}
	spec.Version = v
	if err := cdispec.Validate(spec); err != nil {
		return preparedClaim{}, false, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	claim := c.Namespace + "/" + c.Name
	if err := d.applySharing(ctx, claim, shs); err != nil {
		return preparedClaim{}, false, fmt.Errorf("claim %s: %w", claim, err)
	}
	if err := cdispec.Write(spec, pc.Spec, cdispec.FormatJSON); err != nil {
		if uerr := d.undoSharing(claim, shs); uerr != nil {
			d.log.Warn("undoing a claim's sharing after a failed prepare", "claim", claim, "err", uerr)
		}
		return preparedClaim{}, false, fmt.Errorf("claim %s: %w", claim, err)
	}
	return pc, true, nil
}

// unroot turns paths in the plugin's view into the host's: it takes the
// host root off the host paths of mounts and device nodes.
func (d *Driver) unroot(ce *specs.ContainerEdits) {
	if d.hostRoot == "/" {
		return
	}
	strip := func(p string) string {
		if rest, ok := strings.CutPrefix(p, d.hostRoot); ok && (rest == "" || rest[0] == '/') {
			return "/" + strings.TrimPrefix(rest, "/")
		}
		return p
	}
	for _, m := range ce.Mounts {
		m.HostPath = strip(m.HostPath)
	}
	for _, n := range ce.DeviceNodes {
		if n.HostPath != "" {
			if n.HostPath = strip(n.HostPath); n.HostPath == n.Path {
				n.HostPath = ""
			}
		}
	}
}

// holder returns the UID and a description of another claim that holds
// device, unless both that claim's use and this one are admin access
// (monitoring next to a workload).
func (d *Driver) holder(device, uid string, admin bool) (string, string, bool) {
	for other, pc := range d.cp.Claims {
		if other == uid {
			continue
		}
		for _, pd := range pc.Devices {
			if pd.Device == device && !(admin && pd.AdminAccess) {
				return other, "claim " + pc.Namespace + "/" + pc.Name + " uid " + other, true
			}
		}
	}
	return "", "", false
}

// releaseStale unprepares the prepared claim uid when the API server says it
// no longer holds device: deleted, replaced by a new claim of the same name,
// or no longer allocated that device. The kubelet unprepares a deleted pod's
// claims only once the pod is gone from the API server, and the scheduler
// may hand the device to a new claim before that; refusing it would stall
// the new pod until the kubelet's next retry, about a minute later. When
// the API server cannot be asked, the device stays taken.
func (d *Driver) releaseStale(ctx context.Context, uid, device string) bool {
	pc, ok := d.cp.Claims[uid]
	if !ok || d.lookup == nil {
		return false
	}
	cur, err := d.lookup(ctx, pc.Namespace, pc.Name)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false
	case string(cur.UID) != uid:
	case allocates(cur, d.name, d.pool, device):
		return false
	}
	delete(d.cp.Claims, uid)
	if err := d.cp.write(d.cpPath); err != nil {
		d.cp.Claims[uid] = pc
		return false
	}
	if pc.Spec != "" {
		if err := os.Remove(pc.Spec); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.log.Warn("removing a stale claim's CDI spec", "spec", pc.Spec, "err", err)
		}
	}
	if err := d.undoSharing(pc.Namespace+"/"+pc.Name, pc.Sharing); err != nil {
		d.log.Warn("undoing a stale claim's sharing", "claim", pc.Namespace+"/"+pc.Name, "err", err)
	}
	d.log.Info("released a claim the API server no longer allocates", "claim", pc.Namespace+"/"+pc.Name, "uid", uid, "device", device)
	return true
}

// allocates reports whether claim c's allocation holds device of driver
// name in pool.
func allocates(c *resourceapi.ResourceClaim, name, pool, device string) bool {
	if c.Status.Allocation == nil {
		return false
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == name && r.Pool == pool && r.Device == device {
			return true
		}
	}
	return false
}

// UnprepareResourceClaims removes each claim's CDI spec and forgets it. A
// claim that is not prepared is not an error: the kubelet repeats calls.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	removed := map[string]preparedClaim{}
	for _, c := range claims {
		out[c.UID] = nil
		pc, ok := d.cp.Claims[string(c.UID)]
		if !ok {
			// Not recorded; but a crash between writing a claim's spec and
			// the checkpoint leaves the spec at its fixed path.
			if err := os.Remove(d.SpecPath(c.UID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				out[c.UID] = fmt.Errorf("removing the CDI spec of claim %s/%s: %w", c.Namespace, c.Name, err)
			}
			// And the MPS daemons it started.
			if err := d.undoOrphans(c.Namespace+"/"+c.Name, string(c.UID)); err != nil && out[c.UID] == nil {
				out[c.UID] = fmt.Errorf("claim %s/%s: stopping its MPS daemons: %w", c.Namespace, c.Name, err)
			}
			continue
		}
		if pc.Spec != "" {
			if err := os.Remove(pc.Spec); err != nil && !errors.Is(err, fs.ErrNotExist) {
				out[c.UID] = fmt.Errorf("removing the CDI spec of claim %s/%s: %w", c.Namespace, c.Name, err)
				continue
			}
		}
		if err := d.undoSharing(c.Namespace+"/"+c.Name, pc.Sharing); err != nil {
			// Kept: the kubelet's retry undoes it again.
			out[c.UID] = fmt.Errorf("claim %s/%s: undoing its sharing: %w", c.Namespace, c.Name, err)
			continue
		}
		delete(d.cp.Claims, string(c.UID))
		removed[string(c.UID)] = pc
		d.log.Info("unprepared", "claim", c.Namespace+"/"+c.Name, "uid", c.UID)
	}
	if len(removed) > 0 {
		if err := d.cp.write(d.cpPath); err != nil {
			// Still recorded on disk: keep holding them, so that the
			// kubelet's retry and a restart agree.
			maps.Copy(d.cp.Claims, removed)
			return nil, err
		}
	}
	return out, nil
}

// Prepared lists the UIDs of the prepared claims.
func (d *Driver) Prepared() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for uid := range d.cp.Claims {
		out = append(out, uid)
	}
	slices.Sort(out)
	return out
}

// HandleError logs errors from the helper's background work (publishing
// ResourceSlices, the gRPC servers). All of them are retried by the
// helper, so none ends the plugin.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	d.log.Error(msg, "err", err, "recoverable", errors.Is(err, kubeletplugin.ErrRecoverable))
}
