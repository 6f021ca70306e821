package containerhook

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// The hooks below are those NVIDIA's nvidia-cdi-hook (Container Toolkit 1.20)
// has besides create-symlinks and update-ldcache, under the same names and
// flags, so that a CDI spec written by nvidia-ctk runs unchanged once
// nvidia-cdi-hook is Gantry's binary. Each resolves every container path
// inside the container root (package rootfs): the image is hostile.

func init() {
	Commands = append(Commands, chmodCommand, cudaCompatCommand, disableModifyCommand, appProfileCommand, noopCommand)
}

var chmodCommand = &Command{
	Name:    "chmod",
	Summary: "set the mode of files or directories inside the container",
	Usage:   "--mode OCTAL --path PATH [--path ...]",
	Help: `Run by the container runtime as a createContainer hook, with the container
state on stdin. Sets the mode of each --path (a container path, e.g. /dev/dri)
to --mode (octal, e.g. 755), as NVIDIA's chmod hook does. Paths are resolved
inside the container's root: a symlink in the image leads to a place in the
root, never to a host file. A path missing from the container is skipped; so is
one the kernel refuses to change (a read-only bind mount of the host's /dev).`,
	Flags: func(fs *flag.FlagSet) func([]string, io.Reader, func(string)) error {
		var paths repeated
		fs.Var(&paths, "path", "container path whose mode to set (repeatable)")
		modeStr := fs.String("mode", "", "the mode, in octal (e.g. 755)")
		return func(args []string, in io.Reader, warn func(string)) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			if strings.TrimSpace(*modeStr) == "" {
				return usagef("need --mode (octal, e.g. 755)")
			}
			mode, err := strconv.ParseUint(*modeStr, 8, 32)
			if err != nil || mode > 0o7777 {
				return usagef("--mode %q: want an octal mode from 0 to 7777", *modeStr)
			}
			for _, p := range paths {
				if strings.TrimSpace(p) == "" || strings.ContainsRune(p, 0) {
					return usagef("--path %q: want a container path", p)
				}
			}
			if len(paths) == 0 {
				return nil
			}
			root, err := OpenRoot(in)
			if err != nil {
				return err
			}
			defer root.Close()
			return Chmod(root, paths, uint32(mode), warn)
		}
	},
}

// Chmod sets the mode of each container path in paths to mode. Missing paths
// and permission refusals are skipped (with a warning for the latter), as
// NVIDIA's hook skips them; other errors fail the container.
func Chmod(root *rootfs.Root, paths []string, mode uint32, warn func(string)) error {
	for _, p := range paths {
		err := root.Chmod(p, mode)
		switch {
		case err == nil:
		case errors.Is(err, fs.ErrNotExist):
		case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
			if warn != nil {
				warn(fmt.Sprintf("chmod %s: %v (left as it is)", p, err))
			}
		default:
			return err
		}
	}
	return nil
}

// CompatConfPrefix starts the names of the ld.so.conf.d files
// enable-cuda-compat writes ("00-compat-*.conf", NVIDIA's pattern: "00-" sorts
// them before the image's own files). update-ldcache reads them back, for it
// builds the cache itself instead of running the image's ldconfig.
const CompatConfPrefix = "00-compat-"

var cudaCompatCommand = &Command{
	Name:    "enable-cuda-compat", // edits.HookEnableCUDACompat
	Summary: "put the image's CUDA forward-compatibility libraries ahead of the host driver's",
	Usage:   "--host-driver-version V [--host-cuda-version V] [--cuda-compat-container-root DIR]",
	Help: `Run by the container runtime as a createContainer hook, with the container
state on stdin, before update-ldcache. When the image's CUDA forward
compatibility directory (--cuda-compat-container-root, /usr/local/cuda/compat)
holds exactly one libcuda.so.X.Y[.Z] and that library is to be used on this
host, writes /etc/ld.so.conf.d/00-compat-<hash>.conf naming the directory;
update-ldcache then puts its libraries first. The decision is NVIDIA's:

  - the library's .note.cuda.fwd_compatibility ELF note, when it has one,
    lists the driver branches it supports: it is used when the host driver's
    major version is listed and the library is newer than the host driver;
    without --host-driver-version, when the note's CUDA version is newer than
    --host-cuda-version;
  - without the note, it is used when its major version is greater than the
    host driver's (and never when only --host-cuda-version is given).

With neither version given the hook does nothing. Everything is read inside
the container's root.`,
	Flags: func(fs *flag.FlagSet) func([]string, io.Reader, func(string)) error {
		hostDriver := fs.String("host-driver-version", "", "the host driver's version, e.g. 570.124.06")
		hostCUDA := fs.String("host-cuda-version", "", "the CUDA version the host driver supports, e.g. 12.8")
		dir := fs.String("cuda-compat-container-root", CompatDir, "container directory of the CUDA compat libraries")
		return func(args []string, in io.Reader, warn func(string)) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			if !path.IsAbs(*dir) || strings.ContainsAny(*dir, "\x00\n") {
				return usagef("--cuda-compat-container-root %q: want an absolute container path", *dir)
			}
			if *hostDriver == "" && *hostCUDA == "" {
				return nil
			}
			root, err := OpenRoot(in)
			if err != nil {
				return err
			}
			defer root.Close()
			_, err = EnableCUDACompat(root, path.Clean(*dir), *hostDriver, *hostCUDA, warn)
			return err
		}
	},
}

