package nsmount

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/procfs"
)

// cgroupRoot is where cgroup file systems are mounted, as runc assumes.
const cgroupRoot = "/sys/fs/cgroup"

// allowDevices grants the container's cgroup access to nodes.
func allowDevices(pid int, cgPath string, nodes []edits.DeviceNode) error {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil {
		return fmt.Errorf("statfs %s: %w (use --no-cgroups if this host has no cgroups)", cgroupRoot, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return allowV2(pid, cgPath, nodes)
	}
	return allowV1(pid, cgPath, nodes)
}

// rule is the devices.allow line for n: "c 195:0 rwm".
func rule(n edits.DeviceNode) string {
	return fmt.Sprintf("%s %d:%d %s", n.Type, n.Major, n.Minor, n.Permissions)
}

// procCgroup returns the path pid's /proc/PID/cgroup gives for the hierarchy
// that controller is in ("" for the cgroup v2 hierarchy), and whether there
// is such a line.
func procCgroup(pid int, controller string) (string, bool, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return "", false, fmt.Errorf("reading the container's cgroup: %w", err)
	}
	p, ok, err := procfs.CgroupPath(b, controller)
	if err != nil {
		return "", false, fmt.Errorf("the container's cgroup (/proc/%d/cgroup): %w", pid, err)
	}
	return p, ok, nil
}

// v1DevicesMount finds the mount of the v1 hierarchy with the devices
// controller in our mountinfo: its mount point and the root it shows.
func v1DevicesMount() (mountPoint, mroot string, err error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		line := sc.Text()
		i := strings.Index(line, " - ")
		if i < 0 {
			continue
		}
		pre, post := strings.Fields(line[:i]), strings.Fields(line[i+3:])
		if len(pre) < 5 || len(post) < 3 || post[0] != "cgroup" {
			continue
		}
		for _, o := range strings.Split(post[2], ",") {
			if o == "devices" {
				return procfs.UnescapeMountinfo(pre[4]), procfs.UnescapeMountinfo(pre[3]), nil
			}
		}
	}
	return "", "", nil
}

func allowV1(pid int, cgPath string, nodes []edits.DeviceNode) error {
	mp, mroot, err := v1DevicesMount()
	if err != nil {
		return fmt.Errorf("finding the devices cgroup: %w", err)
	}
	if mp == "" {
		// No devices controller mounted: nothing restricts device access.
		return nil
	}
	if cgPath == "" {
		var ok bool
		if cgPath, ok, err = procCgroup(pid, "devices"); err != nil {
			return err
		}
		if !ok {
			return nil
		}
	}
	dir, err := procfs.CgroupDir(mp, mroot, cgPath)
	if err != nil {
		return err
	}
	allow := filepath.Join(dir, "devices.allow")
	f, err := os.OpenFile(allow, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("opening the container's device cgroup: %w (use --no-cgroups to leave device access to the runtime)", err)
	}
	defer f.Close()
	for _, n := range nodes {
		// One rule per write: the kernel parses each write as one rule.
		if _, err := f.WriteString(rule(n)); err != nil {
			return fmt.Errorf("writing %q to %s: %w", rule(n), allow, err)
		}
	}
	return nil
}

func allowV2(pid int, cgPath string, nodes []edits.DeviceNode) error {
	if cgPath == "" {
		var ok bool
		var err error
		if cgPath, ok, err = procCgroup(pid, ""); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("process %d has no cgroup v2 entry in /proc/%d/cgroup", pid, pid)
		}
	}
	dir, err := procfs.CgroupDir(cgroupRoot, "/", cgPath)
	if err != nil {
		return err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the container's cgroup %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if err := allowBPF(fd, nodes); err != nil {
		return fmt.Errorf("device cgroup %s: %w", dir, err)
	}
	return nil
}
