package ctrckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// nvidiaMajor is the NVIDIA driver's fixed character device major.
const nvidiaMajor = 195

// DevNode is one /dev/nvidiaN node of a config.json (linux.devices).
type DevNode struct {
	Minor    int
	Mode     uint32 // permission bits
	UID, GID uint32
}

// SpecDevNodes lists the /dev/nvidiaN GPU nodes of a config.json, by minor.
func SpecDevNodes(raw []byte) ([]DevNode, error) {
	var spec struct {
		Linux *struct {
			Devices []struct {
				Path     string  `json:"path"`
				Major    *int64  `json:"major"`
				Minor    *int64  `json:"minor"`
				FileMode *uint32 `json:"fileMode"`
				UID      *uint32 `json:"uid"`
				GID      *uint32 `json:"gid"`
			} `json:"devices"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	var out []DevNode
	if spec.Linux == nil {
		return nil, nil
	}
	for _, d := range spec.Linux.Devices {
		n, err := strconv.Atoi(strings.TrimPrefix(d.Path, "/dev/nvidia"))
		if !strings.HasPrefix(d.Path, "/dev/nvidia") || err != nil || d.Minor == nil || int64(n) != *d.Minor {
			continue
		}
		if d.Major != nil && *d.Major != nvidiaMajor {
			continue
		}
		node := DevNode{Minor: n, Mode: 0o666}
		if d.FileMode != nil {
			node.Mode = *d.FileMode & 0o777
		}
		if d.UID != nil {
			node.UID = *d.UID
		}
		if d.GID != nil {
			node.GID = *d.GID
		}
		out = append(out, node)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Minor < out[j].Minor })
	return out, nil
}

// SyncDevNodes makes the GPU nodes in the /dev of a restored container
// (whose init is initPID, checked by the caller to be the container's) the
// restore's: CRIU restores /dev, a tmpfs, from the checkpoint's image, so
// it holds the checkpoint's /dev/nvidiaN nodes and not those of GPUs the
// restore's request names instead (runc makes device nodes at a create
// only). The CUDA driver restores a process onto a GPU by opening its node
// in the process's mount namespace, and the driver params the container
// sees say ModifyDeviceFiles: 0, so it does not make one itself: without
// the new GPU's node the CUDA restore fails (CUDA_ERROR_NOT_SUPPORTED on
// 580 drivers). Each wanted node is made (mode, owner as config.json says;
// a file or link in its place is replaced, never followed), and each node
// of a checkpoint GPU the restore does not name is removed, when it is the
// NVIDIA device it names (a character device 195:minor): the restored
// container keeps no node of a GPU its request does not name. All paths
// are resolved inside the container's root (openat2 RESOLVE_IN_ROOT
// through /proc/PID/root).
func SyncDevNodes(initPID int, want []DevNode, stale []int) error {
	root, err := rootfs.Open(filepath.Join(procRoot, strconv.Itoa(initPID), "root"))
	if err != nil {
		return fmt.Errorf("the restored container's root: %w", err)
	}
	defer root.Close()
	keep := map[int]bool{}
	for _, n := range want {
		keep[n.Minor] = true
		p := "/dev/nvidia" + strconv.Itoa(n.Minor)
		if err := root.Mknod(p, unix.S_IFCHR|n.Mode, unix.Mkdev(nvidiaMajor, uint32(n.Minor))); err != nil {
			return fmt.Errorf("making %s in the restored container: %w", p, err)
		}
		if n.UID != 0 || n.GID != 0 {
			f, err := root.OpenPath(p)
			if err != nil {
				return err
			}
			err = unix.Fchownat(int(f.Fd()), "", int(n.UID), int(n.GID), unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
			f.Close()
			if err != nil {
				return fmt.Errorf("chown %s in the restored container: %w", p, err)
			}
		}
	}
	dev, err := root.OpenPath("/dev")
	if err != nil {
		return fmt.Errorf("the restored container's /dev: %w", err)
	}
	defer dev.Close()
	for _, m := range stale {
		if keep[m] {
			continue
		}
		name := "nvidia" + strconv.Itoa(m)
		var st unix.Stat_t
		err := unix.Fstatat(int(dev.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("stat /dev/%s in the restored container: %w", name, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != nvidiaMajor || unix.Minor(st.Rdev) != uint32(m) {
			continue // not the GPU's node: not ours to remove
		}
		if err := unix.Unlinkat(int(dev.Fd()), name, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing /dev/%s (a GPU the restore does not name) from the restored container: %w", name, err)
		}
	}
	return nil
}
