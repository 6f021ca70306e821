package main

import (
	"fmt"
	"io"

	"github.com/gantry-gpu/gantry/internal/cdicmd"
)

// nvidiaCTK is gantry-runtime run as nvidia-ctk: it answers `nvidia-ctk cdi
// generate` and `nvidia-ctk cdi list` itself (package cdicmd: the same
// code, hence the same spec, as the gantry binary's), without the start-up
// cost of the gantry CLI's packages, and hands every other nvidia-ctk
// command line (and --help) to the gantry binary beside it, run as
// nvidia-ctk.
func nvidiaCTK(args []string, stdout, stderr io.Writer) int {
	if code, served := cdicmd.Lean(args, stdout, stderr); served {
		return code
	}
	err := cdicmd.ExecGantry("nvidia-ctk", args)
	fmt.Fprintf(stderr, "nvidia-ctk: %v\n", err)
	return 1
}
