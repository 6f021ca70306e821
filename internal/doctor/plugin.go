package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// pluginResourceHeader is the gRPC response header in which
// gantry-device-plugin names its resource on GetDevicePluginOptions
// (deviceplugin.ResourceHeader; this package may not import deviceplugin,
// which links client-go, so the name is repeated and a test checks both
// against the real plugin). A plugin that sends it is Gantry's, whose
// ListAndWatch serves any number of streams independently.
const pluginResourceHeader = "gantry-resource"

// pluginTimeout bounds each plugin's answer: a plugin answers its
// options and first device list at once, so one that takes longer is hung.
const pluginTimeout = 3 * time.Second

// pluginEndpoint is what one socket in the kubelet's device-plugins
// directory answered.
type pluginEndpoint struct {
	socket string // file name in the directory
	path   string
	// err says why the socket did not answer; nil when it did.
	err error
	// stale is set with err when nothing serves the socket any more.
	stale bool
	// gantry is set when the plugin identified itself as gantry-device-plugin.
	gantry   bool
	resource string // the resource it serves; "" when unknown
	// devices is the first ListAndWatch answer (only asked of Gantry's plugin).
	devices []*pluginapi.Device
	listed  bool
}

// nvidiaSocket reports whether a plugin socket is named as NVIDIA's plugin
// and Gantry's name theirs: nvidia-gpu.sock, nvidia-mig-1g.10gb.sock, and
// nvidia.sock of NVIDIA's plugin before 1.0.
func nvidiaSocket(name string) bool { return strings.HasPrefix(name, "nvidia") }

// resourceFromSocket is the resource NVIDIA's socket naming implies:
// nvidia-<name>.sock serves nvidia.com/<name>.
func resourceFromSocket(name string) string {
	n, ok := strings.CutPrefix(strings.TrimSuffix(name, ".sock"), "nvidia-")
	if !ok || n == "" {
		return ""
	}
	return "nvidia.com/" + n
}

// relevant reports whether doctor reports on this endpoint: Gantry's or
// one named like NVIDIA's; other vendors' plugins are not our business.
func (e *pluginEndpoint) relevant() bool { return e.gantry || nvidiaSocket(e.socket) }

// unhealthy lists the IDs of the devices the plugin reports unhealthy.
func (e *pluginEndpoint) unhealthy() []string {
	var ids []string
	for _, d := range e.devices {
		if d.GetHealth() != pluginapi.Healthy {
			ids = append(ids, d.GetID())
		}
	}
	return ids
}

// healthyIDs is the set of devices the plugin reports healthy.
func (e *pluginEndpoint) healthyIDs() map[string]bool {
	m := map[string]bool{}
	for _, d := range e.devices {
		if d.GetHealth() == pluginapi.Healthy {
			m[d.GetID()] = true
		}
	}
	return m
}

// pluginSockets lists the sockets in dir other than the kubelet's own.
func pluginSockets(dir string) (sockets []string, kubelet bool, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, false, err
	}
	for _, e := range entries {
		if e.Type()&os.ModeSocket == 0 || !strings.HasSuffix(e.Name(), ".sock") {
			continue
		}
		if e.Name() == "kubelet.sock" {
			kubelet = true
		} else {
			sockets = append(sockets, e.Name())
		}
	}
	sort.Strings(sockets)
	return sockets, kubelet, nil
}

// probePlugins asks every plugin socket in dir what the kubelet asks.
func probePlugins(dir string, sockets []string) []*pluginEndpoint {
	out := make([]*pluginEndpoint, len(sockets))
	done := make(chan struct{})
	for i, s := range sockets {
		go func() {
			out[i] = probePlugin(dir, s)
			done <- struct{}{}
		}()
	}
	for range sockets {
		<-done
	}
	return out
}

// probePlugin asks one plugin, as the kubelet does after a registration,
// for its options and, if it is Gantry's, for its first device list.
//
// ListAndWatch is opened only on Gantry's plugin. NVIDIA's k8s-device-plugin
// feeds every stream from one health channel and its handler only returns
// when it fails to send: a stream opened and closed here would leave a
// handler behind that takes the next health event and drops it, so the
// kubelet would never hear that the GPU failed. Gantry's plugin wakes every
// stream on each change and ends a stream when its client goes.
func probePlugin(dir, socket string) *pluginEndpoint {
	e := &pluginEndpoint{socket: socket, path: filepath.Join(dir, socket)}
	// A plain connect first: it tells a socket nobody serves (ECONNREFUSED)
	// from one we may not open, which gRPC reports alike.
	c, err := net.DialTimeout("unix", e.path, pluginTimeout)
	if err != nil {
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			e.stale = true
			e.err = errors.New("connection refused: no process serves this socket any more")
		case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
			e.err = fmt.Errorf("%v: run doctor as root", err)
		default:
			e.err = err
		}
		return e
	}
	c.Close()

	conn, err := grpc.NewClient("unix://"+e.path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.err = err
		return e
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), pluginTimeout)
	// Cancelling ends the ListAndWatch stream: the plugin sees its client
	// leave, as when a kubelet restarts.
	defer cancel()
	client := pluginapi.NewDevicePluginClient(conn)
	var header metadata.MD
	if _, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.Header(&header)); err != nil {
		e.err = rpcError("GetDevicePluginOptions", err)
		return e
	}
	if r := header.Get(pluginResourceHeader); len(r) > 0 {
		e.gantry, e.resource = true, r[0]
	} else {
		e.resource = resourceFromSocket(socket)
		return e
	}
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err == nil {
		var resp *pluginapi.ListAndWatchResponse
		if resp, err = stream.Recv(); err == nil {
			e.devices, e.listed = resp.GetDevices(), true
			return e
		}
	}
	e.err = rpcError("ListAndWatch", err)
	return e
}

func rpcError(method string, err error) error {
	if status.Code(err) == codes.DeadlineExceeded {
		return fmt.Errorf("%s: no answer within %v: the plugin is hung", method, pluginTimeout)
	}
	return fmt.Errorf("%s: %s", method, status.Convert(err).Message())
}
