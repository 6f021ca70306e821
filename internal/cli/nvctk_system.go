package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// nvidia-ctk system: the device nodes the driver's own nvidia-modprobe
// would make, and the /dev/char/MAJOR:MINOR links systemd keeps for every
// character device it knows. Nodes made outside udev (by the driver, or by
// create-device-nodes) get no /dev/char link; runc (through systemd's
// cgroup driver) names devices by those links when a unit is reloaded, and
// without them a "systemctl daemon-reload" cuts running containers off their
// GPUs ("Failed to initialize NVML: Unknown Error"). create-dev-char-symlinks
// is NVIDIA's lasting fix, usually run from a udev rule.

// Where the kernel lists character device majors and PCI devices; tests
// point them at files of their own.
var (
	procDevices   = "/proc/devices"
	sysPCIDevices = "/sys/bus/pci/devices"
	// procDriver holds nvidia-caps/mig-minors (every MIG capability the
	// driver can grant, with its minor) and nvidia/capabilities/ (one
	// access file per capability that exists now, with the node's mode).
	procDriver = "/proc/driver"
)

// The fixed minors of the nvidia major's control nodes, and the uvm ones.
const (
	nvidiaCtlMinor     = 255
	nvidiaModesetMinor = 254
	uvmMinor           = 0
	uvmToolsMinor      = 1
)

func init() {
	nvCommands = append(nvCommands,
		&nvCommand{
			words:   "system create-device-nodes",
			summary: "create the driver's control device nodes (nvidiactl, nvidia-modeset, nvidia-uvm, nvidia-uvm-tools)",
			help: `With --control-devices, makes /dev/nvidiactl and /dev/nvidia-modeset (the nvidia
major, minors 255 and 254), /dev/nvidia-uvm and /dev/nvidia-uvm-tools (the
nvidia-uvm major from /proc/devices, minors 0 and 1), mode 0666, under
--dev-root (default: --driver-root, default /), and on a MIG-capable driver
(/proc/driver/nvidia-caps/mig-minors) the MIG config and monitor capability
nodes /dev/nvidia-caps/nvidia-capN. --mig-devices (Gantry's) makes the
capability nodes of each GPU and compute instance that exists now (those
/proc/driver/nvidia/capabilities lists), which containers given MIG devices
need and which Gantry, unlike nvidia-container-cli, does not make on demand;
run it after creating instances (nvidia-smi mig -cgi ... -C). Modes are the
driver's (DeviceFileMode). The majors are read from --driver-root's
proc/devices when it has one (a driver container's or a simulated root),
else from the host's /proc/devices. A node already right is left alone; anything else
at its path is replaced atomically. With --load-kernel-modules, modprobe loads
nvidia, nvidia-uvm and nvidia-modeset first (in --driver-root through chroot
when it is not /).

  sudo nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules
  sudo nvidia-ctk system create-device-nodes --mig-devices`,
			flags: []nvFlag{
				{Names: []string{"root", "driver-root"}, Help: "the driver's root, where modules are loaded from (default /)"},
				{Names: []string{"dev-root"}, Help: "where dev/ is (default: the root)"},
				{Names: []string{"control-devices"}, Bool: true, Help: "create the control device nodes (and the MIG config and monitor capability nodes)"},
				{Names: []string{"mig-devices"}, Bool: true, Help: "Gantry's: create the capability nodes of the existing MIG GPU and compute instances"},
				{Names: []string{"load-kernel-modules"}, Bool: true, Help: "load the NVIDIA kernel modules first"},
				{Names: []string{"dry-run"}, Bool: true, Help: "say what would be done; do nothing"},
			},
			run: runNVCreateDeviceNodes,
		},
		&nvCommand{
			words:   "system create-dev-char-symlinks",
			summary: "create the /dev/char/MAJOR:MINOR links of the NVIDIA device nodes",
			help: `Links /dev/char/MAJOR:MINOR (--dev-char-path) to each NVIDIA character device
node under --driver-root's dev/ (nvidia*, nvidia-caps/nvidia-cap*; not
nvidia-fs*, nvidia-nvswitch*, nvidia-nvlink*), as systemd does for the devices
udev knows. systemd's device cgroup rules name devices by these links: without
them a "systemctl daemon-reload" on a host using the systemd cgroup driver
takes running containers' GPUs away ("Failed to initialize NVML: Unknown
Error"). A link already there is left alone.

With --create-all, links are made for every node the loaded driver can have:
the control nodes, /dev/nvidiaN for each NVIDIA GPU on the PCI bus and, on a
MIG-capable driver, every MIG capability node of those GPUs that
/proc/driver/nvidia-caps/mig-minors lists (config, monitor, each possible GPU
and compute instance), whether or not the nodes exist yet;
--create-device-nodes makes the control nodes too, and --load-kernel-modules
loads the modules first. NVIDIA's udev rule runs it so:

  sudo nvidia-ctk system create-dev-char-symlinks --create-all`,
			flags: []nvFlag{
				{Names: []string{"dev-char-path"}, Help: "where the links go (default /dev/char)"},
				{Names: []string{"driver-root"}, Help: "where dev/nvidia* are searched (default /)"},
				{Names: []string{"create-all"}, Bool: true, Help: "link every possible node, not only existing ones"},
				{Names: []string{"load-kernel-modules"}, Bool: true, Help: "with --create-all: load the NVIDIA kernel modules first"},
				{Names: []string{"create-device-nodes"}, Bool: true, Help: "with --create-all: create the control nodes first"},
				{Names: []string{"dry-run"}, Bool: true, Help: "say what would be done; do nothing"},
			},
			run: runNVCreateDevCharSymlinks,
		},
	)
}

