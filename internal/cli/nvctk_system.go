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
--dev-root (default: --driver-root, default /). A node already right is left
alone; anything else at its path is replaced atomically. With
--load-kernel-modules, modprobe loads nvidia, nvidia-uvm and nvidia-modeset
first (in --driver-root through chroot when it is not /).

  sudo nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules`,
			flags: []nvFlag{
				{names: []string{"root", "driver-root"}, help: "the driver's root, where modules are loaded from (default /)"},
				{names: []string{"dev-root"}, help: "where dev/ is (default: the root)"},
				{names: []string{"control-devices"}, bool: true, help: "create the control device nodes"},
				{names: []string{"load-kernel-modules"}, bool: true, help: "load the NVIDIA kernel modules first"},
				{names: []string{"dry-run"}, bool: true, help: "say what would be done; do nothing"},
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
the control nodes and /dev/nvidiaN for each NVIDIA GPU on the PCI bus, whether
or not the nodes exist yet (MIG capability nodes are not included);
--create-device-nodes makes the control nodes too, and --load-kernel-modules
loads the modules first. NVIDIA's udev rule runs it so:

  sudo nvidia-ctk system create-dev-char-symlinks --create-all`,
			flags: []nvFlag{
				{names: []string{"dev-char-path"}, help: "where the links go (default /dev/char)"},
				{names: []string{"driver-root"}, help: "where dev/nvidia* are searched (default /)"},
				{names: []string{"create-all"}, bool: true, help: "link every possible node, not only existing ones"},
				{names: []string{"load-kernel-modules"}, bool: true, help: "with --create-all: load the NVIDIA kernel modules first"},
				{names: []string{"create-device-nodes"}, bool: true, help: "with --create-all: create the control nodes first"},
				{names: []string{"dry-run"}, bool: true, help: "say what would be done; do nothing"},
			},
			run: runNVCreateDevCharSymlinks,
		},
	)
}

// charMajors reads the character device majors of /proc/devices by name.
func charMajors() (map[string]uint32, error) {
	f, err := os.Open(procDevices)
	if err != nil {
		return nil, fmt.Errorf("reading the device majors: %w", err)
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
	return out, sc.Err()
}

// controlNode is a node to make, by its path under the dev root.
type controlNode struct {
	path         string
	major, minor uint32
}

func controlNodes() ([]controlNode, error) {
	majors, err := charMajors()
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
		{"dev/nvidiactl", nv, nvidiaCtlMinor},
		{"dev/nvidia-modeset", nv, nvidiaModesetMinor},
		{"dev/nvidia-uvm", uvm, uvmMinor},
		{"dev/nvidia-uvm-tools", uvm, uvmToolsMinor},
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
	nodes, err := controlNodes()
	if err != nil {
		return err
	}
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
		if fi, err := r.Lstat(n.path); err == nil {
			st := fi.Sys().(*unix.Stat_t)
			if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == dev {
				continue
			}
		}
		fmt.Fprintf(c.stderr, "%s: mknod %s c %d %d\n", c.name, filepath.Join(devRoot, n.path), n.major, n.minor)
		if dryRun {
			continue
		}
		if err := r.Mknod(n.path, unix.S_IFCHR|0o666, dev); err != nil {
			return err
		}
	}
	return nil
}

func runNVCreateDeviceNodes(c *nvCtx, f nvValues) error {
	root, _ := f.str("root")
	if root == "" {
		root = "/"
	}
	devRoot, _ := f.str("dev-root")
	if devRoot == "" {
		devRoot = root
	}
	dry := f.on("dry-run")
	if f.on("load-kernel-modules") {
		if err := loadModules(c, root, dry); err != nil {
			return err
		}
	}
	if !f.on("control-devices") {
		if !f.on("load-kernel-modules") {
			fmt.Fprintf(c.stderr, "%s: nothing to do: add --control-devices (and --load-kernel-modules)\n", c.name)
		}
		return nil
	}
	return makeControlNodes(c, devRoot, dry)
}

// devCharLink is a /dev/char link to make: its name MAJOR:MINOR and target.
type devCharLink struct{ name, target string }

func runNVCreateDevCharSymlinks(c *nvCtx, f nvValues) error {
	root, _ := f.str("driver-root")
	if root == "" {
		root = "/"
	}
	charDir, _ := f.str("dev-char-path")
	if charDir == "" {
		charDir = "/dev/char"
	}
	dry := f.on("dry-run")
	all := f.on("create-all")
	if !all && (f.on("load-kernel-modules") || f.on("create-device-nodes")) {
		return usagef("--load-kernel-modules and --create-device-nodes apply with --create-all only")
	}
	if all && f.on("load-kernel-modules") {
		if err := loadModules(c, root, dry); err != nil {
			return err
		}
	}
	if all && f.on("create-device-nodes") {
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
	nodes, err := controlNodes()
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
