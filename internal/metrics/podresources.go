package metrics

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultPodResourcesSocket is the kubelet's pod-resources endpoint.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Owner is a container that holds a device.
type Owner struct {
	Namespace, Pod, Container string
}

// PodResources asks the kubelet which containers hold which devices.
type PodResources struct {
	conn    *grpc.ClientConn
	client  podresourcesv1.PodResourcesListerClient
	timeout time.Duration
}

// DialPodResources connects (lazily: the kubelet may start later) to the
// pod-resources socket; "" means DefaultPodResourcesSocket.
func DialPodResources(socket string) (*PodResources, error) {
	if socket == "" {
		socket = DefaultPodResourcesSocket
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("pod-resources socket %s: %w", socket, err)
	}
	return &PodResources{conn: conn, client: podresourcesv1.NewPodResourcesListerClient(conn), timeout: 5 * time.Second}, nil
}

// Close closes the connection.
func (p *PodResources) Close() error { return p.conn.Close() }

// Owners lists the kubelet's assignments of nvidia.com/ resources: device ID
// (as the device plugin advertised it) to the containers holding it.
func (p *PodResources) Owners(ctx context.Context) (map[string][]Owner, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	resp, err := p.client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing pod resources: %w", err)
	}
	owners := map[string][]Owner{}
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			o := Owner{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: c.GetName()}
			for _, dev := range c.GetDevices() {
				if !strings.HasPrefix(dev.GetResourceName(), "nvidia.com/") {
					continue
				}
				for _, id := range dev.GetDeviceIds() {
					owners[id] = append(owners[id], o)
				}
			}
		}
	}
	return owners, nil
}
