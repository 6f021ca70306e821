package doctor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/procfs"
)

// The device probe answers "does this container's device cgroup still let
// it open the GPU?" without running anything from the container's image: a
// copy of this binary is started on the host, in the host's namespaces,
// placed in the container's cgroup (cgroup v2: clone3 CLONE_INTO_CGROUP;
// cgroup v1: the devices controller's cgroup.procs), and opens a character
// device 195:255 from a host path. The kernel checks the open against the
// cgroup it runs in (the v1 devices list, or the eBPF program runc or
// systemd attached on v2), so the errno is the container's answer:
// EPERM refused, ENXIO allowed but no driver, success allowed.
//
// The copy is this very executable (/proc/self/exe), told apart by
// probeEnv, which init checks before anything else of this package runs,
// so it works the same from bin/gantry and from a test binary.

// probeEnv carries the node to open to the probe process.
const probeEnv = "GANTRY_DOCTOR_DEVICE_PROBE"

// probeName is the probe's argv[0], which ps shows.
const probeName = "gantry-device-probe"

func init() {
	if node, ok := os.LookupEnv(probeEnv); ok {
		os.Exit(probeChild(node, os.Stdin, os.Stdout))
	}
}

// probeReport is what the probe process writes on stdout.
type probeReport struct {
	// Cgroup is the probe's own /proc/self/cgroup, read just before the
	// open: proof of where the open was checked.
	Cgroup string `json:"cgroup"`
	Errno  int    `json:"errno"`
}

