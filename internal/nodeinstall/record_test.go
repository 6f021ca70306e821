package nodeinstall

import (
	"os"
	"path/filepath"
	"testing"
)

// TestHostPathResolvesInRoot: a host path through the host's links
// (/var/run -> /run, absolute; etc/x -> ../real, relative) lands inside
// the host root, never at the same path of the process's own /; a path
// not there yet keeps its remaining components.
func TestHostPathResolvesInRoot(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"run", "real", "var"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.Symlink("/run", filepath.Join(root, "var/run"))
	os.Symlink("../real", filepath.Join(root, "var/x"))
	os.Symlink("/../../../run", filepath.Join(root, "var/up"))
	o := &Options{HostRoot: root}
	for in, want := range map[string]string{
		"/var/run/cdi/gantry.yaml": "/run/cdi/gantry.yaml",
		"/var/x/y":                 "/real/y",
		"/var/up/z":                "/run/z",
		"/etc/containerd/a.toml":   "/etc/containerd/a.toml",
		"/var/../run":              "/run",
	} {
		if got := o.host(in); got != filepath.Join(root, want) {
			t.Errorf("host(%s) = %s, want %s", in, got, filepath.Join(root, want))
		}
	}
	// A link itself (a binary's NVIDIA name, to remove) is not followed.
	os.Symlink("gantry-runtime", filepath.Join(root, "real/nvidia-ctk"))
	if got, want := o.hostEntry("/var/x/nvidia-ctk"), filepath.Join(root, "real/nvidia-ctk"); got != want {
		t.Errorf("hostEntry = %s, want %s", got, want)
	}
	if got := (&Options{HostRoot: "/"}).host("/var/run/x"); got != "/var/run/x" {
		t.Errorf("with / as the host root: %s", got)
	}
}
