package nsmount

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/procfs"
)

// maxMountinfo bounds what MountPoints reads of a process's mountinfo.
const maxMountinfo = 4 << 20

// MountPoints returns the container paths of what is mounted at or below
// the root filesystem rootfs, as process pid's mount namespace shows it
// (its /proc/PID/mountinfo, whose mount points are relative to the
// process's root): "/usr/local/nvidia/data" for a mount at
// ROOTFS/usr/local/nvidia/data. The root itself is "/". For
// nvidia-container-cli, which has no config.json to read the container's
// own mounts from.
func MountPoints(pid int, rootfs string) ([]string, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountPoints(io.LimitReader(f, maxMountinfo), rootfs)
}

func parseMountPoints(r io.Reader, rootfs string) ([]string, error) {
	root := path.Clean("/" + rootfs)
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := path.Clean(procfs.UnescapeMountinfo(fields[4]))
		switch {
		case root == "/":
			out = append(out, mp)
		case mp == root:
			out = append(out, "/")
		case strings.HasPrefix(mp, root+"/"):
			out = append(out, strings.TrimPrefix(mp, root))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	return out, nil
}