// charMajors reads the character device majors of /proc/devices by name:
// the driver root's proc/devices when it has one (a driver container's
// root, or a fake root made by gantry sim driver-root), as doctor reads
// them, else the host's.
func charMajors(root string) (map[string]uint32, string, error) {
	file := procDevices
	if root != "" && filepath.Clean(root) != "/" {
		if _, err := os.Stat(filepath.Join(root, "proc/devices")); err == nil {
			file = filepath.Join(root, "proc/devices")
		}
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, file, fmt.Errorf("reading the device majors: %w", err)
	}
	defer f.Close()
	out := map[string]uint32{}
	sc := bufio.NewScanner(f)
	inChar := false
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "Character devices:":
			inChar = true
			continue
		case strings.HasSuffix(l, "devices:"):
			inChar = false
			continue
		}
		num, name, ok := strings.Cut(l, " ")
		if !inChar || !ok {
			continue
		}
		if n, err := strconv.ParseUint(num, 10, 32); err == nil {
			out[strings.TrimSpace(name)] = uint32(n)
		}
	}
	return out, file, sc.Err()
}

// controlNode is a node to make, by its path under the dev root.
type controlNode struct {
	path         string
	major, minor uint32
	mode         uint32 // permission bits
}

func controlNodes(root string) ([]controlNode, error) {
	majors, procDevices, err := charMajors(root)
	if err != nil {
		return nil, err
	}
	nv, ok := majors["nvidia-frontend"]
	if !ok {
		nv, ok = majors["nvidia"]
	}
	if !ok {
		return nil, fmt.Errorf("%s lists no nvidia major: the NVIDIA driver is not loaded (add --load-kernel-modules, or modprobe nvidia)", procDevices)
	}
	uvm, ok := majors["nvidia-uvm"]
	if !ok {
		return nil, fmt.Errorf("%s lists no nvidia-uvm major: the nvidia-uvm module is not loaded (add --load-kernel-modules, or modprobe nvidia-uvm)", procDevices)
	}
	return []controlNode{
		{"dev/nvidiactl", nv, nvidiaCtlMinor, 0o666},
		{"dev/nvidia-modeset", nv, nvidiaModesetMinor, 0o666},
		{"dev/nvidia-uvm", uvm, uvmMinor, 0o666},
		{"dev/nvidia-uvm-tools", uvm, uvmToolsMinor, 0o666},
	}, nil
}

