package procfs

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The device-cgroup locator: which cgroup decides a process's device
// access, read from /proc/PID/cgroup, and where that cgroup's directory is
// below a hierarchy's mount. nsmount (granting a container its GPU nodes),
// doctor (probing a container's device access) and ctrckpt (listing a
// container's processes) locate cgroups with it, under one rule: a path
// that climbs out of the hierarchy ("..", which the kernel shows for a
// cgroup outside the reader's cgroup namespace) names no directory, since
// cleaning it would name another cgroup; and text that does not read as
// one line per hierarchy (a cgroup name with a newline in it, a line twice)
// names none either.

// ErrCgroupOutside is wrapped by CgroupDir's error for a cgroup path that
// climbs out of the hierarchy (a "..", as /proc/PID/cgroup shows a cgroup
// outside the reader's cgroup namespace), or lies outside the mount's
// root.
var ErrCgroupOutside = errors.New("outside the cgroup hierarchy as mounted here")

// ErrNoDeviceCgroup: /proc/PID/cgroup names neither a v1 devices
// controller nor the unified (v2) hierarchy.
var ErrNoDeviceCgroup = errors.New("no devices controller and no cgroup v2 entry")

// CgroupLine is one line of /proc/PID/cgroup: "ID:CONTROLLERS:PATH",
// "0::PATH" for the unified hierarchy.
type CgroupLine struct {
	ID          int
	Controllers []string // "devices", "cpu", "name=systemd"; none for v2
	Path        string
}

// V2 reports whether l is the unified hierarchy's line.
func (l CgroupLine) V2() bool { return l.ID == 0 && len(l.Controllers) == 0 }

// ParseCgroup reads the text of /proc/PID/cgroup. Every line must be
// "ID:CONTROLLERS:PATH" with a numeric ID and an absolute path (the path
// may hold colons), and no hierarchy ID or controller may come twice: a
// cgroup name with a newline in it would otherwise read as lines of its
// own choosing.
func ParseCgroup(b []byte) ([]CgroupLine, error) {
	var out []CgroupLine
	ids := map[int]bool{}
	ctrls := map[string]bool{}
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if line == "" && len(b) == 0 {
			break
		}
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d (%q) is not ID:CONTROLLERS:PATH", i+1, line)
		}
		id, err := strconv.Atoi(f[0])
		if err != nil || id < 0 || strconv.Itoa(id) != f[0] {
			return nil, fmt.Errorf("line %d (%q): hierarchy ID %q is not a number", i+1, line, f[0])
		}
		if !strings.HasPrefix(f[2], "/") {
			return nil, fmt.Errorf("line %d (%q): the path is not absolute", i+1, line)
		}
		if ids[id] {
			return nil, fmt.Errorf("line %d (%q): hierarchy %d comes twice (a cgroup name with a newline?)", i+1, line, id)
		}
		ids[id] = true
		l := CgroupLine{ID: id, Path: f[2]}
		if f[1] != "" {
			l.Controllers = strings.Split(f[1], ",")
		}
		for _, c := range l.Controllers {
			if c == "" || ctrls[c] {
				return nil, fmt.Errorf("line %d (%q): controller %q is empty or comes twice", i+1, line, c)
			}
			ctrls[c] = true
		}
		out = append(out, l)
	}
	return out, nil
}

// CgroupPath is the path b (/proc/PID/cgroup's text) gives for the
// hierarchy that has controller ("" for the unified hierarchy's "0::"
// line), and whether there is one.
func CgroupPath(b []byte, controller string) (string, bool, error) {
	lines, err := ParseCgroup(b)
	if err != nil {
		return "", false, err
	}
	for _, l := range lines {
		if (controller == "" && l.V2()) || (controller != "" && slices.Contains(l.Controllers, controller)) {
			return l.Path, true, nil
		}
	}
	return "", false, nil
}

// DeviceCgroup is where a process sits in the hierarchy that decides its
// device access: the cgroup v1 devices controller when the host mounts one
// (v1, and the "hybrid" layout that keeps v1 controllers beside an empty
// unified tree), else the unified cgroup v2 tree, whose device rules are
// eBPF programs attached to the cgroup.
type DeviceCgroup struct {
	// V2 is true for the unified hierarchy.
	V2 bool
	// Path is the cgroup's path inside its hierarchy, as /proc/PID/cgroup
	// gives it ("/system.slice/docker-ID.scope").
	Path string
}

func (p DeviceCgroup) String() string {
	if p.V2 {
		return "cgroup v2 " + p.Path
	}
	return "devices cgroup (v1) " + p.Path
}

// ParseDeviceCgroup reads /proc/PID/cgroup's text b for the cgroup that
// decides device access: a v1 line with the devices controller wins over
// the v2 "0::PATH" line (on a hybrid host the unified tree has no device
// controller).
func ParseDeviceCgroup(b []byte) (DeviceCgroup, error) {
	if p, ok, err := CgroupPath(b, "devices"); err != nil || ok {
		return DeviceCgroup{Path: p}, err
	}
	p, ok, err := CgroupPath(b, "")
	if err != nil {
		return DeviceCgroup{}, err
	}
	if !ok {
		return DeviceCgroup{}, ErrNoDeviceCgroup
	}
	return DeviceCgroup{V2: true, Path: p}, nil
}

// ReadDeviceCgroup is ParseDeviceCgroup of pid's entry under proc.
func ReadDeviceCgroup(proc string, pid int) (DeviceCgroup, error) {
	file := filepath.Join(proc, strconv.Itoa(pid), "cgroup")
	b, err := os.ReadFile(file)
	if err != nil {
		return DeviceCgroup{}, err
	}
	p, err := ParseDeviceCgroup(b)
	if err != nil {
		return DeviceCgroup{}, fmt.Errorf("%s: %w", file, err)
	}
	return p, nil
}

// CgroupDir is the directory of cgroup cg (a path as /proc/PID/cgroup
// shows it, relative to the hierarchy's root) below the hierarchy's mount
// at mountPoint, whose root is mountRoot (mountinfo's root field; "/" or
// "" for the whole hierarchy). A path with a ".." in it, or one outside
// mountRoot, is refused (ErrCgroupOutside); so is one with a NUL or a
// newline, which no line of /proc/PID/cgroup holds.
func CgroupDir(mountPoint, mountRoot, cg string) (string, error) {
	if strings.ContainsAny(cg, "\x00\n") {
		return "", fmt.Errorf("cgroup path %q holds a NUL or a newline", cg)
	}
	if slices.Contains(strings.Split(cg, "/"), "..") {
		return "", fmt.Errorf("cgroup %s: %w (it climbs out of the reader's cgroup namespace)", cg, ErrCgroupOutside)
	}
	cg = path.Clean("/" + cg)
	if mountRoot != "/" && mountRoot != "" {
		if cg != mountRoot && !strings.HasPrefix(cg, mountRoot+"/") {
			return "", fmt.Errorf("cgroup %s: %w (the mount at %s shows the hierarchy from %s)", cg, ErrCgroupOutside, mountPoint, mountRoot)
		}
		cg = strings.TrimPrefix(cg, mountRoot)
	}
	return filepath.Join(mountPoint, cg), nil
}