// probeChild is the probe process: it waits until the parent has placed
// it (one byte on stdin), then opens node read-write as NVML opens
// /dev/nvidiactl, closes it at once, and reports.
func probeChild(node string, stdin io.Reader, stdout io.Writer) int {
	var go1 [1]byte
	if _, err := io.ReadFull(stdin, go1[:]); err != nil || go1[0] != 'g' {
		return 2 // the parent gave up before placing us
	}
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// Only ever a 195:255 character device: this hidden entry point opens
	// nothing else, whatever the variable says.
	var st unix.Stat_t
	if err := unix.Stat(node, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR ||
		unix.Major(st.Rdev) != 195 || unix.Minor(st.Rdev) != 255 {
		fmt.Fprintf(os.Stderr, "%s is not the character device 195:255\n", node)
		return 2
	}
	var rep probeReport
	rep.Cgroup = string(cg)
	fd, err := unix.Open(node, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	} else {
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		rep.Errno = int(errno)
	}
	if err := json.NewEncoder(stdout).Encode(rep); err != nil {
		return 2
	}
	return 0
}

// probeResult is one probe's outcome.
type probeResult struct {
	// Node is the host path the probe opened (195:255).
	Node string
	// Place is the cgroup the open was checked in.
	Place procfs.DeviceCgroup
	// Placed says how the probe got there: "clone3 CLONE_INTO_CGROUP" or
	// "cgroup.procs".
	Placed string
	// Errno is the open's error, 0 for success.
	Errno syscall.Errno
	// Rules are the GPU lines of the v1 devices.list (HaveRules false on
	// v2, where the rules are a BPF program, or when unreadable).
	Rules     []string
	HaveRules bool
}

// Access classifies the result.
func (r probeResult) Access() access { return classifyOpen(r.Errno) }

// Errstr is the open's outcome in words.
func (r probeResult) Errstr() string {
	if r.Errno == 0 {
		return "opened"
	}
	return r.Errno.Error()
}

// rulesEvidence is ", devices.list GPU rules: ..." on cgroup v1, "" on v2.
func (r probeResult) rulesEvidence() string {
	if !r.HaveRules {
		return ""
	}
	return ", devices.list GPU rules: " + listOrNone(r.Rules)
}

// probeTimeout bounds one probe; a container's cgroup can be frozen (a
// paused container on cgroup v2) or out of pids, and doctor must not hang.
const probeTimeout = 15 * time.Second

// probeDevice opens 195:255 from inside the device cgroup of process pid
// (read from proc, normally /proc) and returns the outcome. devRoot is
// where the host's /dev/nvidiactl is (the configured dev root); without a
// usable node there one is made in a private temporary directory.
func probeDevice(proc string, pid int, devRoot string) (probeResult, error) {
	target, err := procfs.ReadDeviceCgroup(proc, pid)
	if err != nil {
		return probeResult{}, fmt.Errorf("the container's cgroup: %w", err)
	}
	mounts, err := hostCgroupMounts(proc)
	if err != nil {
		return probeResult{}, fmt.Errorf("reading the cgroup mounts: %w", err)
	}
	dir, err := mounts.dir(target)
	if err != nil {
		return probeResult{}, fmt.Errorf("%s of pid %d: %w", target, pid, err)
	}
	if target.V2 {
		if ev, err := os.ReadFile(filepath.Join(dir, "cgroup.events")); err == nil && bytes.Contains(ev, []byte("frozen 1")) {
			return probeResult{}, fmt.Errorf("%s is frozen (a paused container): unpause it, then run doctor again", target)
		}
	}
	node, cleanup, err := probeNode(devRoot)
	if err != nil {
		return probeResult{}, err
	}
	defer cleanup()

	res := probeResult{Node: node}
	if !target.V2 {
		res.Rules, res.HaveRules = devicesListV1(dir)
	}
	rep, placed, err := runProbe(node, target, dir)
	res.Placed = placed
	if err != nil {
		return res, err
	}
	got, err := procfs.ParseDeviceCgroup([]byte(rep.Cgroup))
	if err != nil || got != target {
		return res, fmt.Errorf("the probe ran in %s, not in the container's %s: report a bug", got, target)
	}
	res.Place, res.Errno = got, syscall.Errno(rep.Errno)
	return res, nil
}

// runProbe starts the probe process, places it in the cgroup directory dir
// and returns its report. On cgroup v2 the process is created in the
// cgroup (clone3 with CLONE_INTO_CGROUP, Linux 5.7); where that is not
// available, and on v1, it is moved there through cgroup.procs before it
// is told to open the node.
func runProbe(node string, target procfs.DeviceCgroup, dir string) (probeReport, string, error) {
	if target.V2 {
		rep, err := startProbe(node, dir, true)
		if !errors.Is(err, errCloneIntoCgroup) {
			return rep, "clone3 CLONE_INTO_CGROUP", err
		}
	}
	rep, err := startProbe(node, dir, false)
	return rep, "cgroup.procs", err
}

var errCloneIntoCgroup = errors.New("clone3 CLONE_INTO_CGROUP failed")

func startProbe(node, dir string, intoCgroup bool) (probeReport, error) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/exe")
	cmd.Args[0] = probeName
	cmd.Env = []string{probeEnv + "=" + node}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return probeReport{}, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if intoCgroup {
		cg, err := os.Open(dir)
		if err != nil {
			return probeReport{}, fmt.Errorf("opening the container's cgroup: %w", err)
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(cg.Fd())
	}
	if err := cmd.Start(); err != nil {
		if intoCgroup {
			return probeReport{}, fmt.Errorf("%w: starting the probe in %s: %v", errCloneIntoCgroup, dir, err)
		}
		return probeReport{}, fmt.Errorf("starting the device probe: %w", err)
	}
	if !intoCgroup {
		procs := filepath.Join(dir, "cgroup.procs")
		if err := os.WriteFile(procs, []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			stdin.Close()
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			why := "doctor needs root for this check"
			switch {
			case errors.Is(err, syscall.EBUSY):
				why = "the cgroup has child cgroups with controllers enabled, so no process may join it"
			case errors.Is(err, syscall.EAGAIN):
				why = "the container is at its pids limit"
			}
			return probeReport{}, fmt.Errorf("moving the probe into the container's cgroup %s: %w (%s)", dir, err, why)
		}
	}
	_, werr := stdin.Write([]byte("g"))
	stdin.Close()
	err = cmd.Wait()
	if ctx.Err() != nil {
		return probeReport{}, fmt.Errorf("the device probe in %s did not finish within %v (is the container's cgroup frozen or out of memory?)", dir, probeTimeout)
	}
	if err != nil || werr != nil {
		if err == nil {
			err = werr
		}
		return probeReport{}, fmt.Errorf("the device probe in %s failed: %v: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	var rep probeReport
	if err := json.NewDecoder(bufio.NewReader(&stdout)).Decode(&rep); err != nil {
		return probeReport{}, fmt.Errorf("the device probe's report: %v: %q", err, stdout.String())
	}
	return rep, nil
}

// probeNode returns the host path of a character device 195:255 for the
// probe to open: the dev root's /dev/nvidiactl when it is that node on a
// file system that allows device nodes, else a node made in a private
// temporary directory (a host without the driver, such as CI). cleanup
// removes what was made.
func probeNode(devRoot string) (string, func(), error) {
	if f, err := driver.StatDevice(devRoot, "/dev/nvidiactl"); err == nil && f.Major == 195 && f.Minor == 255 && !nodev(filepath.Dir(f.HostPath)) {
		return f.HostPath, func() {}, nil
	}
	var tried []string
	for _, base := range []string{os.TempDir(), "/run", "/var/tmp"} {
		if nodev(base) {
			tried = append(tried, base+" is mounted nodev")
			continue
		}
		dir, err := os.MkdirTemp(base, "gantry-probe-")
		if err != nil {
			tried = append(tried, err.Error())
			continue
		}
		node := filepath.Join(dir, "nvidiactl")
		if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(195, 255))); err != nil {
			os.RemoveAll(dir)
			tried = append(tried, fmt.Sprintf("mknod %s: %v", node, err))
			continue
		}
		return node, func() { os.RemoveAll(dir) }, nil
	}
	return "", nil, fmt.Errorf("no /dev/nvidiactl (195:255) under %s to probe with, and none could be made (%s): run doctor as root, or create the node (nvidia-modprobe -c=0)",
		devRoot, strings.Join(tried, "; "))
}

// nodev reports whether dir's file system refuses device nodes.
func nodev(dir string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false
	}
	return st.Flags&unix.ST_NODEV != 0
}
