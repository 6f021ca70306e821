package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/health"
	"github.com/gantry-gpu/gantry/internal/topology"
)

// Options are what New needs.
type Options struct {
	// Config must be validated (Config.Validate).
	Config Config
	// System is the discovered GPUs (full discovery: NUMA nodes, NVLinks, MIG).
	System *gpu.System
	// Health watches the devices; nil runs no health checks.
	Health health.Source
	// Log receives the plugin's structured log; nil means slog.Default().
	Log *slog.Logger
	// Resync is how often the kubelet directory is checked besides its
	// file-system events (a safety net for missed events); 0 means 5s.
	Resync time.Duration
}

// Plugin serves every resource of a node to the kubelet: one gRPC server per
// resource, registered with the kubelet and kept registered.
type Plugin struct {
	cfg     Config
	sys     *gpu.System
	graph   *topology.Graph
	source  health.Source
	log     *slog.Logger
	resync  time.Duration
	servers []*server

	mu       sync.Mutex
	states   map[string]health.Event // UUID -> latest event (healthy entries for never-reported devices)
	xids     map[string]uint64       // UUID -> XID errors seen since start
	onHealth func(health.Event)      // called on every state change (Kubernetes events)

	kick chan struct{} // asks the reconcile loop to run now

	imex []imexChannel // handed to every container (imex.go)

	// control[i] is set once controlDevices[i] was seen under the device
	// root: a device node, once created, stays, so only absent ones are
	// looked for again, by an Allocate at most every controlRecheck
	// (controlNext, in Unix nanoseconds), as they may appear later.
	control     [len(controlDevices)]atomic.Bool
	controlNext atomic.Int64
}

// controlRecheck is how often an Allocate looks again for the control
// devices not seen yet (nvidia-uvm appears when the module is loaded, at
// the first CUDA use), rather than a stat of each on every call.
const controlRecheck = time.Second

// refreshControl looks for the control devices not seen yet under root, as
// the plugin sees the host's device root (the chart mounts it at the same
// path), unless that was done less than controlRecheck ago.
func (p *Plugin) refreshControl(root string) {
	now := time.Now().UnixNano()
	next := p.controlNext.Load()
	if now < next || !p.controlNext.CompareAndSwap(next, now+int64(controlRecheck)) {
		return
	}
	for i := range controlDevices {
		if p.control[i].Load() {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, controlDevices[i])); err == nil {
			p.control[i].Store(true)
		}
	}
}

// New builds the resources of opts.System and a server for each; nothing
// is listening until Run.
func New(opts Options) (*Plugin, error) {
	if opts.System == nil {
		return nil, errors.New("deviceplugin.New: no GPU system")
	}
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	cfg := opts.Config
	res, err := BuildResources(opts.System, &cfg, log)
	if err != nil {
		return nil, err
	}
	p := &Plugin{
		cfg: cfg, sys: opts.System, graph: topology.NewGraph(opts.System), source: opts.Health,
		log: log, resync: opts.Resync, states: map[string]health.Event{}, kick: make(chan struct{}, 1),
	}
	if p.resync <= 0 {
		p.resync = 5 * time.Second
	}
	chans, warnings, err := resolveIMEX(&cfg, cfg.DevRoot())
	if err != nil {
		return nil, err
	}
	p.imex = chans
	for _, w := range warnings {
		log.Warn(w)
		p.cfg.warnings = append(p.cfg.warnings, w)
	}
	if cfg.Flags.Plugin.PassDeviceSpecs {
		// Looked for once now: an Allocate that finds another one's
		// recheck under way answers with what is known, which must then
		// already hold the control devices present at start.
		p.refreshControl(cfg.DevRoot())
	}
	for _, r := range res {
		p.servers = append(p.servers, newServer(p, r))
		for _, d := range r.Devices {
			for _, u := range []string{d.UUID, d.GPU} {
				if _, ok := p.states[u]; !ok {
					p.states[u] = health.Event{UUID: u, Healthy: true}
				}
			}
		}
	}
	return p, nil
}

