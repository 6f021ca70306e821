package driver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// ErrNoDriver is returned by Discover when no NVIDIA driver version can be
// found under the driver root nor on the host.
var ErrNoDriver = errors.New("no NVIDIA driver found")

// hostVersionFiles are the host's own version files, read after the driver
// root's. A variable so tests can point them at files they control (the test
// machine may have a real driver loaded).
var hostVersionFiles = []string{
	"/proc/driver/nvidia/version",
	"/sys/module/nvidia/version",
}

// ParseVersion returns the driver version in the contents of a version
// file: either the kernel module's /proc/driver/nvidia/version, whose first
// line reads like
//
//	NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024
//	NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (...)
//
// or the bare version that /sys/module/nvidia/version holds ("550.54.15\n").
func ParseVersion(b []byte) (string, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	s := strings.TrimSpace(string(line))
	if rest, ok := strings.CutPrefix(s, "NVRM version:"); ok {
		for _, f := range strings.Fields(rest) {
			if IsVersion(f) {
				return f, nil
			}
		}
		return "", fmt.Errorf("no version number on the NVRM line %q", truncate(s, 120))
	}
	if IsVersion(s) {
		return s, nil
	}
	return "", fmt.Errorf("neither an NVRM version line nor a bare version: %q", truncate(s, 120))
}

// IsVersion reports whether s looks like a driver version: two to four
// dot-separated runs of decimal digits ("550.54.15", "390.157").
func IsVersion(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) < 2 || len(parts) > 4 {
		return false
	}
	for _, p := range parts {
		if p == "" || len(p) > 8 {
			return false
		}
		for _, c := range p {
			if c < '0' || c > '9' {
				return false
			}
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// versionFromFiles reads the driver root's /proc version file, then the
// host's. A file that exists but does not parse is an error: it means a
// driver is there and we would otherwise silently pick the wrong files.
func versionFromFiles(root string) (string, string, error) {
	files := []string{filepath.Join(root, "proc/driver/nvidia/version")}
	for _, f := range hostVersionFiles {
		if root == "/" && f == "/proc/driver/nvidia/version" {
			continue // already the root's
		}
		files = append(files, f)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		v, err := ParseVersion(b)
		if err != nil {
			return "", f, fmt.Errorf("reading the driver version from %s: %w", f, err)
		}
		return v, f, nil
	}
	return "", "", nil
}

// noDriverError is the one-line error for a root without a driver.
func noDriverError(root string) error {
	return fmt.Errorf("%w under %s: set driver-root in the Gantry configuration (/etc/gantry/config.toml; --driver-root for gantry and its plugins) to where the driver is installed (e.g. /run/nvidia/driver or /usr/local/nvidia), or, %s", ErrNoDriver, root, gpu.SimulateAdvice)
}

// CurrentVersion returns the driver version a discovery under root would
// use, from the version files alone (root's proc/driver/nvidia/version, then
// the host's /proc/driver/nvidia/version and /sys/module/nvidia/version),
// and the file it came from. It reads one small file: the runtime shim calls
// it on every container create to check that a cached inventory is still the
// running driver's. Both results are empty when no version file exists.
func CurrentVersion(root string) (version, file string, err error) {
	return versionFromFiles(root)
}
