// Command gantry is every Gantry front end in one binary. What it does depends
// on the name it is run under (the installer makes the other names symlinks):
//
//	gantry                          the CLI: info, list, cdi, runtime configure, ... (see gantry --help)
//	gantry-runtime                  the runc shim engines register as a runtime
//	nvidia-container-runtime        the same shim under NVIDIA's name
//	nvidia-container-cli            info, list, configure as LXC's nvidia hook runs them
//	gantry-hook                     the OCI prestart hook (Docker's --gpus, hooks.d)
//	nvidia-container-runtime-hook   the same hook under NVIDIA's name
//	nvidia-container-toolkit        the same hook under the name NVIDIA's hooks.d file uses
//	nvidia-ctk                      NVIDIA's nvidia-ctk command lines (runtime configure, cdi, system, config)
//	nvidia-docker                   docker with NV_GPU's GPUs on run/create (nvidia-docker 1.0/2.0)
//	nvidia-docker-plugin            nvidia-docker 1.0's volume plugin and REST API (gantry serve --volume-plugin)
//
// See each front end's --help.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/gantry-gpu/gantry/internal/cdicmd"
	"github.com/gantry-gpu/gantry/internal/cli"
	"github.com/gantry-gpu/gantry/internal/createproto"
	"github.com/gantry-gpu/gantry/internal/createserver"
	"github.com/gantry-gpu/gantry/internal/hook"
	"github.com/gantry-gpu/gantry/internal/nvcli"
	"github.com/gantry-gpu/gantry/internal/nvdocker"
	"github.com/gantry-gpu/gantry/internal/shim"
)

func main() {
	name := filepath.Base(os.Args[0])
	if slices.Contains(hook.Names, name) {
		os.Exit(hook.Main(os.Args[1:], os.Stdin, os.Stderr))
	}
	switch name {
	case "gantry-runtime", "nvidia-container-runtime":
		if len(os.Args) > 1 && os.Args[1] == createproto.ServerFlag {
			os.Exit(createserver.Main(os.Args[2:], os.Stderr))
		}
		os.Exit(shim.Main(os.Args[1:], os.Stderr))
	case "nvidia-container-cli":
		os.Exit(nvcli.Main(os.Args[1:], os.Stdout, os.Stderr))
	case "nvidia-ctk":
		if i := cdicmd.HookAt(os.Args[1:]) + 1; i > 0 && len(os.Args) > i+1 {
			guardHook("nvidia-ctk hook", os.Args[i+1:])
		}
		os.Exit(cli.NVIDIACTKMain(os.Args[1:], os.Stdout, os.Stderr))
	case "nvidia-docker":
		os.Exit(nvdocker.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	case "nvidia-docker-plugin":
		os.Exit(cli.NVIDIADockerPluginMain(os.Args[1:], os.Stdout, os.Stderr))
	}
	if i := cdicmd.HookAt(os.Args[1:]) + 1; i > 0 && len(os.Args) > i+1 {
		guardHook("gantry hook", os.Args[i+1:])
	}
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}

// guardHook refuses a hook run with the dynamic loader's variables, or
// hands it to the static gantry-cdi-hook beside this binary (cli.HookGuard).
func guardHook(prog string, args []string) {
	if err := cli.HookGuard(args[0], args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "%s %s: %v\n", prog, args[0], err)
		os.Exit(1)
	}
}