// Resources are the resources the plugin serves, sorted by name.
func (p *Plugin) Resources() []Resource {
	out := make([]Resource, len(p.servers))
	for i, s := range p.servers {
		out[i] = s.res
	}
	return out
}

// XIDs is the number of critical XID events seen for the device since the
// plugin started (the metrics' XID counter).
func (p *Plugin) XIDs(uuid string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.xids[uuid]
}

// OnHealthChange sets a function called after each health state change is
// applied (the front end posts a Kubernetes event with it). Set it before Run.
func (p *Plugin) OnHealthChange(f func(health.Event)) {
	p.mu.Lock()
	p.onHealth = f
	p.mu.Unlock()
}

// Health is the latest health of every GPU and MIG device the plugin
// advertises, by UUID. Devices that never had an event are healthy with an
// empty Reason and a zero Time. The map is a copy.
func (p *Plugin) Health() map[string]health.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.states)
}

// healthy reports whether d and its physical GPU are healthy.
func (p *Plugin) healthy(d *Device) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.states[d.UUID].Healthy && p.states[d.GPU].Healthy
}

// Run serves until ctx is done: it starts every resource's server, registers
// it with the kubelet, watches the kubelet directory to re-register after a
// kubelet restart or a deleted socket, and feeds health events to the
// ListAndWatch streams. It returns nil when ctx is done, after removing its
// sockets; an error only when it cannot start at all.
func (p *Plugin) Run(ctx context.Context) error {
	dir := p.cfg.Gantry.KubeletDir
	if len(p.servers) == 0 {
		p.log.Warn("no devices to advertise; waiting for termination", "gpus", p.sys.Backend)
		<-ctx.Done()
		return nil
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	defer watcher.Close()
	watching := false

	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if p.source != nil {
		events := make(chan health.Event, 16)
		wg.Go(func() {
			if err := p.source.Run(ctx, p.watchedUUIDs(), events); err != nil {
				p.log.Error("health checks stopped; devices keep their last state", "err", err)
			}
		})
		wg.Go(func() { p.consumeHealth(ctx, events) })
	}
	if p.hasMPS() {
		wg.Go(func() { p.watchMPS(ctx) })
	}
	defer func() {
		for _, s := range p.servers {
			s.stop()
		}
	}()

	tick := time.NewTicker(p.resync)
	defer tick.Stop()
	var retry <-chan time.Time
	backoff := 500 * time.Millisecond
	const quickRetry = 100 * time.Millisecond
	var failingSince time.Time // when the registrations began to fail; zero while they do not
	warnedWatch := false
	for {
		if !watching {
			if !p.waitForDir(ctx, watcher, dir) {
				return nil
			}
			if err := watcher.Add(dir); err == nil {
				watching = true
			} else if !warnedWatch {
				// It exists but cannot be watched (inotify limits): the
				// periodic check still finds a new kubelet, later.
				p.log.Warn("cannot watch the kubelet directory; checking it every resync instead", "dir", dir, "err", err, "resync", p.resync)
				warnedWatch = true
			}
		}
		if err := p.reconcile(ctx); err != nil {
			if st, serr := os.Stat(dir); serr != nil || !st.IsDir() {
				// The directory went away (a node being reset): not a
				// fault to retry and warn about, but a wait, as at start.
				watching = false
				continue
			}
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if time.Since(failingSince) < registerGrace {
				// A kubelet's socket exists a moment before it accepts
				// (bind, then listen), and the plugin often dials in that
				// moment, woken by the socket's creation (and then again by
				// its own socket's); a stopping kubelet drops a registration
				// under way. Quick quiet retries until registerGrace, with
				// however many reconciles the events bring meanwhile.
				p.log.Debug("kubelet registration failed; retrying", "err", err, "in", quickRetry)
				retry = time.After(quickRetry)
			} else {
				p.log.Warn("kubelet registration pending; retrying", "err", err, "in", backoff, "failing for", time.Since(failingSince).Round(time.Millisecond))
				retry = time.After(backoff)
				backoff = min(backoff*2, 30*time.Second)
			}
		} else {
			retry, backoff, failingSince = nil, 500*time.Millisecond, time.Time{}
		}
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-watcher.Events:
			if !ok {
				return nil
			}
			// A new kubelet.sock needs no marking here: reconcile registers
			// with every socket identity once, whether it sees the new socket
			// first through this event, the removal of our sockets (a
			// starting kubelet empties the directory) or the periodic check.
			// Marking on Create registered twice whenever reconcile had
			// already run for the new socket. Only a socket that is gone
			// forgets the registration: a kubelet that comes back at once
			// could reuse the inode.
			if ev.Name == filepath.Join(dir, KubeletSocketName) && ev.Op.Has(fsnotify.Remove|fsnotify.Rename) {
				if _, err := fileID(ev.Name); errors.Is(err, fs.ErrNotExist) {
					p.log.Info("kubelet socket removed (kubelet stopping or restarting); will register with the next one", "socket", ev.Name)
					for _, s := range p.servers {
						s.markUnregistered()
					}
				}
			}
			if ev.Name == dir && ev.Op.Has(fsnotify.Remove|fsnotify.Rename) {
				watching = false
			}
		case err := <-watcher.Errors:
			p.log.Warn("watching the kubelet directory", "err", err)
		case <-tick.C:
		case <-retry:
		case <-p.kick:
		}
	}
}

