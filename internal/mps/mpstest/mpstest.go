// Package mpstest builds the stand-in for nvidia-cuda-mps-control that the
// MPS tests of the device plugin and the DRA plugin run (see
// internal/mps/testdata/fakemps). Only tests import it.
package mpstest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// BuildFake builds the fake control program into a temporary directory as
// nvidia-cuda-mps-control and returns its path.
func BuildFake(t testing.TB) string {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(self), "..", "testdata", "fakemps")
	bin := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	cmd := exec.Command(goTool, "build", "-o", bin, ".")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the fake MPS control program: %v\n%s", err, out)
	}
	return bin
}

// privateEnv marks a test binary re-run in a mount namespace of its own.
const privateEnv = "GANTRY_TEST_PRIVATE_MOUNTS"

// PrivateMounts runs the rest of a TestMain in a mount namespace of its own
// when root (unshare -m --propagation private, the test binary again with
// its arguments): the MPS daemons' shm (tmpfs mounts) the tests make never
// reach the host's mount table, even when a test dies before its cleanup.
// It returns in the re-run (and when not root, or without unshare); the
// first run exits with the re-run's status.
func PrivateMounts() {
	if os.Getenv(privateEnv) == "1" || os.Geteuid() != 0 {
		return
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return
	}
	cmd := exec.Command(unshare, append([]string{"-m", "--propagation", "private", os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), privateEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.ExitCode())
		}
		fmt.Fprintf(os.Stderr, "re-running the tests in a private mount namespace: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// ShmOptions are the per-mount options, the file system type and the
// super block options of the mount at dir, from /proc/self/mountinfo (the
// last mount there); ok false when nothing is mounted at dir.
func ShmOptions(t testing.TB, dir string) (mountOpts, fsType, superOpts string, ok bool) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, found := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !found || len(f) < 6 || len(g) < 3 || f[4] != dir {
			continue
		}
		mountOpts, fsType, superOpts, ok = f[5], g[0], g[2], true
	}
	return mountOpts, fsType, superOpts, ok
}

// HasOptions reports whether the comma list opts has each of want.
func HasOptions(opts string, want ...string) bool {
	have := strings.Split(opts, ",")
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
