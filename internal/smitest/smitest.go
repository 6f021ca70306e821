// Package smitest reads nvidia-smi's GPU-by-GPU matrices (topo -m,
// topo -p2p r) for the tests that compare Gantry's view of a real host with
// nvidia-smi's. Only tests import it.
package smitest

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

var (
	gpuRE = regexp.MustCompile(`^GPU[0-9]+$`)
	// Some versions underline the header with escape codes even into a pipe.
	escRE = regexp.MustCompile("\x1b\\[[0-9;]*m")
)

// Matrix runs nvidia-smi with args and returns its GPU-by-GPU matrix, row i
// column j for GPUs i and j; nil (logged) without nvidia-smi.
func Matrix(t *testing.T, args ...string) [][]string {
	t.Helper()
	out, err := exec.Command("nvidia-smi", args...).Output()
	if err != nil {
		t.Logf("nvidia-smi %s: %v: not compared", strings.Join(args, " "), err)
		return nil
	}
	return Parse(string(out))
}

// Parse reads the matrix out of nvidia-smi's output: the header row starts
// with GPU0, each GPU's row with GPUn.
func Parse(out string) [][]string {
	n := -1
	var m [][]string
	for _, line := range strings.Split(escRE.ReplaceAllString(out, ""), "\n") {
		f := strings.Fields(line)
		if n < 0 && len(f) > 0 && f[0] == "GPU0" {
			n = 0
			for _, h := range f {
				if gpuRE.MatchString(h) {
					n++
				}
			}
			continue
		}
		if n > 0 && len(f) > n && gpuRE.MatchString(f[0]) {
			m = append(m, f[1:1+n])
		}
	}
	return m
}

// At is m[i][j], or "?" outside the matrix.
func At(m [][]string, i, j int) string {
	if i < len(m) && j < len(m[i]) {
		return m[i][j]
	}
	return "?"
}