// registerGrace is how long registrations may fail before the plugin warns:
// a kubelet starting or stopping is not a fault.
const registerGrace = 2 * time.Second

// waitForDir returns once dir exists (true), or when ctx is done (false).
// A node may start the plugin before the kubelet has made its directory:
// that is normal, not a fault, so it logs one line and waits on inotify
// for each missing path component in turn (with the periodic check as a
// safety net), instead of failing to listen and warning every few seconds.
func (p *Plugin) waitForDir(ctx context.Context, w *fsnotify.Watcher, dir string) bool {
	logged := false
	tick := time.NewTicker(p.resync)
	defer tick.Stop()
	for {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			if logged {
				p.log.Debug("kubelet directory appeared", "dir", dir)
			}
			return true
		}
		if !logged {
			p.log.Info("kubelet directory does not exist yet; waiting for the kubelet to create it", "dir", dir)
			logged = true
		}
		// Watch the deepest ancestor that exists; whatever is created in it
		// may be the next component. Checking again after adding the watch
		// catches a creation that came just before it.
		anc := existingAncestor(dir)
		watched := w.Add(anc) == nil
		if st, err := os.Stat(dir); err == nil && st.IsDir() || existingAncestor(dir) != anc {
			if watched {
				_ = w.Remove(anc)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return false
		case _, ok := <-w.Events:
			if !ok {
				return false
			}
		case <-w.Errors:
		case <-tick.C:
		}
		if watched {
			// Errors only when anc itself is gone, which the next round handles.
			_ = w.Remove(anc)
		}
	}
}

// existingAncestor is the deepest existing directory on the way to dir.
func existingAncestor(dir string) string {
	for d := filepath.Dir(filepath.Clean(dir)); ; d = filepath.Dir(d) {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return d
		}
		if d == filepath.Dir(d) {
			return d
		}
	}
}

// watchedUUIDs are the GPUs and MIG devices the health source watches.
func (p *Plugin) watchedUUIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.states))
}

