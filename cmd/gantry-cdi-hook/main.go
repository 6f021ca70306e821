// Command gantry-cdi-hook runs the createContainer hooks of the CDI specs
// `gantry cdi generate` writes, with NVIDIA's nvidia-cdi-hook grammar
// (subcommands at top level, whatever name it runs under):
//
//	gantry-cdi-hook create-symlinks --link TARGET::LINK ...
//	gantry-cdi-hook update-ldcache --folder DIR ... [--host-driver-version V]
//	gantry-cdi-hook chmod --mode OCTAL --path PATH ...
//	gantry-cdi-hook enable-cuda-compat --host-driver-version V [--host-cuda-version V]
//	gantry-cdi-hook disable-device-node-modification
//	gantry-cdi-hook update-application-profile
//
// Installed as nvidia-cdi-hook too (make install NVIDIA_NAMES=1), it runs the
// hooks of CDI specs nvidia-ctk wrote; a hook it does not know is a warning
// and exit 0, as with NVIDIA's binary.
//
// A runtime runs these as root, inside the container's mount namespace
// before pivot_root, with the working directory in the image and, when a
// spec gives a hook no env, the image's environment. So the binary is built
// with CGO_ENABLED=0 and statically linked: no dynamic loader runs for it,
// and LD_PRELOAD, LD_LIBRARY_PATH and the like from an image have nothing
// to act on. It links no configuration and no NVML: everything it needs
// comes from its arguments and the container state on stdin (see package
// containerhook). The environment is cleared first, so that nothing below
// can come to depend on it.
package main

import (
	"os"

	"github.com/gantry-gpu/gantry/internal/containerhook"
)

func main() {
	os.Clearenv()
	os.Exit(containerhook.Main(os.Args, os.Stdin, os.Stdout, os.Stderr))
}
