package driver

import "testing"

// SetHostVersionFiles points Discover at test-controlled host version files
// for the duration of t, so a loaded driver on the test machine does not
// leak into tests of driver roots. Tests using it must not run in parallel.
func SetHostVersionFiles(t testing.TB, files ...string) {
	old := hostVersionFiles
	hostVersionFiles = files
	t.Cleanup(func() { hostVersionFiles = old })
}
