// Command containerd-shim-runc-v2 is containerd v2.4.2's runc shim, built
// from the release's own packages for the test cluster (test/cluster). It is
// a binary of its own, not a case of gantry-k8s, because one shim process
// lives beside every pod: it must stay small.
package main

import (
	"context"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task/plugin"
	"github.com/containerd/containerd/v2/pkg/shim"
)

func main() {
	shim.RunShim(context.Background(), manager.NewShimManager("io.containerd.runc.v2"))
}
