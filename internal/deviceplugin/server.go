package deviceplugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Names of the volume-mount device list contract (request.VolumeMountsRoot on
// the runtime side).
const (
	envVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	volumeMountsRoot  = "/var/run/nvidia-container-devices"
	volumeMountSource = "/dev/null"
	// annotationPlugin is the plugin part of CDI annotation keys
	// (cdi.k8s.io/<plugin>_<id>), NVIDIA's, so tools that look for it find it.
	annotationPlugin = "nvidia-device-plugin"
)

// ResourceHeader is the gRPC response header of GetDevicePluginOptions in
// which the plugin names its resource. It tells `gantry doctor` that this
// socket is served by Gantry's plugin, whose ListAndWatch streams are
// independent of each other, so doctor may open one beside the kubelet's
// (internal/doctor keeps a copy of the name).
const ResourceHeader = "gantry-resource"

// GetDevicePluginOptions says that the kubelet may ask for preferred
// allocations and need not call PreStartContainer.
func (s *server) GetDevicePluginOptions(ctx context.Context, _ *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	// Only fails when the transport is gone, and then the answer is lost too.
	_ = grpc.SetHeader(ctx, metadata.Pairs(ResourceHeader, s.res.Name))
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the device list, then sends it again on every health change.
func (s *server) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	w := s.subscribe()
	defer s.unsubscribe(w)
	for {
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: s.apiDevices()}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-w:
		}
	}
}

// apiDevices is the device list with current health.
func (s *server) apiDevices() []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(s.res.Devices))
	for i := range s.res.Devices {
		d := &s.res.Devices[i]
		h := pluginapi.Healthy
		if !s.p.healthy(d) || !s.mpsAvailable(d) {
			h = pluginapi.Unhealthy
		}
		ad := &pluginapi.Device{ID: d.ID, Health: h}
		if d.NUMANode >= 0 {
			ad.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.NUMANode)}}}
		}
		out = append(out, ad)
	}
	return out
}

// lookup returns the devices of ids, or an InvalidArgument error naming
// every ID that is not a device of this resource.
func (s *server) lookup(ids []string) ([]*Device, error) {
	var unknown []string
	devs := make([]*Device, 0, len(ids))
	for _, id := range ids {
		d, ok := s.byID[id]
		if !ok {
			unknown = append(unknown, id)
			continue
		}
		devs = append(devs, d)
	}
	if len(unknown) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%s: unknown device IDs %s; the plugin advertises %d devices of this resource (see ListAndWatch)",
			s.res.Name, strings.Join(unknown, ", "), len(s.res.Devices))
	}
	return devs, nil
}

// Allocate answers, for each container, how the runtime is told the devices.
func (s *server) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{ContainerResponses: make([]*pluginapi.ContainerAllocateResponse, 0, len(req.ContainerRequests))}
	for _, cr := range req.ContainerRequests {
		devs, err := s.lookup(cr.DevicesIds)
		if err != nil {
			return nil, err
		}
		if len(devs) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "%s: a container request with no device IDs", s.res.Name)
		}
		if err := s.mpsCheck(devs); err != nil {
			return nil, err
		}
		if len(devs) > 1 && s.p.cfg.failRequestsGreaterThanOne() && slices.ContainsFunc(devs, func(d *Device) bool { return d.Replica >= 0 }) {
			_, section := s.p.cfg.replicated()
			return nil, status.Errorf(codes.InvalidArgument,
				"%s: %d shared devices requested, but %s.failRequestsGreaterThanOne allows 1 per container (replicas are shares of a GPU, not more of it)",
				s.res.Name, len(devs), section)
		}
		cresp, err := s.containerResponse(devs)
		if err != nil {
			return nil, err
		}
		s.addIMEX(cresp)
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

