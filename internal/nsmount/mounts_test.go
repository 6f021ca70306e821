package nsmount

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParseMountPoints(t *testing.T) {
	const info = `22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:25 / /var/lib/lxc/c1/rootfs rw - ext4 /dev/sda1 rw
31 30 0:26 / /var/lib/lxc/c1/rootfs/usr/local/nvidia/data rw - tmpfs tmpfs rw
32 30 0:27 / /var/lib/lxc/c1/rootfs/mnt/with\040space rw - tmpfs tmpfs rw
33 22 0:28 / /var/lib/lxc/c1/rootfs2/x rw - tmpfs tmpfs rw
`
	got, err := parseMountPoints(strings.NewReader(info), "/var/lib/lxc/c1/rootfs/")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/", "/usr/local/nvidia/data", "/mnt/with space"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q, want %q (a sibling directory sharing the prefix is not inside)", got, want)
	}
}

func TestMountPointsSelf(t *testing.T) {
	got, err := MountPoints(os.Getpid(), "/")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, "/") || !slices.Contains(got, "/proc") {
		t.Fatalf("own mount points %q: want / and /proc", got)
	}
}
