// Package mpstest builds the stand-in for nvidia-cuda-mps-control that the
// MPS tests of the device plugin and the DRA plugin run (see
// internal/mps/testdata/fakemps). Only tests import it.
package mpstest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
