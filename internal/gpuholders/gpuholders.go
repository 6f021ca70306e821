// Package gpuholders tells the runtime which running pods on a Kubernetes
// node hold which GPUs, so that it never gives a container a GPU another
// pod holds: from the kubelet's device checkpoint (what the device plugins'
// Allocate gave each pod's containers) and from the prepared claims of DRA
// plugins on the node (gantry-dra-plugin's checkpoint.json in its plugin
// directory, which records each claim's GPUs and the pods it is reserved
// for).
//
// Both records outlive their pods for a while (the kubelet prunes its
// checkpoint at its next allocation, a claim is unprepared after its pods
// are gone), so a holder counts only while its pod runs: while the pod's
// cgroup (the kubelet's pod<UID> or kubepods-*-pod<UID>.slice, under
// /sys/fs/cgroup, v1 or v2) has a process in it. A node where no kubepods
// cgroup can be found at all counts every holder as running.
//
// Within one pod nothing is refused: the kubelet gives an init container's
// devices to the app containers after it. Shared devices are not refused
// to each other: replicas ("UUID::N") of one resource (time-slicing, MPS),
// and DRA claims both with admin access. A claim shared by several pods
// lists them all.
package gpuholders

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/kubeletckpt"
	"github.com/gantry-gpu/gantry/internal/ocibundle"
)

// ErrHeld is wrapped by the refusal: a GPU another running pod holds.
var ErrHeld = errors.New("GPU held by another running pod")

// DefaultCgroupRoot is where the cgroup file systems are mounted.
const DefaultCgroupRoot = "/sys/fs/cgroup"

// Unit is one GPU a container gets: a whole GPU, or a MIG device of it.
type Unit struct {
	UUID  string // the physical GPU
	Index int
	MIG   string // the MIG device's UUID, "" for a whole GPU
}

func (u Unit) overlaps(v Unit) bool {
	return u.UUID == v.UUID && (u.MIG == "" || v.MIG == "" || u.MIG == v.MIG)
}

func (u Unit) String() string {
	s := u.UUID + " (index " + strconv.Itoa(u.Index) + ")"
	if u.MIG != "" {
		s = u.MIG + " on " + s
	}
	return s
}

// Holder is one pod's hold on one GPU.
type Holder struct {
	Unit Unit
	// PodUID holds it; Pod is its namespace/name when known.
	PodUID, Pod string
	// Container is the container the kubelet allocated it to ("" for a
	// claim, which belongs to the pod).
	Container string
	// Kind groups holds that may share: the resource name for the kubelet
	// checkpoint, "dra" for claims.
	Kind string
	// Shared is a replica or an admin-access claim.
	Shared bool
	// Via says where the hold is recorded, for messages.
	Via string
}

// Options say where to look.
type Options struct {
	// KubeletDir is the kubelet's root directory (/var/lib/kubelet).
	KubeletDir string
	// CgroupRoot is where cgroups are mounted ("" is DefaultCgroupRoot).
	CgroupRoot string
}

// Holders reads the node's holds on the GPUs of sys.
func Holders(o Options, sys *gpu.System) ([]Holder, error) {
	var out []Holder
	cp, err := kubeletckpt.Read(o.KubeletDir)
	if err != nil {
		return nil, err
	}
	for _, e := range cp.Entries {
		for _, id := range e.DeviceIDs {
			if !strings.HasPrefix(e.ResourceName, "nvidia.com/") && !strings.HasPrefix(id, "GPU-") && !strings.HasPrefix(id, "MIG-") {
				continue // another vendor's "0" is not GPU 0
			}
			u, ok := unitOf(sys, id)
			if !ok {
				continue
			}
			out = append(out, Holder{Unit: u, PodUID: e.PodUID, Container: e.ContainerName, Kind: e.ResourceName,
				Shared: strings.Contains(id, "::"), Via: e.ResourceName + " in the kubelet's device checkpoint " + cp.Path})
		}
	}
	claims, err := draHolders(o.KubeletDir, sys)
	if err != nil {
		return nil, err
	}
	return append(out, claims...), nil
}

