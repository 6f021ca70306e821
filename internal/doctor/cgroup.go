package doctor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// cgroupPlace is where a process sits in the hierarchy that decides its
// device access: the cgroup v1 devices controller when the host mounts one
// (v1, and the "hybrid" layout that keeps v1 controllers beside an empty
// unified tree), else the unified cgroup v2 tree, whose device rules are
// eBPF programs attached to the cgroup.
type cgroupPlace struct {
	// V2 is true for the unified hierarchy.
	V2 bool
	// Path is the cgroup's path inside its hierarchy, as /proc/PID/cgroup
	// gives it ("/system.slice/docker-ID.scope").
	Path string
}

func (p cgroupPlace) String() string {
	if p.V2 {
		return "cgroup v2 " + p.Path
	}
	return "devices cgroup (v1) " + p.Path
}

// errNoDeviceCgroup: /proc/PID/cgroup names neither a v1 devices
// controller nor a unified hierarchy.
var errNoDeviceCgroup = errors.New("no devices controller and no cgroup v2 entry")

// parseProcCgroup reads /proc/PID/cgroup ("ID:CONTROLLERS:PATH" lines). A
// v1 line whose controller list has "devices" wins over the v2 "0::PATH"
// line: on a hybrid host the unified tree has no device controller.
func parseProcCgroup(r io.Reader) (cgroupPlace, error) {
	var unified *cgroupPlace
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case strings.Contains(","+parts[1]+",", ",devices,"):
			return cgroupPlace{Path: parts[2]}, nil
		case parts[0] == "0" && parts[1] == "":
			unified = &cgroupPlace{V2: true, Path: parts[2]}
		}
	}
	if err := sc.Err(); err != nil {
		return cgroupPlace{}, err
	}
	if unified == nil {
		return cgroupPlace{}, errNoDeviceCgroup
	}
	return *unified, nil
}

// processCgroup is parseProcCgroup of pid's entry under proc.
func processCgroup(proc string, pid int) (cgroupPlace, error) {
	file := filepath.Join(proc, fmt.Sprint(pid), "cgroup")
	f, err := os.Open(file)
	if err != nil {
		return cgroupPlace{}, err
	}
	defer f.Close()
	p, err := parseProcCgroup(f)
	if err != nil {
		return cgroupPlace{}, fmt.Errorf("%s: %w", file, err)
	}
	return p, nil
}

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
func (m cgroupMounts) dir(p cgroupPlace) (string, error) {
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
	if slices.Contains(strings.Split(p.Path, "/"), "..") {
		return "", fmt.Errorf("%s is outside doctor's cgroup namespace (doctor runs in a container or a cgroup namespace): run doctor on the host, or enter the host's namespaces (nsenter -t 1 -m -C -- gantry doctor ...)", p)
	}
	return filepath.Join(root, filepath.Clean("/"+p.Path)), nil
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
