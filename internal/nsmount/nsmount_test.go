package nsmount

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/edits"
)

// fixture is a bundle with a busybox root and the host files to mount.
type fixture struct {
	runc, bundle, rootfs string
	hostFile, hostDir    string
	socket               string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{runc: needRunc(t)}
	base := t.TempDir()
	f.bundle = filepath.Join(base, "bundle")
	f.rootfs = filepath.Join(f.bundle, "rootfs")
	busyboxRoot(t, f.rootfs)
	host := filepath.Join(base, "host")
	f.hostDir = filepath.Join(host, "drv")
	if err := os.MkdirAll(f.hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	f.hostFile = filepath.Join(host, "libfake.so.1")
	write(t, f.hostFile, "library-from-host\n")
	write(t, filepath.Join(f.hostDir, "firmware.bin"), "dir-from-host\n")
	f.socket = filepath.Join(host, "daemon.sock")
	l, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return f
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// hook returns the prestart hook entry that runs this test binary as a
// hook applying in.
func (f *fixture) hook(t *testing.T, in hookInput) specs.Hook {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(filepath.Dir(f.bundle), "hook-input.json")
	write(t, p, string(b))
	return specs.Hook{Path: self, Args: []string{"nsmount-test-hook"}, Env: []string{hookEnv + "=" + p}}
}

// standardEdits: a read-only file, a read-only directory, a writable socket
// and one device node (195:1, the nvidia major: no driver behind it here, so
// opening it gives ENXIO when the cgroup allows it and EPERM when not).
func (f *fixture) standardEdits() edits.Edits {
	return edits.Edits{
		DeviceNodes: []edits.DeviceNode{{Path: "/dev/nvidia1", Type: "c", Major: 195, Minor: 1, FileMode: 0o666, Permissions: "rwm"}},
		Mounts: []edits.Mount{
			{HostPath: f.hostFile, ContainerPath: "/usr/lib/gantry/libfake.so.1", Options: edits.ReadOnlyOptions},
			{HostPath: f.hostDir, ContainerPath: "/lib/firmware/nvidia/1.0", Options: edits.ReadOnlyOptions},
			{HostPath: f.socket, ContainerPath: "/run/daemon/socket", Options: edits.SocketOptions},
		},
	}
}

// The script the container runs: one "key: result" line per check.
const checkScript = `
echo "lib: $(cat /usr/lib/gantry/libfake.so.1)"
echo "lib-write: $( (echo x > /usr/lib/gantry/libfake.so.1) 2>&1)"
echo "dir: $(cat /lib/firmware/nvidia/1.0/firmware.bin)"
echo "dir-write: $(touch /lib/firmware/nvidia/1.0/new 2>&1)"
test -S /run/daemon/socket && echo "socket: yes"
echo "node: $(stat -c '%F %t:%T %a' /dev/nvidia1 2>&1)"
echo "node-open: $(head -c1 /dev/nvidia1 2>&1)"
mknod /tmp/other c 195 2
echo "other-open: $(head -c1 /tmp/other 2>&1)"
`

func lines(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, ": "); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// A real runc container, edited by a prestart hook that calls Apply: the
// files are there and read-only, the node has the right numbers, and the
// device cgroup lets the container open that node but no other of the same
// major (under cgroup v1 and, where it can be had, v2).
func TestApplyRunc(t *testing.T) {
	for _, mode := range cgroupModes() {
		t.Run("cgroup-"+string(mode), func(t *testing.T) {
			f := newFixture(t)
			writeBundle(t, f.runc, f.bundle, checkScript, nil, []specs.Hook{f.hook(t, hookInput{Edits: f.standardEdits()})})
			out, err := runContainer(t, f.runc, f.bundle, "nsmount-"+string(mode), mode)
			if err != nil {
				t.Fatalf("runc run: %v\n%s", err, out)
			}
			t.Logf("container output:\n%s", out)
			got := lines(out)
			want := map[string]string{
				"lib":        "library-from-host",
				"dir":        "dir-from-host",
				"socket":     "yes",
				"node":       "character special file c3:1 666",
				"node-open":  "No such device or address",
				"other-open": "Operation not permitted",
			}
			for k, v := range want {
				if !strings.Contains(got[k], v) {
					t.Errorf("%s: got %q, want %q\n%s", k, got[k], v, out)
				}
			}
			for _, k := range []string{"lib-write", "dir-write"} {
				if !strings.Contains(got[k], "Read-only file system") {
					t.Errorf("%s: got %q, want a read-only file system error", k, got[k])
				}
			}
			// The targets were made in the image; the host files untouched.
			if b, _ := os.ReadFile(f.hostFile); string(b) != "library-from-host\n" {
				t.Errorf("host file changed: %q", b)
			}
			if _, err := os.Stat(filepath.Join(f.rootfs, "usr/lib/gantry/libfake.so.1")); err != nil {
				t.Errorf("mount target not created in the image: %v", err)
			}
		})
	}
}

// Without the cgroup step the node is there but the device cgroup refuses
// it: what makes it usable is Apply's cgroup change, not runc's defaults.
func TestApplyRuncNoCgroups(t *testing.T) {
	for _, mode := range cgroupModes() {
		t.Run("cgroup-"+string(mode), func(t *testing.T) {
			f := newFixture(t)
			writeBundle(t, f.runc, f.bundle, checkScript, nil, []specs.Hook{f.hook(t, hookInput{Edits: f.standardEdits(), Options: Options{NoCgroups: true}})})
			out, err := runContainer(t, f.runc, f.bundle, "nsmount-nocgroups-"+string(mode), mode)
			if err != nil {
				t.Fatalf("runc run: %v\n%s", err, out)
			}
			got := lines(out)
			if !strings.Contains(got["node"], "c3:1") || !strings.Contains(got["node-open"], "Operation not permitted") {
				t.Errorf("node %q, open %q: want the node present and refused by the cgroup\n%s", got["node"], got["node-open"], out)
			}
		})
	}
}

// Hostile images: a mount target whose directory is a symlink to the host's
// /etc (absolute, or relative with enough ".."), and one whose final name
// is such a link. Everything lands inside the root; the host's /etc gets
// nothing.
func TestApplyRuncSymlinkEscape(t *testing.T) {
	f := newFixture(t)
	name := "gantry-escape-" + strings.ReplaceAll(t.Name(), "/", "-")
	for _, l := range []struct{ link, target string }{
		{"usr/lib/abs", "/etc"},
		{"usr/lib/rel", "../../../../../../../../etc"},
		{"usr/lib/final.so", "/etc/" + name + "-final"},
	} {
		if err := os.Symlink(l.target, filepath.Join(f.rootfs, l.link)); err != nil {
			t.Fatal(err)
		}
	}
	e := edits.Edits{Mounts: []edits.Mount{
		{HostPath: f.hostFile, ContainerPath: "/usr/lib/abs/" + name + "-abs", Options: edits.ReadOnlyOptions},
		{HostPath: f.hostFile, ContainerPath: "/usr/lib/rel/" + name + "-rel", Options: edits.ReadOnlyOptions},
		{HostPath: f.hostFile, ContainerPath: "/usr/lib/final.so", Options: edits.ReadOnlyOptions},
	}}
	script := `for n in abs rel final; do echo "$n: $(cat /etc/` + name + `-$n)"; done`
	writeBundle(t, f.runc, f.bundle, script, nil, []specs.Hook{f.hook(t, hookInput{Edits: e})})
	out, err := runContainer(t, f.runc, f.bundle, "nsmount-escape", cgroupModes()[0])
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	got := lines(out)
	for _, n := range []string{"abs", "rel", "final"} {
		if got[n] != "library-from-host" {
			t.Errorf("%s: /etc/%s-%s in the container reads %q, want the mounted file\n%s", n, name, n, got[n], out)
		}
		if _, err := os.Lstat("/etc/" + name + "-" + n); err == nil {
			os.Remove("/etc/" + name + "-" + n)
			t.Errorf("%s: the hook created /etc/%s-%s on the host", n, name, n)
		}
		if _, err := os.Stat(filepath.Join(f.rootfs, "etc", name+"-"+n)); err != nil {
			t.Errorf("%s: target not made inside the root: %v", n, err)
		}
	}
}

// A target that resolves (inside the root) into the container's /proc is
// refused, and the container does not start.
func TestApplyRuncRefusesProc(t *testing.T) {
	f := newFixture(t)
	if err := os.Symlink("/proc/sys/kernel/core_pattern", filepath.Join(f.rootfs, "usr/lib/libevil.so")); err != nil {
		t.Fatal(err)
	}
	e := edits.Edits{Mounts: []edits.Mount{{HostPath: f.hostFile, ContainerPath: "/usr/lib/libevil.so", Options: edits.ReadOnlyOptions}}}
	writeBundle(t, f.runc, f.bundle, "echo started", nil, []specs.Hook{f.hook(t, hookInput{Edits: e})})
	out, err := runContainer(t, f.runc, f.bundle, "nsmount-proc", cgroupModes()[0])
	if err == nil || strings.Contains(out, "started") {
		t.Fatalf("runc run succeeded; want the hook to refuse the target\n%s", out)
	}
	if !strings.Contains(out, "resolves into /proc") {
		t.Errorf("output does not name the refusal:\n%s", out)
	}
}

// A mount source that does not exist fails before anything is changed.
func TestApplyRuncMissingSource(t *testing.T) {
	f := newFixture(t)
	e := f.standardEdits()
	e.Mounts = append(e.Mounts, edits.Mount{HostPath: "/nonexistent/libnothing.so", ContainerPath: "/usr/lib/libnothing.so", Options: edits.ReadOnlyOptions})
	writeBundle(t, f.runc, f.bundle, "echo started", nil, []specs.Hook{f.hook(t, hookInput{Edits: e})})
	out, err := runContainer(t, f.runc, f.bundle, "nsmount-missing", cgroupModes()[0])
	if err == nil || strings.Contains(out, "started") {
		t.Fatalf("runc run succeeded; want the hook to fail\n%s", out)
	}
	if !strings.Contains(out, "/nonexistent/libnothing.so") {
		t.Errorf("output does not name the missing source:\n%s", out)
	}
	if _, err := os.Lstat(filepath.Join(f.rootfs, "usr/lib/gantry")); err == nil {
		t.Errorf("a mount target was created although the hook failed before mounting")
	}
}

func TestCheckNodes(t *testing.T) {
	for _, n := range []edits.DeviceNode{
		{Path: "/etc/nvidia0", Type: "c", Major: 195},
		{Path: "dev/nvidia0", Type: "c", Major: 195},
		{Path: "/dev/../etc/x", Type: "c", Major: 195},
		{Path: "/dev/nvidia0", Type: "p", Major: 195},
		{Path: "/dev/nvidia0", Type: "c", Major: -1},
		{Path: "/dev/nvidia0", Type: "c", Major: 195, Permissions: "rwx"},
	} {
		if _, err := checkNodes([]edits.DeviceNode{n}); err == nil {
			t.Errorf("checkNodes(%+v) accepted it", n)
		}
	}
	got, err := checkNodes([]edits.DeviceNode{{Path: "/dev/nvidia0", Major: 195}})
	if err != nil || got[0].Type != "c" || got[0].FileMode != 0o666 || got[0].Permissions != "rwm" {
		t.Errorf("defaults: %+v, %v", got, err)
	}
}

func TestMountFlags(t *testing.T) {
	rec, attr, err := mountFlags(edits.ReadOnlyOptions)
	if err != nil || !rec || attr != unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV {
		t.Errorf("ReadOnlyOptions: %v %#x %v", rec, attr, err)
	}
	rec, attr, err = mountFlags(edits.SocketOptions)
	if err != nil || !rec || attr != unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC {
		t.Errorf("SocketOptions: %v %#x %v", rec, attr, err)
	}
	if _, _, err := mountFlags([]string{"bind", "suid"}); err == nil || !strings.Contains(err.Error(), `"suid"`) {
		t.Errorf("unknown option: %v", err)
	}
}

func TestApplyRefusesOwnNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root")
	}
	e := &edits.Edits{Mounts: []edits.Mount{{HostPath: "/etc/hostname", ContainerPath: "/x", Options: edits.ReadOnlyOptions}}}
	err := Apply(os.Getpid(), t.TempDir(), e, Options{NoCgroups: true})
	if err == nil || !strings.Contains(err.Error(), "shares the host's mount namespace") {
		t.Fatalf("Apply into our own namespace: %v", err)
	}
}