func loadModules(c *nvCtx, root string, dryRun bool) error {
	for _, m := range []string{"nvidia", "nvidia-uvm", "nvidia-modeset"} {
		args := []string{"modprobe", m}
		if root != "" && filepath.Clean(root) != "/" {
			args = append([]string{"chroot", root}, args...)
		}
		fmt.Fprintf(c.stderr, "%s: %s\n", c.name, strings.Join(args, " "))
		if dryRun {
			continue
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

func makeControlNodes(c *nvCtx, devRoot string, dryRun bool) error {
	nodes, err := controlNodes(devRoot)
	if err != nil {
		return err
	}
	caps, err := migCapNodes(devRoot, true, false, -1)
	if err != nil {
		return err
	}
	return makeNodes(c, devRoot, append(nodes, caps...), dryRun)
}

// makeNodes makes each node under devRoot, leaving one already right alone.
func makeNodes(c *nvCtx, devRoot string, nodes []controlNode, dryRun bool) error {
	if !dryRun {
		if err := os.MkdirAll(devRoot, 0o755); err != nil {
			return fmt.Errorf("--dev-root: %w", err)
		}
	}
	r, err := rootfs.Open(devRoot)
	if err != nil {
		return fmt.Errorf("--dev-root: %w", err)
	}
	defer r.Close()
	for _, n := range nodes {
		dev := unix.Mkdev(n.major, n.minor)
		mode := n.mode
		if fi, err := r.Lstat(n.path); err == nil {
			st := fi.Sys().(*unix.Stat_t)
			if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == dev && st.Mode&0o7777 == mode {
				continue
			}
		}
		fmt.Fprintf(c.stderr, "%s: mknod -m %o %s c %d %d\n", c.name, mode, filepath.Join(devRoot, n.path), n.major, n.minor)
		if dryRun {
			continue
		}
		if err := r.Mknod(n.path, unix.S_IFCHR|mode, dev); err != nil {
			return err
		}
	}
	return nil
}

// readMIGMinors reads procDriver's nvidia-caps/mig-minors: capability
// name (config, monitor, gpuN/giM/access, gpuN/giM/ciK/access) -> minor of
// /dev/nvidia-caps/nvidia-cap<minor>. Nil without the file (no MIG-capable
// driver loaded).
func readMIGMinors() (map[string]uint32, error) {
	p := filepath.Join(procDriver, "nvidia-caps", "mig-minors")
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the MIG capability minors: %w", err)
	}
	defer f.Close()
	out := map[string]uint32{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, num, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 32)
		if err != nil || migCapProcPath(name) == "" {
			continue
		}
		out[name] = uint32(n)
	}
	return out, sc.Err()
}

// migCapProcPath is the access file of a MIG capability under
// procDriver/nvidia/capabilities ("" for a name that is none):
// config -> mig/config, gpu0/gi1/access -> gpu0/mig/gi1/access.
func migCapProcPath(name string) string {
	if name == "config" || name == "monitor" {
		return filepath.Join(procDriver, "nvidia", "capabilities", "mig", name)
	}
	var gpu, gi, ci int
	if n, _ := fmt.Sscanf(name, "gpu%d/gi%d/ci%d/access", &gpu, &gi, &ci); n == 3 && name == fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpu, gi, ci) {
		return filepath.Join(procDriver, "nvidia", "capabilities", fmt.Sprintf("gpu%d/mig/gi%d/ci%d/access", gpu, gi, ci))
	}
	if n, _ := fmt.Sscanf(name, "gpu%d/gi%d/access", &gpu, &gi); n == 2 && name == fmt.Sprintf("gpu%d/gi%d/access", gpu, gi) {
		return filepath.Join(procDriver, "nvidia", "capabilities", fmt.Sprintf("gpu%d/mig/gi%d/access", gpu, gi))
	}
	return ""
}