// consumeHealth applies health events and wakes the affected streams.
func (p *Plugin) consumeHealth(ctx context.Context, events <-chan health.Event) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			p.mu.Lock()
			prev, known := p.states[ev.UUID]
			if known {
				p.states[ev.UUID] = ev
				if ev.XID != 0 && !ev.Healthy {
					if p.xids == nil {
						p.xids = map[string]uint64{}
					}
					p.xids[ev.UUID]++
				}
			}
			hook := p.onHealth
			p.mu.Unlock()
			if !known {
				p.log.Warn("health event for a device the plugin does not advertise; ignored", "uuid", ev.UUID)
				continue
			}
			level := slog.LevelWarn
			if ev.Healthy {
				level = slog.LevelInfo
			}
			p.log.Log(ctx, level, "device health changed", "uuid", ev.UUID, "healthy", ev.Healthy,
				"was_healthy", prev.Healthy, "reason", ev.Reason, "xid", ev.XID)
			if hook != nil {
				hook(ev)
			}
			for _, s := range p.servers {
				if s.uses(ev.UUID) {
					s.notify()
				}
			}
		}
	}
}

// reconcile makes every server listen on its socket and be registered with
// the current kubelet. It returns an error when some registration failed.
func (p *Plugin) reconcile(ctx context.Context) error {
	for _, s := range p.servers {
		if !s.socketIntact() {
			if err := s.start(); err != nil {
				return err
			}
		}
	}
	kubelet := p.cfg.KubeletSocket()
	kid, err := fileID(kubelet)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			p.log.Debug("kubelet socket absent; waiting for it", "socket", kubelet)
			return nil
		}
		return fmt.Errorf("kubelet socket: %w", err)
	}
	var errs []error
	for _, s := range p.servers {
		if s.registeredWith() == kid {
			continue
		}
		if err := p.register(ctx, s); err != nil {
			errs = append(errs, fmt.Errorf("registering %s: %w", s.res.Name, err))
			continue
		}
		s.setRegistered(kid)
		p.log.Info("registered with the kubelet", "resource", s.res.Name, "endpoint", s.res.SocketName(), "devices", len(s.res.Devices))
	}
	return errors.Join(errs...)
}

// register announces s to the kubelet.
func (p *Plugin) register(ctx context.Context, s *server) error {
	conn, err := grpc.NewClient("unix://"+p.cfg.KubeletSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     s.res.SocketName(),
		ResourceName: s.res.Name,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	return err
}

// identity tells one file from another at the same path: a recreated
// socket has a new inode or a new birth time. Birth time rather than change
// time: a chmod, chown or relabelling changes ctime but not the file, and
// must not count as a new kubelet (the kubelet would get a second
// registration and keep two connections). File systems without birth times
// fall back to ctime.
type identity struct {
	dev, ino uint64
	born     int64
}

func fileID(path string) (identity, error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_INO|unix.STATX_BTIME|unix.STATX_CTIME, &st); err != nil {
		return identity{}, &fs.PathError{Op: "statx", Path: path, Err: err}
	}
	t := st.Ctime
	if st.Mask&unix.STATX_BTIME != 0 {
		t = st.Btime
	}
	return identity{
		dev:  unix.Mkdev(st.Dev_major, st.Dev_minor),
		ino:  st.Ino,
		born: t.Sec*1e9 + int64(t.Nsec),
	}, nil
}

// server is the gRPC server of one resource.
type server struct {
	pluginapi.UnimplementedDevicePluginServer
	p      *Plugin
	res    Resource
	socket string
	byID   map[string]*Device
	byUUID map[string]bool // UUIDs and GPU UUIDs of res's devices
	// Made once, so that Allocate only looks them up: the CDI name and the
	// volume-mounts Mount of each device ID the answers use (UUID or index,
	// per deviceIDStrategy), and with passDeviceSpecs the DeviceSpec of each
	// device node and control device by container path. Answers share these
	// messages: never modify them.
	cdiNames map[string]string
	mounts   map[string]*pluginapi.Mount
	specs    map[string]*pluginapi.DeviceSpec

	mu         sync.Mutex
	grpc       *grpc.Server
	ln         *net.UnixListener
	sockID     identity
	registered identity // kubelet socket registered with; zero when not
	watchers   map[chan struct{}]struct{}

	mpsUp atomic.Bool // an MPS resource's daemon is ready (mps.go)
}

