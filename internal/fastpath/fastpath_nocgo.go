//go:build !cgo

package fastpath

// Enabled is whether this build has the C fast path (cgo).
const Enabled = false

// StartupMillis is 0 without cgo: there is no constructor, and the
// start-up time is not known.
func StartupMillis() float64 { return 0 }

// RestoreAffinity does nothing without cgo: no constructor narrowed it.
func RestoreAffinity() error { return nil }
