package doctor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gantry-gpu/gantry/internal/procfs"
)

// cgroupMounts are the mount points of the two hierarchies device access
// depends on; empty when not mounted.
type cgroupMounts struct {
	Devices string // cgroup v1 with the devices controller
	Unified string // cgroup2
}

// parseCgroupMounts reads a mountinfo file for the cgroup hierarchies. Only
// mounts of a hierarchy's root ("/" as the mount's root field) can reach
// every cgroup by its /proc/PID/cgroup path; a bind of a subtree is skipped.
func parseCgroupMounts(r io.Reader) (cgroupMounts, error) {
	var m cgroupMounts
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(tail) < 1 || fields[3] != "/" {
			continue
		}
		mp := unescapeOctal(fields[4])
		switch tail[0] {
		case "cgroup2":
			if m.Unified == "" {
				m.Unified = mp
			}
		case "cgroup":
			super := ""
			if len(tail) >= 3 {
				super = tail[2]
			}
			if m.Devices == "" && strings.Contains(","+super+",", ",devices,") {
				m.Devices = mp
			}
		}
	}
	return m, sc.Err()
}

// unescapeOctal undoes mountinfo's \ooo escapes (\040 for a space).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			n := 0
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				n = n*8 + int(c-'0')
			}
			if ok && n < 256 {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// hostCgroupMounts reads this process's mount table.
func hostCgroupMounts(proc string) (cgroupMounts, error) {
	f, err := os.Open(filepath.Join(proc, "self", "mountinfo"))
	if err != nil {
		return cgroupMounts{}, err
	}
	defer f.Close()
	return parseCgroupMounts(f)
}

// dir returns the directory of place under the mounted hierarchies.
func (m cgroupMounts) dir(p procfs.DeviceCgroup) (string, error) {
	root := m.Devices
	what := "the cgroup v1 devices controller"
	if p.V2 {
		root, what = m.Unified, "the cgroup v2 hierarchy"
	}
	if root == "" {
		return "", fmt.Errorf("%s is not mounted here (no such cgroup mount in mountinfo)", what)
	}
	// /proc/PID/cgroup shows a cgroup outside the reader's cgroup
	// namespace as a path climbing out of it ("/../../kubepods/..."). It is
	// not under this mount: cleaning the path would name another cgroup.
	d, err := procfs.CgroupDir(root, "/", p.Path)
	if errors.Is(err, procfs.ErrCgroupOutside) {
		return "", fmt.Errorf("%s is outside doctor's cgroup namespace (doctor runs in a container or a cgroup namespace): run doctor on the host, or enter the host's namespaces (nsenter -t 1 -m -C -- gantry doctor ...)", p)
	}
	return d, err
}

// access is what an open of 195:255 from inside a cgroup says about it.
type access int

const (
	// accessAllowed: the open succeeded; the cgroup allows the node and
	// the driver answered.
	accessAllowed access = iota
	// accessNoDriver: ENXIO or ENODEV come from the driver lookup, which
	// runs after the cgroup check: allowed, but no driver is behind the
	// node (a host without a GPU, or the module not loaded).
	accessNoDriver
	// accessRefused: EPERM is the device cgroup (the v1 list or the v2
	// eBPF program) refusing the node.
	accessRefused
	// accessUnknown: anything else (EACCES from a nodev mount or file
	// mode, ENOENT, ...) says nothing about the cgroup.
	accessUnknown
)

// classifyOpen maps the errno of the probe's open to what it means for the
// cgroup; 0 is success.
func classifyOpen(errno syscall.Errno) access {
	switch errno {
	case 0:
		return accessAllowed
	case syscall.ENXIO, syscall.ENODEV:
		return accessNoDriver
	case syscall.EPERM:
		return accessRefused
	default:
		return accessUnknown
	}
}

// devicesListV1 returns the GPU rules ("a *:* rwm" and "c 195:...") of a
// cgroup v1 devices directory's devices.list, or nil and false when it
// cannot be read.
func devicesListV1(dir string) ([]string, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "devices.list"))
	if err != nil {
		return nil, false
	}
	var rules []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(line, "a ") || strings.HasPrefix(line, "c 195:") {
			rules = append(rules, line)
		}
	}
	return rules, true
}
