// Command gantry-device-plugin offers the node's NVIDIA GPUs to the kubelet
// as Kubernetes resources (nvidia.com/gpu, MIG resources, time-sliced
// replicas), with health, topology-aware allocation, GPU Feature Discovery
// labels and Prometheus metrics. See `gantry-device-plugin --help`.
//
// It is a binary of its own, not a name of the gantry binary: it links gRPC
// and the Prometheus libraries, whose start-up cost the container-create
// path (gantry-runtime) must not pay. It talks to the API server through
// internal/kubeapi (plain HTTPS), not client-go: bench/device-plugin-footprint.sh
// keeps its size and memory in check.
package main

import (
	"os"

	"github.com/gantry-gpu/gantry/internal/deviceplugin"
	"github.com/gantry-gpu/gantry/internal/mps"
)

func main() {
	// A run of this binary as the MPS daemons' launcher (internal/mps,
	// launch.go) does not return.
	mps.LaunchMain()
	os.Exit(deviceplugin.Main(os.Args[1:], os.Stdout, os.Stderr))
}