// containerResponse builds one container's answer. Replicas map back to
// their device, each device named once, in device order (compareDevices),
// not the kubelet's: the kubelet hands IDs over in no particular order, and
// the same GPUs must give the same variable, mounts, CDI names and
// annotation key every time. devs is sorted in place.
func (s *server) containerResponse(devs []*Device) (*pluginapi.ContainerAllocateResponse, error) {
	slices.SortFunc(devs, compareDevices)
	cfg := &s.p.cfg
	ids := make([]string, 0, len(devs))
	for _, d := range devs {
		// Sorted, the replicas of a device are next to each other.
		if id := d.answerID(cfg); len(ids) == 0 || ids[len(ids)-1] != id {
			ids = append(ids, id)
		}
	}
	r := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	strategies := cfg.Flags.Plugin.DeviceListStrategy
	if strategies.anyCDI() {
		names := make([]string, len(ids))
		for i, id := range ids {
			names[i] = s.cdiNames[id]
		}
		if strategies.Has(ListCDIAnnotations) {
			r.Annotations = map[string]string{cdiAnnotationKey(cfg.Flags.Plugin.CDIAnnotationPrefix, s.res.Name, ids): strings.Join(names, ",")}
		}
		if strategies.Has(ListCDICRI) {
			for _, n := range names {
				r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: n})
			}
		}
	}
	if cfg.Flags.GDRCopyEnabled {
		r.Envs["NVIDIA_GDRCOPY"] = "enabled"
	}
	if cfg.Flags.GDSEnabled {
		r.Envs["NVIDIA_GDS"] = "enabled"
	}
	if cfg.Flags.MOFEDEnabled {
		r.Envs["NVIDIA_MOFED"] = "enabled"
	}
	if s.res.MPS {
		s.addMPS(r, devs)
	}
	if strategies.allCDI() {
		return r, nil
	}
	if strategies.Has(ListEnvVar) {
		r.Envs[envVisibleDevices] = strings.Join(ids, ",")
	}
	if strategies.Has(ListVolumeMounts) {
		// The list lives in the mounts; the variable only points there, so an
		// image's own NVIDIA_VISIBLE_DEVICES is overridden either way.
		r.Envs[envVisibleDevices] = volumeMountsRoot
		// Appended: an MPS client's pipe and shm mounts (addMPS) stay.
		r.Mounts = slices.Grow(r.Mounts, len(ids))
		for _, id := range ids {
			r.Mounts = append(r.Mounts, s.mounts[id])
		}
	}
	if cfg.Flags.Plugin.PassDeviceSpecs {
		r.Devices = s.deviceSpecs(devs)
	}
	return r, nil
}

// controlDevices are the driver's device nodes that every GPU user needs
// besides the GPU's own node: without them a runtime that injects nothing
// (plain runc, CDI off) gives the container a GPU it cannot open. NVIDIA's
// plugin passes the same four with passDeviceSpecs, each only where it
// exists (nvidia-uvm appears once the module is loaded, nvidia-modeset only
// with the modeset module).
var controlDevices = [...]string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}

// deviceSpecs are the control device nodes present under the host's device
// root, then the device nodes of devs, each once (the MIG devices of a GPU
// share its node).
func (s *server) deviceSpecs(devs []*Device) []*pluginapi.DeviceSpec {
	s.p.refreshControl(s.p.cfg.DevRoot())
	specs := make([]*pluginapi.DeviceSpec, 0, len(controlDevices)+len(devs))
	for i, p := range controlDevices {
		if s.p.control[i].Load() {
			specs = append(specs, s.specs[p])
		}
	}
	for _, d := range devs {
		for _, p := range d.Paths {
			if !slices.ContainsFunc(specs, func(sp *pluginapi.DeviceSpec) bool { return sp.ContainerPath == p }) {
				specs = append(specs, s.specs[p])
			}
		}
	}
	return specs
}

// devSpec is the DeviceSpec of the device node at path in the container,
// root+path on the host.
func devSpec(root, path string) *pluginapi.DeviceSpec {
	return &pluginapi.DeviceSpec{ContainerPath: path, HostPath: filepath.Join(root, path), Permissions: "rw"}
}

// answerID is how answers name d: its UUID, or its index with
// deviceIDStrategy index.
func (d *Device) answerID(cfg *Config) string {
	if cfg.Flags.Plugin.DeviceIDStrategy == IDIndex {
		return d.Index
	}
	return d.UUID
}

// cdiAnnotationKey is prefix + "nvidia-device-plugin_" + an ID derived from the
// resource and the devices: unique per container and resource as the
// runtime needs (the kubelet merges annotations of several resources), and
// the same for the same request, so answers are reproducible.
func cdiAnnotationKey(prefix, resource string, ids []string) string {
	n := len(resource) + 1
	for _, id := range ids {
		n += len(id) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, resource...)
	b = append(b, 0)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, id...)
	}
	h := sha256.Sum256(b)
	key := make([]byte, 0, len(prefix)+len(annotationPlugin)+1+hex.EncodedLen(16))
	key = append(key, prefix...)
	key = append(key, annotationPlugin...)
	key = append(key, '_')
	return string(hex.AppendEncode(key, h[:16]))
}

// PreStartContainer is not needed (GetDevicePluginOptions says so); it
// answers empty for kubelets that call it anyway.
func (s *server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
