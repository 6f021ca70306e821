package procfs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseDeviceCgroup(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     DeviceCgroup
		err      bool
	}{
		{name: "v1", in: "12:pids:/docker/abc\n5:devices:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n",
			want: DeviceCgroup{Path: "/docker/abc"}},
		{name: "v1 joined controllers", in: "4:cpu,devices,memory:/kubepods/pod1/c1\n",
			want: DeviceCgroup{Path: "/kubepods/pod1/c1"}},
		{name: "hybrid: devices v1 wins over the unified line", in: "0::/user.slice\n7:devices:/system.slice/docker-1.scope\n",
			want: DeviceCgroup{Path: "/system.slice/docker-1.scope"}},
		{name: "v2", in: "0::/system.slice/docker-0123.scope\n",
			want: DeviceCgroup{V2: true, Path: "/system.slice/docker-0123.scope"}},
		{name: "v2 path with colons", in: "0::/kubepods.slice/cri-containerd:abc.scope\n",
			want: DeviceCgroup{V2: true, Path: "/kubepods.slice/cri-containerd:abc.scope"}},
		{name: "v2 without the last newline", in: "0::/a", want: DeviceCgroup{V2: true, Path: "/a"}},
		{name: "outside the namespace: read as shown, CgroupDir refuses it", in: "0::/../../kubepods/pod1/c1\n",
			want: DeviceCgroup{V2: true, Path: "/../../kubepods/pod1/c1"}},
		{name: "named hierarchy only", in: "1:name=systemd:/x\n", err: true},
		{name: "empty", in: "", err: true},
		// A cgroup named "a\n0::/host.slice" (names may hold a newline):
		// the unified line twice.
		{name: "newline in a v2 name", in: "0::/a\n0::/host.slice\n", err: true},
		// "a\n5:devices:/" on a hybrid host: the devices line twice.
		{name: "newline in a v1 name", in: "5:devices:/a\n5:devices:/\n0::/\n", err: true},
		{name: "a controller twice", in: "5:devices:/a\n6:devices:/b\n", err: true},
		{name: "newline and a line of its own", in: "0::/a\nb\n", err: true},
		{name: "a blank line", in: "0::/a\n\n", err: true},
		{name: "relative path", in: "0::a\n", err: true},
		{name: "ID not a number", in: "x::/a\n", err: true},
		{name: "ID with a sign", in: "+0::/a\n", err: true},
		{name: "empty controller", in: "5:devices,:/a\n", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDeviceCgroup([]byte(tc.in))
			if tc.err {
				if err == nil {
					t.Fatalf("got %+v, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestCgroupPath(t *testing.T) {
	const in = "12:pids:/p\n5:cpu,devices:/d\n1:name=systemd:/s\n0::/u\n"
	for _, tc := range []struct {
		controller, want string
		ok               bool
	}{
		{"devices", "/d", true}, {"cpu", "/d", true}, {"pids", "/p", true},
		{"name=systemd", "/s", true}, {"", "/u", true}, {"memory", "", false},
		{"dev", "", false},
	} {
		got, ok, err := CgroupPath([]byte(in), tc.controller)
		if err != nil || ok != tc.ok || got != tc.want {
			t.Errorf("CgroupPath(%q) = %q, %v, %v; want %q, %v", tc.controller, got, ok, err, tc.want, tc.ok)
		}
	}
	if _, _, err := CgroupPath([]byte("0::/a\n0::/b\n"), "devices"); err == nil {
		t.Error("CgroupPath of text with the unified line twice: no error")
	}
}

// TestCgroupDir: a cgroup path below its hierarchy's mount names its
// directory; one that climbs out of it (".." anywhere, which cleaning
// would turn into another cgroup's path), one outside the mount's root,
// and one with a NUL or a newline name none.
func TestCgroupDir(t *testing.T) {
	for _, tc := range []struct {
		mp, root, cg, want string
		outside            bool
	}{
		{"/sys/fs/cgroup", "/", "/system.slice/a.scope", "/sys/fs/cgroup/system.slice/a.scope", false},
		{"/sys/fs/cgroup", "", "/", "/sys/fs/cgroup", false},
		{"/sys/fs/cgroup", "/", "docker/abc", "/sys/fs/cgroup/docker/abc", false},
		{"/sys/fs/cgroup", "/", "/a/./b//c/", "/sys/fs/cgroup/a/b/c", false},
		{"/sys/fs/cgroup/devices", "/docker", "/docker/abc", "/sys/fs/cgroup/devices/abc", false},
		{"/sys/fs/cgroup/devices", "/docker", "/docker", "/sys/fs/cgroup/devices", false},
		// Climbing out: a cgroup outside the reader's cgroup namespace.
		{"/sys/fs/cgroup", "/", "/../../kubepods/pod1/c1", "", true},
		{"/sys/fs/cgroup", "/", "/..", "", true},
		{"/sys/fs/cgroup", "/", "..", "", true},
		{"/sys/fs/cgroup", "/", "/a/../../etc", "", true},
		{"/sys/fs/cgroup", "/", "/a/..", "", true},
		// Outside the mount's root.
		{"/sys/fs/cgroup/devices", "/docker", "/dockerx/abc", "", true},
		{"/sys/fs/cgroup/devices", "/docker", "/", "", true},
		{"/sys/fs/cgroup/devices", "/docker", "/docker/../etc", "", true},
	} {
		got, err := CgroupDir(tc.mp, tc.root, tc.cg)
		switch {
		case tc.outside && !errors.Is(err, ErrCgroupOutside):
			t.Errorf("CgroupDir(%q, %q, %q) = %q, %v; want ErrCgroupOutside", tc.mp, tc.root, tc.cg, got, err)
		case !tc.outside && (err != nil || got != tc.want):
			t.Errorf("CgroupDir(%q, %q, %q) = %q, %v; want %q", tc.mp, tc.root, tc.cg, got, err, tc.want)
		}
	}
	for _, cg := range []string{"/a\n0::/b", "/a\x00b", "\n"} {
		if got, err := CgroupDir("/sys/fs/cgroup", "/", cg); err == nil {
			t.Errorf("CgroupDir of %q = %q, want an error", cg, got)
		}
	}
}

// TestOwnDeviceCgroup: this process's cgroup, as located, is the
// directory whose cgroup.procs lists it (on a cgroup v2 host, where
// /sys/fs/cgroup is the whole unified hierarchy).
func TestOwnDeviceCgroup(t *testing.T) {
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Skip("no cgroup v2 at /sys/fs/cgroup")
	}
	p, err := ReadDeviceCgroup("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !p.V2 {
		t.Skip("a v1 devices controller beside cgroup v2: " + p.String())
	}
	dir, err := CgroupDir("/sys/fs/cgroup", "/", p.Path)
	if errors.Is(err, ErrCgroupOutside) {
		t.Skipf("in a cgroup namespace: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Fields(string(b)), strconv.Itoa(os.Getpid())) {
		t.Errorf("%s/cgroup.procs does not list this process %d", dir, os.Getpid())
	}
}
