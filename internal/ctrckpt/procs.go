package ctrckpt

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/procfs"
)

// procRoot and cgroupRoot are where /proc and the cgroup file systems are
// (tests keep the real ones).
const (
	procRoot   = "/proc"
	cgroupRoot = "/sys/fs/cgroup"
)

// cgroupLines reads /proc/PID/cgroup: hierarchy ("0" for cgroup v2, else
// the v1 controllers) to path.
func cgroupLines(pid int) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		key := parts[1]
		if parts[0] == "0" && parts[1] == "" {
			key = "0"
		}
		m[key] = parts[2]
	}
	return m, nil
}

// under reports whether cgroup path p is base or below it.
func under(p, base string) bool {
	return p == base || base == "/" || strings.HasPrefix(p, base+"/")
}

// cgroupDir finds the directory of the container's cgroup (the init
// process's) in a mounted hierarchy: cgroup v2 (unified, or the hybrid
// layout's unified/), else a v1 controller that every process is in.
func cgroupDir(lines map[string]string) (dir, key string, err error) {
	if p, ok := lines["0"]; ok {
		for _, mnt := range []string{cgroupRoot, filepath.Join(cgroupRoot, "unified")} {
			var st unix.Statfs_t
			if unix.Statfs(mnt, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
				d, err := procfs.CgroupDir(mnt, "/", p)
				return d, "0", err
			}
		}
	}
	for _, c := range []string{"pids", "freezer", "memory", "cpu,cpuacct", "devices"} {
		if p, ok := lines[c]; ok {
			d, err := procfs.CgroupDir(filepath.Join(cgroupRoot, c), "/", p)
			if err != nil {
				return "", "", err
			}
			if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
				return d, c, nil
			}
		}
	}
	return "", "", errors.New("no mounted cgroup hierarchy holds it (cgroup v2 at /sys/fs/cgroup or /sys/fs/cgroup/unified, or the v1 pids, freezer or memory controller)")
}

// Processes lists the processes of the container whose init is initPID,
// from its cgroup (and the cgroups below it): never from anything in the
// container's image. Each is checked to belong to the container: its
// cgroup (in the hierarchy read) is the init's or below it, and it shares
// the init's mount namespace, which the host's processes never do. The
// init comes first.
func Processes(initPID int) ([]int, error) {
	lines, err := cgroupLines(initPID)
	if err != nil {
		return nil, fmt.Errorf("reading the cgroup of the container's init process %d: %w", initPID, err)
	}
	dir, key, err := cgroupDir(lines)
	if err != nil {
		return nil, fmt.Errorf("the cgroup of the container's init process %d: %w", initPID, err)
	}
	initNS, err := mountNS(initPID)
	if err != nil {
		return nil, err
	}
	if self, err := mountNS(os.Getpid()); err == nil && self == initNS {
		return nil, fmt.Errorf("the container's init process %d shares this program's mount namespace: not a container of its own", initPID)
	}
	seen := map[int]bool{}
	var pids []int
	walkErr := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // a child cgroup removed meanwhile
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil && n > 0 && !seen[n] {
				seen[n] = true
				pids = append(pids, n)
			}
		}
		return nil
	})
	if walkErr != nil {
		return nil, fmt.Errorf("listing the processes of cgroup %s: %w", dir, walkErr)
	}
	if !seen[initPID] {
		return nil, fmt.Errorf("the container's init process %d is not in its cgroup %s", initPID, dir)
	}
	sort.Ints(pids)
	out := []int{initPID}
	for _, pid := range pids {
		if pid == initPID {
			continue
		}
		l, err := cgroupLines(pid)
		if err != nil {
			continue // exited
		}
		if !under(l[key], lines[key]) {
			return nil, fmt.Errorf("process %d, listed in the container's cgroup, is in cgroup %s, not below %s", pid, l[key], lines[key])
		}
		ns, err := mountNS(pid)
		if err != nil {
			continue
		}
		if ns != initNS {
			return nil, fmt.Errorf("process %d in the container's cgroup is in another mount namespace than the container's init %d: refusing to act on it", pid, initPID)
		}
		out = append(out, pid)
	}
	return out, nil
}

type nsID struct{ dev, ino uint64 }

func mountNS(pid int) (nsID, error) {
	var st unix.Stat_t
	p := filepath.Join(procRoot, strconv.Itoa(pid), "ns", "mnt")
	if err := unix.Stat(p, &st); err != nil {
		return nsID{}, fmt.Errorf("stat %s: %w", p, err)
	}
	return nsID{st.Dev, st.Ino}, nil
}

// CUDAUse is what a process shows of the CUDA driver.
type CUDAUse struct {
	PID int
	// MapsLibcuda: a libcuda.so file is mapped into it.
	MapsLibcuda bool
	// DeviceFiles are its open /dev/nvidia* files.
	DeviceFiles []string
}

// Uses reports whether the process shows any use of the driver.
func (u CUDAUse) Uses() bool { return u.MapsLibcuda || len(u.DeviceFiles) > 0 }

// InspectCUDA reads what process pid shows of the driver: its memory maps
// and open files (kernel data, never the image's).
func InspectCUDA(pid int) (CUDAUse, error) {
	u := CUDAUse{PID: pid}
	base := filepath.Join(procRoot, strconv.Itoa(pid))
	f, err := os.Open(filepath.Join(base, "maps"))
	if err != nil {
		return u, err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		i := bytes.IndexByte(line, '/')
		if i < 0 {
			continue
		}
		if strings.HasPrefix(filepath.Base(string(line[i:])), "libcuda.so") {
			u.MapsLibcuda = true
			break
		}
	}
	f.Close()
	fds, err := os.ReadDir(filepath.Join(base, "fd"))
	if err != nil {
		return u, err
	}
	seen := map[string]bool{}
	for _, fd := range fds {
		t, err := os.Readlink(filepath.Join(base, "fd", fd.Name()))
		if err != nil || !strings.HasPrefix(t, "/dev/nvidia") || seen[t] {
			continue
		}
		seen[t] = true
		u.DeviceFiles = append(u.DeviceFiles, t)
	}
	sort.Strings(u.DeviceFiles)
	return u, nil
}
