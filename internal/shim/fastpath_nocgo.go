//go:build !cgo

package shim

// Without cgo there is no constructor and no pass-through fast path; the
// startup time is not known.
func startupMillis() float64 { return 0 }
