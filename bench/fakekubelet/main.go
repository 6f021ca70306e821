// Command fakekubelet is the kubelet's side of the device plugin API, for
// bench/device-plugin-footprint.sh: enough of a kubelet to drive a device
// plugin and time it, without a cluster.
//
//	fakekubelet serve DIR
//	    serve the Registration service on DIR/kubelet.sock; for each
//	    registration, dial the plugin back, ask for its options and follow
//	    ListAndWatch, as the kubelet does; print "registered RESOURCE N"
//	    (N devices) once the first list arrives
//	fakekubelet allocate SOCKET COUNT
//	    COUNT Allocate calls on the plugin's SOCKET, each for a different
//	    set of 1 to 8 of its devices in a shuffled order; print the p50,
//	    p90 and p99 of the RPC time in microseconds
package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func main() {
	if len(os.Args) < 3 {
		fail("usage: fakekubelet serve DIR | fakekubelet allocate SOCKET COUNT")
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2])
	case "allocate":
		if len(os.Args) != 4 {
			fail("usage: fakekubelet allocate SOCKET COUNT")
		}
		n, err := strconv.Atoi(os.Args[3])
		if err != nil || n < 1 {
			fail("COUNT %q: want a positive number", os.Args[3])
		}
		allocate(os.Args[2], n)
	default:
		fail("unknown command %q: use serve or allocate", os.Args[1])
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "fakekubelet: "+format+"\n", args...)
	os.Exit(2)
}

type registration struct {
	pluginapi.UnimplementedRegistrationServer
	dir string
}

func (r *registration) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	conn, err := dial(filepath.Join(r.dir, req.Endpoint))
	if err != nil {
		return nil, err
	}
	c := pluginapi.NewDevicePluginClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		conn.Close()
		return nil, err
	}
	stream, err := c.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		conn.Close()
		return nil, err
	}
	go func() {
		defer conn.Close()
		first := true
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			if first {
				fmt.Printf("registered %s %d\n", req.ResourceName, len(resp.Devices))
				first = false
			}
		}
	}()
	return &pluginapi.Empty{}, nil
}

func serve(dir string) {
	sock := filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fail("%v", err)
	}
	s := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(s, &registration{dir: dir})
	if err := s.Serve(ln); err != nil {
		fail("%v", err)
	}
}

func dial(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func allocate(sock string, n int) {
	conn, err := dial(sock)
	if err != nil {
		fail("%v", err)
	}
	defer conn.Close()
	c := pluginapi.NewDevicePluginClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		fail("ListAndWatch on %s: %v", sock, err)
	}
	list, err := stream.Recv()
	if err != nil {
		fail("ListAndWatch on %s: %v", sock, err)
	}
	var ids []string
	for _, d := range list.Devices {
		ids = append(ids, d.ID)
	}
	rng := rand.New(rand.NewPCG(1, 1)) // the same requests every run
	times := make([]time.Duration, 0, n)
	for i := range n {
		req := slices.Clone(ids)
		rng.Shuffle(len(req), func(a, b int) { req[a], req[b] = req[b], req[a] })
		req = req[:1+i%min(8, len(req))]
		start := time.Now()
		if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: req}}}); err != nil {
			fail("Allocate %v: %v", req, err)
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	q := func(p int) int64 { return times[(len(times)-1)*p/100].Microseconds() }
	fmt.Printf("allocate n=%d p50_us=%d p90_us=%d p99_us=%d\n", n, q(50), q(90), q(99))
}
