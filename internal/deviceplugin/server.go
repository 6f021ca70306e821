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
	var ids []string
	seen := map[string]bool{}
	for _, d := range devs {
		id := d.UUID
		if cfg.Flags.Plugin.DeviceIDStrategy == IDIndex {
			id = d.Index
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	r := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	strategies := cfg.Flags.Plugin.DeviceListStrategy
	if strategies.anyCDI() {
		names := make([]string, len(ids))
		for i, id := range ids {
			names[i] = cfg.cdiKind() + "=" + id
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
		for _, id := range ids {
			r.Mounts = append(r.Mounts, &pluginapi.Mount{
				HostPath:      volumeMountSource,
				ContainerPath: filepath.Join(volumeMountsRoot, id),
				ReadOnly:      true,
			})
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
// root, then the device nodes of devs, each once.
func (s *server) deviceSpecs(devs []*Device) []*pluginapi.DeviceSpec {
	root := s.p.cfg.DevRoot()
	paths := make([]string, 0, len(controlDevices)+len(devs))
	for i, p := range controlDevices {
		if s.p.controlPresent(i, root) {
			paths = append(paths, p)
		}
	}
	for _, d := range devs {
		for _, p := range d.Paths {
			if !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		}
	}
	specs := make([]*pluginapi.DeviceSpec, 0, len(paths))
	for _, p := range paths {
		specs = append(specs, &pluginapi.DeviceSpec{ContainerPath: p, HostPath: filepath.Join(root, p), Permissions: "rw"})
	}
	return specs
}

// cdiAnnotationKey is prefix + "nvidia-device-plugin_" + an ID derived from the
// resource and the devices: unique per container and resource as the
// runtime needs (the kubelet merges annotations of several resources), and
// the same for the same request, so answers are reproducible.
func cdiAnnotationKey(prefix, resource string, ids []string) string {
	h := sha256.Sum256([]byte(resource + "\x00" + strings.Join(ids, ",")))
	return prefix + annotationPlugin + "_" + hex.EncodeToString(h[:16])
}

// PreStartContainer is not needed (GetDevicePluginOptions says so); it
// answers empty for kubelets that call it anyway.
func (s *server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
