// Command gantry-runtime holds the front ends that run on every container
// start, in a binary that links only what they need (no HTTP server, no CLI,
// no Kubernetes client), so that each call starts as fast as a Go program can:
//
//	gantry-runtime, nvidia-container-runtime   the runc shim engines register
//	                                           (see gantry-runtime --help)
//	gantry-hook, nvidia-container-runtime-hook the OCI prestart hook Docker's
//	                                           --gpus runs (see gantry-hook --help);
//	nvidia-container-toolkit                   the name NVIDIA's hooks.d file runs it by
//	nvidia-container-cli                       what LXC's nvidia hook runs for every
//	                                           container (info, list, configure)
//	nvidia-ctk                                 cdi generate and cdi list; every other
//	                                           command runs the gantry binary beside
//	                                           it (nvidiactk.go)
//
// `make install` links the names to it. The gantry binary answers to the
// same names too, for installs that link everything to gantry.
//
// The Makefile builds it statically with the nonvml tag (see RUNTIME_TAGS):
// it links no NVML and, when it needs NVML's answer, runs the gantry beside
// it (package discover's HelperCommand).
package main

import (
	"os"
	"path/filepath"
	"slices"

	"github.com/gantry-gpu/gantry/internal/createproto"
	"github.com/gantry-gpu/gantry/internal/createserver"
	"github.com/gantry-gpu/gantry/internal/hook"
	"github.com/gantry-gpu/gantry/internal/nvcli"
	"github.com/gantry-gpu/gantry/internal/shim"
)

func main() {
	name := filepath.Base(os.Args[0])
	if slices.Contains(hook.Names, name) {
		os.Exit(hook.Main(os.Args[1:], os.Stdin, os.Stderr))
	}
	switch name {
	case "nvidia-container-cli":
		os.Exit(nvcli.Main(os.Args[1:], os.Stdout, os.Stderr))
	case "nvidia-ctk":
		os.Exit(nvidiaCTK(os.Args[1:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == createproto.ServerFlag {
		os.Exit(createserver.Main(os.Args[2:], os.Stderr))
	}
	os.Exit(shim.Main(os.Args[1:], os.Stderr))
}
