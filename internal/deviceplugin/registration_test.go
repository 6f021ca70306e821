package deviceplugin

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// quiet is how long a test waits to be sure that no further registration
// comes: many times the plugin's resync period in these tests, so that
// every file-system event and periodic check has been handled by then.
const quiet = 400 * time.Millisecond

// countRegistrations counts k's registrations of resource: it waits as
// long as waitFor for the first want of them (a busy machine may take
// seconds to register), then until none more has come for quiet.
func countRegistrations(t *testing.T, k *fakeKubelet, resource string, want int) int {
	t.Helper()
	n := 0
	deadline := time.After(waitFor)
	for {
		idle := time.After(quiet)
		if n < want {
			idle = nil // not yet: only the deadline ends the wait
		}
		select {
		case r := <-k.regs:
			if r.ResourceName == resource {
				n++
			}
		case <-idle:
			return n
		case <-deadline:
			if n < want {
				return n
			}
			t.Fatal("registrations never stopped")
		}
	}
}

// TestRegistersOncePerKubelet restarts the kubelet the ways a node does
// (a clean stop, a crash that leaves kubelet.sock behind, a start that
// empties the directory as the real device manager does, a restart that
// leaves the plugin's socket alone) and counts Register calls on each new
// kubelet.sock: exactly one per resource, whatever order the plugin sees
// the removals, the creation and its periodic check in. A second
// registration leaves the kubelet with two connections to the plugin.
func TestRegistersOncePerKubelet(t *testing.T) {
	const resource = "nvidia.com/gpu"
	// A fast periodic check, so that it races the file-system events.
	h := startHarnessResync(t, "h100x1", DefaultConfig(), 5*time.Millisecond)
	if n := countRegistrations(t, h.kubelet, resource, 1); n != 1 {
		t.Fatalf("first kubelet: %d registrations, want 1", n)
	}
	k := h.kubelet
	for i, restart := range []struct {
		name  string
		stop  func(*fakeKubelet)
		start func(testing.TB, string) *fakeKubelet
	}{
		{"stop, start emptying the directory", (*fakeKubelet).stop, restartKubelet},
		{"crash, start emptying the directory", (*fakeKubelet).crash, restartKubelet},
		{"stop, start leaving the plugin socket", (*fakeKubelet).stop, startKubelet},
		{"crash, start emptying the directory again", (*fakeKubelet).crash, restartKubelet},
		{"stop, start emptying the directory again", (*fakeKubelet).stop, restartKubelet},
	} {
		restart.stop(k)
		k = restart.start(t, h.dir)
		if n := countRegistrations(t, k, resource, 1); n != 1 {
			t.Errorf("restart %d (%s): %d registrations, want 1", i+1, restart.name, n)
		}
		// The registration is a working one.
		if l := k.list(resource); len(l) != 1 {
			t.Errorf("restart %d: list %v", i+1, l)
		}
	}
}

// TestChmodDoesNotReregister changes the mode of kubelet.sock (as a
// security agent or a relabelling may): the same kubelet, so no new
// registration.
func TestChmodDoesNotReregister(t *testing.T) {
	h := startHarnessResync(t, "h100x1", DefaultConfig(), 5*time.Millisecond)
	if n := countRegistrations(t, h.kubelet, "nvidia.com/gpu", 1); n != 1 {
		t.Fatalf("%d registrations, want 1", n)
	}
	for _, mode := range []os.FileMode{0o600, 0o755} {
		if err := os.Chmod(filepath.Join(h.dir, KubeletSocketName), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(h.dir, "nvidia-gpu.sock"), mode); err != nil {
			t.Fatal(err)
		}
	}
	if n := countRegistrations(t, h.kubelet, "nvidia.com/gpu", 0); n != 0 {
		t.Errorf("chmod of the sockets: %d registrations, want 0", n)
	}
}
