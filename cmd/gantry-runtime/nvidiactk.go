package main

import (
	"fmt"
	"io"
	"os"

	"github.com/gantry-gpu/gantry/internal/cdicmd"
	"github.com/gantry-gpu/gantry/internal/containerhook"
)

// nvidiaCTK is gantry-runtime run as nvidia-ctk: it answers `nvidia-ctk cdi
// generate` and `nvidia-ctk cdi list` itself (package cdicmd: the same
// code, hence the same spec, as the gantry binary's), without the start-up
// cost of the gantry CLI's packages, and hands every other nvidia-ctk
// command line (and --help) to the gantry binary beside it, run as
// nvidia-ctk.
//
// `nvidia-ctk hook ...`, which the CDI specs nvidia-ctk wrote before
// nvidia-cdi-hook existed run as root hooks, often with no env (so, on runc
// before 1.2, with the image's environment), is served here with the
// environment cleared, by the same code as the static gantry-cdi-hook:
// handed to the dynamically linked gantry, the image's LD_PRELOAD would run
// in its loader as host root. Global flags may come first (nvidia-ctk
// --debug hook ...). Whatever else is handed to gantry goes without the
// loader's variables (cdicmd.ExecGantry).
func nvidiaCTK(args []string, stdout, stderr io.Writer) int {
	if i := cdicmd.HookAt(args); i >= 0 {
		os.Clearenv()
		return containerhook.Main(append([]string{"nvidia-ctk hook"}, args[i+1:]...), os.Stdin, stdout, stderr)
	}
	if code, served := cdicmd.Lean(args, stdout, stderr); served {
		return code
	}
	err := cdicmd.ExecGantry("nvidia-ctk", args)
	fmt.Fprintf(stderr, "nvidia-ctk: %v\n", err)
	return 1
}