// EnableCUDACompat decides whether the compat libraries in dir (a container
// path) are to be used with the host's driver and CUDA versions (see the
// hook's help) and, if so, writes the ld.so.conf.d file naming dir. It
// returns that file's container path, or "" when nothing was written.
func EnableCUDACompat(root *rootfs.Root, dir, hostDriver, hostCUDA string, warn func(string)) (string, error) {
	if warn == nil {
		warn = func(string) {}
	}
	names, err := root.ReadDirMax(dir, 4096)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return "", nil
	}
	if errors.Is(err, rootfs.ErrTooLarge) {
		warn(fmt.Sprintf("%s is not a CUDA compat directory (%v); not used", dir, err))
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("listing the container's %s: %w", dir, err)
	}
	var libs []string
	for _, n := range names {
		if v, ok := strings.CutPrefix(n, "libcuda.so."); ok && strings.Contains(v, ".") {
			libs = append(libs, n)
		}
	}
	if len(libs) == 0 {
		return "", nil
	}
	if len(libs) != 1 {
		warn(fmt.Sprintf("%s holds %d libcuda.so.X.Y files %v (want one); not used", dir, len(libs), libs))
		return "", nil
	}
	lib := path.Join(dir, libs[0])
	compatVersion := strings.TrimPrefix(libs[0], "libcuda.so.")
	note, err := readCompatNote(root, lib)
	if err != nil {
		warn(fmt.Sprintf("%s: %v; deciding by version numbers", lib, err))
	}
	if !useCompat(note, compatVersion, hostDriver, hostCUDA) {
		return "", nil
	}
	const confDir = "/etc/ld.so.conf.d"
	if err := root.MkdirAll(confDir, 0o755); err != nil {
		return "", fmt.Errorf("creating the container's %s: %w", confDir, err)
	}
	// A name fixed by the directory: a restarted container rewrites its
	// file instead of collecting one per start.
	sum := sha256.Sum256([]byte(dir))
	conf := path.Join(confDir, CompatConfPrefix+hex.EncodeToString(sum[:4])+".conf")
	if err := root.WriteFileAtomic(conf, []byte(dir+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("writing the container's %s: %w", conf, err)
	}
	return conf, nil
}

// useCompat is NVIDIA's rule (see the enable-cuda-compat help).
func useCompat(note *compatNote, compatVersion, hostDriver, hostCUDA string) bool {
	compat, cerr := parseVersion(compatVersion)
	host, herr := parseVersion(hostDriver)
	if note != nil {
		if cerr != nil || herr != nil {
			cuda, err := parseVersion(hostCUDA)
			if err != nil || note.CUDAVersion == "" {
				return false
			}
			want, err := parseVersion(note.CUDAVersion)
			return err == nil && compareVersions(want, cuda) > 0
		}
		listed := false
		for _, d := range note.Driver {
			listed = listed || d == host[0]
		}
		return listed && compareVersions(compat, host) > 0
	}
	if hostCUDA != "" || cerr != nil || herr != nil {
		return false
	}
	return compat[0] > host[0]
}