// migCapGPU is the GPU index of a gpuN/... capability, -1 for config and
// monitor.
func migCapGPU(name string) int {
	var gpu int
	if n, _ := fmt.Sscanf(name, "gpu%d/", &gpu); n == 1 {
		return gpu
	}
	return -1
}

// migCapNodes lists /dev/nvidia-caps nodes from mig-minors: with control,
// config and monitor; with instances, each GPU and compute instance's node, for
// the instances that exist now (their access file is in
// /proc/driver/nvidia/capabilities) or, with gpus >= 0, every one the
// driver can have on GPUs 0..gpus-1 (create-dev-char-symlinks --create-all).
// The mode is the access file's DeviceFileMode, as nvidia-modprobe sets it
// (default 0400 for config and monitor, 0444 for instances). None without
// mig-minors.
func migCapNodes(root string, control, instances bool, gpus int) ([]controlNode, error) {
	minors, err := readMIGMinors()
	if err != nil || minors == nil {
		return nil, err
	}
	majors, procDevices, err := charMajors(root)
	if err != nil {
		return nil, err
	}
	major, ok := majors["nvidia-caps"]
	if !ok {
		return nil, fmt.Errorf("%s lists MIG capabilities but %s no nvidia-caps major: the NVIDIA driver is half loaded (reload it: modprobe -r nvidia && modprobe nvidia)", filepath.Join(procDriver, "nvidia-caps", "mig-minors"), procDevices)
	}
	names := make([]string, 0, len(minors))
	for n := range minors {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return minors[names[i]] < minors[names[j]] })
	var out []controlNode
	for _, name := range names {
		gpu := migCapGPU(name)
		if gpu >= 0 && !instances || gpu < 0 && !control || gpus >= 0 && gpu >= gpus {
			continue
		}
		mode := uint32(0o444)
		if gpu < 0 {
			mode = 0o400
		}
		b, err := os.ReadFile(migCapProcPath(name))
		switch {
		case err == nil:
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(l), "DeviceFileMode:"); ok {
					if m, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil && m <= 0o777 {
						mode = uint32(m)
					}
				}
			}
		case gpu >= 0 && gpus < 0:
			continue // an instance that does not exist now
		}
		out = append(out, controlNode{path: fmt.Sprintf("dev/nvidia-caps/nvidia-cap%d", minors[name]), major: major, minor: minors[name], mode: mode})
	}
	return out, nil
}

func runNVCreateDeviceNodes(c *nvCtx, f nvValues) error {
	root, _ := f.Str("root")
	if root == "" {
		root = "/"
	}
	devRoot, _ := f.Str("dev-root")
	if devRoot == "" {
		devRoot = root
	}
	dry := f.On("dry-run")
	if f.On("load-kernel-modules") {
		if err := loadModules(c, root, dry); err != nil {
			return err
		}
	}
	if !f.On("control-devices") && !f.On("mig-devices") {
		if !f.On("load-kernel-modules") {
			fmt.Fprintf(c.stderr, "%s: nothing to do: add --control-devices (and --load-kernel-modules)\n", c.name)
		}
		return nil
	}
	var nodes []controlNode
	if f.On("control-devices") {
		ctl, err := controlNodes(root)
		if err != nil {
			return err
		}
		nodes = append(nodes, ctl...)
	}
	caps, err := migCapNodes(root, f.On("control-devices"), f.On("mig-devices"), -1)
	if err != nil {
		return err
	}
	return makeNodes(c, devRoot, append(nodes, caps...), dry)
}

// devCharLink is a /dev/char link to make: its name MAJOR:MINOR and target.
type devCharLink struct{ name, target string }