// Check refuses (an error wrapping ErrHeld) to give units to the container
// of pod podUID when another running pod holds one of them. A privileged
// container that holds none of its GPUs itself is trusted (it sees every
// device node anyway: the device plugins' own DaemonSets are such).
func Check(o Options, sys *gpu.System, podUID, container string, privileged bool, units []Unit) error {
	if len(units) == 0 {
		return nil
	}
	hs, err := Holders(o, sys)
	if err != nil {
		return fmt.Errorf("reading who holds the node's GPUs: %w", err)
	}
	mine := func(h Holder) bool { return podUID != "" && h.PodUID == podUID }
	if privileged && !slices.ContainsFunc(hs, mine) {
		return nil
	}
	root := o.CgroupRoot
	if root == "" {
		root = DefaultCgroupRoot
	}
	running := map[string]bool{}
	for _, u := range units {
		// How this pod holds u, if it does: shares are not refused to
		// shares of the same kind.
		var own *Holder
		for i, h := range hs {
			if mine(h) && h.Unit.overlaps(u) {
				own = &hs[i]
				break
			}
		}
		for _, h := range hs {
			if mine(h) || !h.Unit.overlaps(u) {
				continue
			}
			if own != nil && own.Shared && h.Shared && own.Kind == h.Kind {
				continue
			}
			r, seen := running[h.PodUID]
			if !seen {
				r = podRunning(root, h.PodUID)
				running[h.PodUID] = r
			}
			if !r {
				continue
			}
			who := "pod " + h.PodUID
			if h.Pod != "" {
				who = "pod " + h.Pod + " (uid " + h.PodUID + ")"
			}
			if h.Container != "" {
				who += " container " + h.Container
			}
			me := "this container"
			if podUID != "" {
				me = "pod " + podUID + " container " + container
			}
			return fmt.Errorf("%w: GPU %s is held by running %s (%s); refusing to give it to %s as well. "+
				"A GPU given to two pods is shared without either knowing: check that the node's device plugin and DRA plugin offer disjoint GPUs "+
				"(gantry-device-plugin's GANTRY_DEVICES, gantry-dra-plugin's GANTRY_DRA_DEVICES), and that the container asks for its GPUs "+
				"through a resource request or a claim, not its own NVIDIA_VISIBLE_DEVICES",
				ErrHeld, u, who, h.Via, me)
		}
	}
	return nil
}

// unitOf maps a device plugin's device ID (UUID, UUID::N, index, GPU:MIG)
// to a unit of sys.
func unitOf(sys *gpu.System, id string) (Unit, bool) {
	id, _, _ = strings.Cut(strings.TrimSpace(id), "::")
	for _, d := range sys.Devices {
		if id == d.UUID || id == strconv.Itoa(d.Index) {
			return Unit{UUID: d.UUID, Index: d.Index}, true
		}
		for _, m := range d.MIGDevices {
			if id == m.UUID || id == m.Name() {
				return Unit{UUID: d.UUID, Index: d.Index, MIG: m.UUID}, true
			}
		}
	}
	return Unit{}, false
}

// draCheckpoint is the part of gantry-dra-plugin's checkpoint.json read
// here (package draplugin writes it; its test checks that this reads it).
type draCheckpoint struct {
	Version int    `json:"version"`
	Driver  string `json:"driver"`
	Claims  map[string]struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
		Devices   []struct {
			UUID        string `json:"uuid"`
			AdminAccess bool   `json:"adminAccess"`
		} `json:"devices"`
		Pods []struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"pods"`
	} `json:"claims"`
}

const maxDRACheckpoint = 16 << 20

// draHolders reads the prepared claims of the DRA plugins under
// <kubelet>/plugins/*/checkpoint.json that are gantry-dra-plugin's format
// (version 1 with a driver name); others (another vendor's) are skipped.
// A claim without recorded pods (prepared by an older plugin) is skipped:
// its pods are not known.
func draHolders(kubeletDir string, sys *gpu.System) ([]Holder, error) {
	paths, _ := filepath.Glob(filepath.Join(kubeletDir, "plugins", "*", "checkpoint.json"))
	var out []Holder
	for _, p := range paths {
		data, err := readSmall(p)
		if err != nil {
			continue
		}
		var cp draCheckpoint
		if json.Unmarshal(data, &cp) != nil || cp.Version != 1 || cp.Driver == "" {
			continue
		}
		for uid, c := range cp.Claims {
			for _, d := range c.Devices {
				u, ok := unitOf(sys, d.UUID)
				if !ok {
					continue
				}
				for _, pod := range c.Pods {
					out = append(out, Holder{Unit: u, PodUID: pod.UID, Pod: c.Namespace + "/" + pod.Name, Kind: "dra", Shared: d.AdminAccess,
						Via: "DRA claim " + c.Namespace + "/" + c.Name + " (uid " + uid + ") prepared by " + cp.Driver + ", " + p})
				}
			}
		}
	}
	return out, nil
}

func readSmall(path string) ([]byte, error) {
	return ocibundle.ReadRegularNoFollow(path, "the DRA plugin's checkpoint", maxDRACheckpoint)
}