func newServer(p *Plugin, r Resource) *server {
	s := &server{
		p: p, res: r, socket: filepath.Join(p.cfg.Gantry.KubeletDir, r.SocketName()),
		byID: map[string]*Device{}, byUUID: map[string]bool{}, watchers: map[chan struct{}]struct{}{},
	}
	cfg := &p.cfg
	if cfg.Flags.Plugin.DeviceListStrategy.anyCDI() {
		s.cdiNames = map[string]string{}
	}
	if cfg.Flags.Plugin.DeviceListStrategy.Has(ListVolumeMounts) {
		s.mounts = map[string]*pluginapi.Mount{}
	}
	if cfg.Flags.Plugin.PassDeviceSpecs {
		s.specs = map[string]*pluginapi.DeviceSpec{}
		for _, c := range controlDevices {
			s.specs[c] = devSpec(cfg.DevRoot(), c)
		}
	}
	for i := range s.res.Devices {
		d := &s.res.Devices[i]
		s.byID[d.ID] = d
		s.byUUID[d.UUID], s.byUUID[d.GPU] = true, true
		id := d.answerID(cfg)
		if s.cdiNames != nil {
			s.cdiNames[id] = cfg.cdiKind() + "=" + id
		}
		if s.mounts != nil {
			s.mounts[id] = &pluginapi.Mount{HostPath: volumeMountSource, ContainerPath: filepath.Join(volumeMountsRoot, id), ReadOnly: true}
		}
		if s.specs != nil {
			for _, path := range d.Paths {
				s.specs[path] = devSpec(cfg.DevRoot(), path)
			}
		}
	}
	return s
}

func (s *server) uses(uuid string) bool { return s.byUUID[uuid] }

// socketIntact reports whether our socket is still the one we listen on.
func (s *server) socketIntact() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grpc == nil {
		return false
	}
	id, err := fileID(s.socket)
	return err == nil && id == s.sockID
}

// start (re)creates the socket and serves on it; the server must then be
// registered again.
func (s *server) start() error {
	s.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing stale socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("serving %s: %w; check that the kubelet directory exists and is writable", s.res.Name, err)
	}
	// We remove the socket ourselves, only if it is still ours: a closing
	// listener must never unlink a newer socket at the same path.
	ln.SetUnlinkOnClose(false)
	id, err := fileID(s.socket)
	if err != nil {
		ln.Close()
		return err
	}
	g := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(g, s)
	s.grpc, s.ln, s.sockID, s.registered = g, ln, id, identity{}
	go func() {
		if err := g.Serve(ln); err != nil {
			s.p.log.Warn("device plugin server stopped", "resource", s.res.Name, "err", err)
		}
	}()
	s.p.log.Info("serving", "resource", s.res.Name, "socket", s.socket)
	return nil
}

// stop stops serving and removes the socket if it is still ours.
func (s *server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grpc == nil {
		return
	}
	s.grpc.Stop()
	s.ln.Close()
	if id, err := fileID(s.socket); err == nil && id == s.sockID {
		os.Remove(s.socket)
	}
	s.grpc, s.ln, s.registered = nil, nil, identity{}
}

func (s *server) registeredWith() identity {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.registered
}

func (s *server) setRegistered(id identity) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.registered = id
}

func (s *server) markUnregistered() { s.setRegistered(identity{}) }

// notify wakes every ListAndWatch stream of s; a stream that is still busy
// sending picks the latest state up on its next send.
func (s *server) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := range s.watchers {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

func (s *server) subscribe() chan struct{} {
	w := make(chan struct{}, 1)
	s.mu.Lock()
	s.watchers[w] = struct{}{}
	s.mu.Unlock()
	return w
}

func (s *server) unsubscribe(w chan struct{}) {
	s.mu.Lock()
	delete(s.watchers, w)
	s.mu.Unlock()
}
