package nvdocker

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// fakeProcDevices points checkNode at a /proc/devices naming the fake
// driver's nvidia-uvm major.
func fakeProcDevices(t *testing.T) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "devices")
	if err := os.WriteFile(p, []byte("Character devices:\n  1 mem\n195 nvidia-frontend\n511 nvidia-uvm\n\nBlock devices:\n  8 sd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := procDevices
	procDevices = p
	t.Cleanup(func() { procDevices = old })
}

// A --device host path the plugin gives must be a character device of
// NVIDIA's (major 195, nvidia-uvm's from /proc/devices) in directories only
// root may write to: docker follows a link there and grants the device,
// so a node under a directory another user controls, a link to /dev/null
// (or /dev/sda), a node of another major, or a regular file is refused.
// Review of sec1: any clean host directory was taken as a dev root.
func TestCheckArgsHostNodes(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: mknod")
	}
	fakeProcDevices(t)
	root := t.TempDir()
	dev := filepath.Join(root, "dev")
	if err := os.Mkdir(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	mknod := func(name string, major, minor uint32) {
		if err := unix.Mknod(filepath.Join(dev, name), unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
			t.Fatal(err)
		}
	}
	mknod("nvidiactl", fakedriver.NvidiaMajor, 255)
	mknod("nvidia0", fakedriver.NvidiaMajor, 0)
	mknod("nvidia-uvm", fakedriver.UVMMajor, 0)
	mknod("nvidia1", 1, 3) // /dev/null's
	mknod("nvidia-uvm-tools", fakedriver.NvidiaMajor, 1)
	if err := os.Symlink("/dev/null", filepath.Join(dev, "nvidia2")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dev, "nvidia3"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	args := func(devs ...string) []string {
		w := []string{"--volume-driver=nvidia-docker", "--volume=nvidia_driver_580.159.04:/usr/local/nvidia:ro"}
		for _, d := range devs {
			w = append(w, "--device="+root+d+":"+d)
		}
		return w
	}
	roots := []string{root}
	if err := CheckArgs(args("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia7"), roots); err != nil {
		t.Errorf("NVIDIA's nodes (and one missing): %v", err)
	}
	for _, tc := range []struct{ dev, err string }{
		{"/dev/nvidia1", "character device 1:3"},
		{"/dev/nvidia2", "character device 1:3"},
		{"/dev/nvidia3", "not a character device"},
		{"/dev/nvidia-uvm-tools", "nvidia-uvm driver's (major 511"},
	} {
		if err := CheckArgs(args("/dev/nvidiactl", tc.dev), roots); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.dev, err, tc.err)
		}
	}
	if err := CheckArgs(args("/dev/nvidia0"), []string{"/run/nvidia/driver"}); err == nil || !strings.Contains(err.Error(), "not /dev nor a dev root") {
		t.Errorf("a dev root not configured: %v", err)
	}
	// A dev root another user may write to (they could swap a node for a link).
	if err := os.Chown(dev, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := CheckArgs(args("/dev/nvidia0"), roots); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Errorf("a dev directory of nobody's: %v", err)
	}
}

// The socket's directories are judged with links resolved: a root-owned
// name that links into a directory another user owns is that directory.
// Review of sec1: the walk followed the names, so only the link's own
// parents were checked.
func TestTrustedResolvesLinks(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: chown")
	}
	base := t.TempDir()
	users := filepath.Join(base, "users")
	sub := filepath.Join(users, "plugins")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(users, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(sub, "nvidia-docker.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	link := filepath.Join(base, "run")
	if err := os.Symlink(sub, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(sub, "nvidia-docker.sock"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := trusted(filepath.Join(link, "nvidia-docker.sock")); err == nil || !strings.Contains(err.Error(), users) {
		t.Errorf("a socket under a link into a directory of nobody's: %v", err)
	}
	if err := os.Chown(users, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := trusted(filepath.Join(link, "nvidia-docker.sock")); err != nil {
		t.Errorf("all root's: %v", err)
	}
}