// parseVersion reads a dotted version (580.159.04, 12.8) into its numbers.
func parseVersion(v string) ([]int, error) {
	if v == "" {
		return nil, errors.New("empty version")
	}
	var out []int
	for _, f := range strings.Split(v, ".") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("version %q: %q is not a number", v, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// compareVersions compares two parsed versions number by number, missing
// numbers counting as 0.
func compareVersions(a, b []int) int {
	for i := 0; i < len(a) || i < len(b); i++ {
		var x, y int
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

// compatConfDirs returns the directories the container's
// /etc/ld.so.conf.d/00-compat-*.conf files (enable-cuda-compat's) name.
func compatConfDirs(root *rootfs.Root) ([]string, error) {
	const confDir = "/etc/ld.so.conf.d"
	names, err := root.ReadDirMax(confDir, 4096)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, rootfs.ErrTooLarge) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the container's %s: %w", confDir, err)
	}
	var dirs []string
	for _, n := range names {
		if !strings.HasPrefix(n, CompatConfPrefix) || !strings.HasSuffix(n, ".conf") {
			continue
		}
		b, err := root.ReadFileMax(path.Join(confDir, n), 4096)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			l = strings.TrimSpace(l)
			if path.IsAbs(l) && !strings.ContainsRune(l, 0) {
				dirs = append(dirs, path.Clean(l))
			}
		}
	}
	return dirs, nil
}

// ParamsFile is the driver's parameter file. With ModifyDeviceFiles: 1 there,
// the CUDA driver in a container creates or fixes /dev/nvidia* nodes itself,
// which a container must not do.
const ParamsFile = "/proc/driver/nvidia/params"

var disableModifyCommand = &Command{
	Name:    "disable-device-node-modification",
	Summary: "show the container a driver params file with ModifyDeviceFiles: 0",
	Usage:   "",
	Help: `Run by the container runtime as a createContainer hook, with the container
state on stdin (in the container's mount namespace). When the host's
/proc/driver/nvidia/params says ModifyDeviceFiles: 1, mounts over the
container's /proc/driver/nvidia/params a read-only copy saying
ModifyDeviceFiles: 0, so that the CUDA driver inside does not create or change
device nodes. The copy lives on a small tmpfs of its own; nothing is written to
the image. Without the host file (no driver) or with ModifyDeviceFiles already
0, it does nothing.`,
	Flags: func(fs *flag.FlagSet) func([]string, io.Reader, func(string)) error {
		return func(args []string, in io.Reader, _ func(string)) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			host, err := readHostParams()
			if err != nil || host == nil {
				return err
			}
			params := DisabledParams(host)
			if params == nil {
				return nil
			}
			root, err := OpenRoot(in)
			if err != nil {
				return err
			}
			defer root.Close()
			return MountParams(root, params)
		}
	},
}

func readHostParams() ([]byte, error) {
	b, err := os.ReadFile(ParamsFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the host's %s: %w", ParamsFile, err)
	}
	return b, nil
}

// DisabledParams returns params (the host's file) with ModifyDeviceFiles: 1
// turned to 0, or nil when there is nothing to change.
func DisabledParams(params []byte) []byte {
	var out bytes.Buffer
	changed := false
	for _, l := range strings.SplitAfter(string(params), "\n") {
		if l == "" {
			continue
		}
		line := strings.TrimSuffix(l, "\n")
		switch line {
		case "ModifyDeviceFiles: 0":
			return nil
		case "ModifyDeviceFiles: 1":
			line = "ModifyDeviceFiles: 0"
			changed = true
		}
		out.WriteString(line + "\n")
	}
	if !changed {
		return nil
	}
	return out.Bytes()
}