func runNVCreateDevCharSymlinks(c *nvCtx, f nvValues) error {
	root, _ := f.Str("driver-root")
	if root == "" {
		root = "/"
	}
	charDir, _ := f.Str("dev-char-path")
	if charDir == "" {
		charDir = "/dev/char"
	}
	dry := f.On("dry-run")
	all := f.On("create-all")
	if !all && (f.On("load-kernel-modules") || f.On("create-device-nodes")) {
		return usagef("--load-kernel-modules and --create-device-nodes apply with --create-all only")
	}
	if all && f.On("load-kernel-modules") {
		if err := loadModules(c, root, dry); err != nil {
			return err
		}
	}
	if all && f.On("create-device-nodes") {
		if err := makeControlNodes(c, root, dry); err != nil {
			return err
		}
	}
	var links []devCharLink
	var err error
	if all {
		links, err = allDevCharLinks(root)
	} else {
		links, err = existingDevCharLinks(root)
	}
	if err != nil {
		return err
	}
	if len(links) == 0 {
		fmt.Fprintf(c.stderr, "%s: no NVIDIA device nodes under %s\n", c.name, filepath.Join(root, "dev"))
		return nil
	}
	if !dry {
		if err := os.MkdirAll(charDir, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", charDir, err)
		}
	}
	for _, l := range links {
		p := filepath.Join(charDir, l.name)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		fmt.Fprintf(c.stderr, "%s: %s -> %s\n", c.name, p, l.target)
		if dry {
			continue
		}
		if err := os.Symlink(l.target, p); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating %s: %w", p, err)
		}
	}
	return nil
}

// existingDevCharLinks lists the NVIDIA character devices under root/dev.
func existingDevCharLinks(root string) ([]devCharLink, error) {
	var paths []string
	for _, pat := range []string{"dev/nvidia*", "dev/nvidia-caps/nvidia-*"} {
		m, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil {
			return nil, err
		}
		paths = append(paths, m...)
	}
	sort.Strings(paths)
	var out []devCharLink
	for _, p := range paths {
		base := path.Base(p)
		if strings.HasPrefix(base, "nvidia-fs") || strings.HasPrefix(base, "nvidia-nvswitch") || strings.HasPrefix(base, "nvidia-nvlink") {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
			continue
		}
		out = append(out, devCharLink{fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)), p})
	}
	return out, nil
}

// allDevCharLinks lists the control nodes and a node per NVIDIA GPU on the
// PCI bus, existing or not.
func allDevCharLinks(root string) ([]devCharLink, error) {
	nodes, err := controlNodes(root)
	if err != nil {
		return nil, err
	}
	gpus, err := pciGPUCount()
	if err != nil {
		return nil, err
	}
	var out []devCharLink
	for _, n := range nodes {
		out = append(out, devCharLink{fmt.Sprintf("%d:%d", n.major, n.minor), filepath.Join(root, n.path)})
	}
	nv := nodes[0].major
	for i := 0; i < gpus; i++ {
		out = append(out, devCharLink{fmt.Sprintf("%d:%d", nv, i), filepath.Join(root, "dev", fmt.Sprintf("nvidia%d", i))})
	}
	caps, err := migCapNodes(root, true, true, gpus)
	if err != nil {
		return nil, err
	}
	for _, n := range caps {
		out = append(out, devCharLink{fmt.Sprintf("%d:%d", n.major, n.minor), filepath.Join(root, n.path)})
	}
	return out, nil
}

// pciGPUCount counts the NVIDIA display and 3D controllers on the PCI bus.
func pciGPUCount() (int, error) {
	ents, err := os.ReadDir(sysPCIDevices)
	if err != nil {
		return 0, fmt.Errorf("listing PCI devices: %w", err)
	}
	n := 0
	for _, e := range ents {
		vendor, _ := os.ReadFile(filepath.Join(sysPCIDevices, e.Name(), "vendor"))
		class, _ := os.ReadFile(filepath.Join(sysPCIDevices, e.Name(), "class"))
		c := strings.TrimSpace(string(class))
		if strings.TrimSpace(string(vendor)) == "0x10de" && (strings.HasPrefix(c, "0x0300") || strings.HasPrefix(c, "0x0302")) {
			n++
		}
	}
	return n, nil
}
