// Command gantry-dra-plugin is Gantry's Kubernetes Dynamic Resource
// Allocation kubelet plugin: it publishes the node's GPUs and MIG devices
// as ResourceSlices and prepares claims with one CDI spec each. See
// `gantry-dra-plugin --help` and internal/draplugin.
//
// It is a binary of its own, beside gantry-device-plugin: it links
// client-go and the kubeletplugin library, which the device plugin (plain
// HTTPS through internal/kubeapi) does not pay for.
package main

import (
	"os"

	"github.com/gantry-gpu/gantry/internal/draplugin"
)

func main() {
	// A run of this binary as the MPS daemons' launcher (see
	// internal/draplugin/launch.go) does not return.
	draplugin.LaunchMain()
	os.Exit(draplugin.Main(os.Args[1:], os.Stdout, os.Stderr))
}