// MountParams bind-mounts a read-only file holding params over the
// container's ParamsFile (resolved inside root; a container without one is
// left alone). The file is made on a tmpfs mounted on a private scratch
// directory, which is detached and removed once the file is bound: the
// bind mount keeps the tmpfs alive, and the image gets no new directory.
func MountParams(root *rootfs.Root, params []byte) error {
	target, err := root.OpenPath(ParamsFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("finding the container's %s: %w", ParamsFile, err)
	}
	defer target.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(target.Fd()), &st); err != nil {
		return fmt.Errorf("stat of the container's %s: %w", ParamsFile, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("the container's %s is not a regular file; refusing to mount over it", ParamsFile)
	}
	scratch, err := os.MkdirTemp("", "gantry-params-")
	if err != nil {
		return fmt.Errorf("making a scratch directory for the params file: %w", err)
	}
	defer os.Remove(scratch)
	if err := unix.Mount("tmpfs", scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k,mode=0755"); err != nil {
		return fmt.Errorf("mounting a tmpfs for the params file: %w", err)
	}
	defer unix.Unmount(scratch, unix.MNT_DETACH)
	file := filepath.Join(scratch, "params")
	if err := os.WriteFile(file, params, 0o444); err != nil {
		return fmt.Errorf("writing the params copy: %w", err)
	}
	// Clone the file's mount, make the clone read-only before anything can
	// see it, and attach it on the descriptor of the target found in the
	// root: no path string is resolved between the check and the mount.
	tree, err := unix.OpenTree(unix.AT_FDCWD, file, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("cloning the params copy (open_tree needs Linux 5.2): %w", err)
	}
	defer unix.Close(tree)
	ma := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC, Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &ma); err != nil {
		return fmt.Errorf("making the params copy read-only (mount_setattr needs Linux 5.12): %w", err)
	}
	if err := unix.MoveMount(tree, "", int(target.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("mounting over the container's %s: %w", ParamsFile, err)
	}
	return nil
}

var appProfileCommand = &Command{
	Name:    "update-application-profile",
	Summary: "limit EGL and Vulkan to the container's GPUs with a driver application profile",
	Usage:   "",
	Help: `Run by the container runtime as a createContainer hook, with the container
state on stdin. Writes /etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf
in the container: an application profile setting EGLVisibleDGPUDevices to the
mask of the minors of the /dev/nvidiaN nodes the container has, so that EGL and
Vulkan see only its GPUs, as NVIDIA's hook does. A container without GPU nodes
gets no file. /dev is read inside the container's root.`,
	Flags: func(fs *flag.FlagSet) func([]string, io.Reader, func(string)) error {
		return func(args []string, in io.Reader, warn func(string)) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			root, err := OpenRoot(in)
			if err != nil {
				return err
			}
			defer root.Close()
			_, err = UpdateApplicationProfile(root, warn)
			return err
		}
	},
}

// AppProfileFile is the application profile update-application-profile writes.
const AppProfileFile = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"

// isGPUNode reports whether name is a GPU's device node name, nvidiaN
// (not nvidiactl, nvidia-uvm, ...). No regexp: compiling one at package init
// cost every start of gantry-runtime and gantry-cdi-hook.
func isGPUNode(name string) bool {
	n, ok := strings.CutPrefix(name, "nvidia")
	if !ok || n == "" {
		return false
	}
	for _, c := range n {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// UpdateApplicationProfile writes AppProfileFile for the GPU nodes in the
// container's /dev and returns the mask written (0: no file).
func UpdateApplicationProfile(root *rootfs.Root, warn func(string)) (uint64, error) {
	names, err := root.ReadDirMax("/dev", 1<<16)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("listing the container's /dev: %w", err)
	}
	var mask uint64
	for _, n := range names {
		if !isGPUNode(n) {
			continue
		}
		fi, err := root.Lstat("/dev/" + n)
		if err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
			continue
		}
		minor := unix.Minor(fi.Sys().(*unix.Stat_t).Rdev)
		if minor >= 64 {
			if warn != nil {
				warn(fmt.Sprintf("/dev/%s has minor %d, beyond the profile's 64-bit mask; left out", n, minor))
			}
			continue
		}
		mask |= 1 << minor
	}
	if mask == 0 {
		return 0, nil
	}
	if err := root.MkdirAll(path.Dir(AppProfileFile), 0o555); err != nil {
		return 0, fmt.Errorf("creating the container's %s: %w", path.Dir(AppProfileFile), err)
	}
	profile := fmt.Sprintf(`{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x%x]}],"rules":[{"pattern":[],"profile":"_container_"}]}`, mask)
	if err := root.WriteFileAtomic(AppProfileFile, []byte(profile), 0o444); err != nil {
		return 0, fmt.Errorf("writing the container's %s: %w", AppProfileFile, err)
	}
	return mask, nil
}

var noopCommand = &Command{
	Name:    "noop",
	Summary: "do nothing (for testing that the hook runs)",
	Hidden:  true,
	Flags: func(fs *flag.FlagSet) func([]string, io.Reader, func(string)) error {
		return func([]string, io.Reader, func(string)) error { return nil }
	},
}
