package shim

import "github.com/gantry-gpu/gantry/internal/fastpath"

// The pass-through fast path (package fastpath, in C) runs before the Go
// runtime starts in every binary that links this package; it hands the
// subcommands Gantry has nothing to do for, and creates that cannot hold
// a request, straight to the low-level runtime.

// startupMillis is the time since the C constructor ran (0 without cgo).
func startupMillis() float64 { return fastpath.StartupMillis() }
