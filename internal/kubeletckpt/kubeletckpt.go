// Package kubeletckpt reads the kubelet's device manager checkpoint,
// <kubelet root>/device-plugins/kubelet_internal_checkpoint: which devices
// the kubelet allocated to each pod's containers, and what the device plugin
// answered for them (its Allocate response: env, mounts, device nodes,
// annotations, CDI devices).
//
// The runtime uses it to tell a GPU request the kubelet made from one an
// image makes for itself: an image may set NVIDIA_VISIBLE_DEVICES=all, and in
// the container's OCI spec that looks exactly like the device plugin's
// answer. The kubelet writes the checkpoint after the plugin's Allocate and
// before it asks the runtime to create the container, so the allocation is
// always there when the container is created.
//
// The format is the JSON of k8s.io/kubernetes pkg/kubelet/cm/devicemanager/
// checkpoint: {"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName",
// "ResourceName", "DeviceIDs", "AllocResp"}], "RegisteredDevices": {...}},
// "Checksum": N}. DeviceIDs is an object of NUMA node to IDs since
// Kubernetes 1.20 (a list before). AllocResp is the plugin's
// ContainerAllocateResponse in protobuf (base64 in the JSON); only its envs
// are decoded here. The checksum (a hash of a Go-specific dump) is not
// verified: the file is root's, and the kubelet itself rewrites it.
package kubeletckpt

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// File is the checkpoint's name in the kubelet's device-plugins directory.
const File = "kubelet_internal_checkpoint"

// DefaultKubeletDir is the kubelet's default root directory.
const DefaultKubeletDir = "/var/lib/kubelet"

// MaxSize bounds what is read: a node with 110 pods of 8 containers
// holding 8 devices each writes well under 1 MiB.
const MaxSize = 16 << 20

// Entry is one container's allocation of one resource.
type Entry struct {
	PodUID        string
	ContainerName string
	ResourceName  string
	DeviceIDs     []string
	// Env is the env of the plugin's Allocate response for this entry.
	Env map[string]string
}

// Checkpoint is the checkpoint's allocations.
type Checkpoint struct {
	Path    string
	Entries []Entry
	// Registered is each resource's device IDs the plugins advertised
	// (healthy ones, when the kubelet last wrote the file).
	Registered map[string][]string
}

type fileJSON struct {
	Data struct {
		RegisteredDevices map[string][]string
		PodDeviceEntries  []struct {
			PodUID        string
			ContainerName string
			ResourceName  string
			DeviceIDs     json.RawMessage
			AllocResp     []byte
		}
	}
}

// Read reads the checkpoint in the kubelet root directory kubeletDir. A
// missing file gives an empty checkpoint and no error: no device plugin has
// registered, so the kubelet allocated nothing.
func Read(kubeletDir string) (*Checkpoint, error) {
	path := filepath.Join(kubeletDir, "device-plugins", File)
	cp, err := ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &Checkpoint{Path: path}, nil
	}
	return cp, err
}

// ReadFile reads the checkpoint at path (an error wrapping os.ErrNotExist
// when there is none): a regular file, not a symlink, at most MaxSize.
func ReadFile(path string) (*Checkpoint, error) {
	cp := &Checkpoint{Path: path}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > MaxSize {
		return nil, fmt.Errorf("%s is %d bytes, over the %d-byte limit", path, st.Size(), MaxSize)
	}
	id := identityOf(path, st)
	if c := lastRead.get(id); c != nil {
		return c, nil
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, err
	}
	if err := cp.parse(data); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	lastRead.put(id, cp)
	return cp, nil
}

// A GPU create reads the checkpoint twice (the container's allocation for
// runtime.kubernetes-env, then who else holds its GPUs): the second read
// of an unchanged file reuses the first's parse. The kubelet replaces the
// file by a rename, so its inode, size or mtime tell a new one. Callers
// must not change a returned Checkpoint.
type fileIdentity struct {
	path           string
	dev, ino, size uint64
	mtime          int64
}

func identityOf(path string, st os.FileInfo) fileIdentity {
	id := fileIdentity{path: path, size: uint64(st.Size()), mtime: st.ModTime().UnixNano()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(sys.Dev), sys.Ino
	}
	return id
}

type memo struct {
	mu sync.Mutex
	id fileIdentity
	cp *Checkpoint
}

var lastRead memo

func (m *memo) get(id fileIdentity) *Checkpoint {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cp != nil && m.id == id {
		return m.cp
	}
	return nil
}

func (m *memo) put(id fileIdentity, cp *Checkpoint) {
	m.mu.Lock()
	m.id, m.cp = id, cp
	m.mu.Unlock()
}

// Parse decodes a checkpoint's JSON (for tests and tools; Read reads the file).
func Parse(data []byte) (*Checkpoint, error) {
	cp := &Checkpoint{}
	return cp, cp.parse(data)
}

func (cp *Checkpoint) parse(data []byte) error {
	var fj fileJSON
	if err := json.Unmarshal(data, &fj); err != nil {
		return fmt.Errorf("not the kubelet's device checkpoint JSON: %v", err)
	}
	cp.Registered = fj.Data.RegisteredDevices
	for _, e := range fj.Data.PodDeviceEntries {
		ids, err := deviceIDs(e.DeviceIDs)
		if err != nil {
			return fmt.Errorf("pod %s container %s: %v", e.PodUID, e.ContainerName, err)
		}
		env, err := allocEnv(e.AllocResp)
		if err != nil {
			return fmt.Errorf("pod %s container %s: AllocResp: %v", e.PodUID, e.ContainerName, err)
		}
		cp.Entries = append(cp.Entries, Entry{PodUID: e.PodUID, ContainerName: e.ContainerName,
			ResourceName: e.ResourceName, DeviceIDs: ids, Env: env})
	}
	return nil
}

// For lists the entries of one pod's container.
func (cp *Checkpoint) For(podUID, container string) []Entry {
	var out []Entry
	for _, e := range cp.Entries {
		if e.PodUID == podUID && e.ContainerName == container {
			out = append(out, e)
		}
	}
	return out
}

// deviceIDs reads DeviceIDs in either format, each ID once.
func deviceIDs(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err == nil {
		return list, nil
	}
	var perNUMA map[string][]string
	if err := json.Unmarshal(raw, &perNUMA); err != nil {
		return nil, errors.New("DeviceIDs is neither a list nor an object of NUMA node to list")
	}
	seen := map[string]bool{}
	for _, ids := range perNUMA {
		for _, id := range ids {
			if !seen[id] {
				seen[id] = true
				list = append(list, id)
			}
		}
	}
	return list, nil
}

// allocEnv decodes field 1 (envs, map<string,string>) of a
// ContainerAllocateResponse in protobuf wire format, skipping the rest.
func allocEnv(b []byte) (map[string]string, error) {
	env := map[string]string{}
	for len(b) > 0 {
		num, typ, n := tag(b)
		if n <= 0 {
			return nil, errors.New("bad field tag")
		}
		b = b[n:]
		switch typ {
		case 0: // varint
			_, n := uvarint(b)
			if n <= 0 {
				return nil, errors.New("bad varint")
			}
			b = b[n:]
		case 1: // 64-bit
			if len(b) < 8 {
				return nil, io.ErrUnexpectedEOF
			}
			b = b[8:]
		case 5: // 32-bit
			if len(b) < 4 {
				return nil, io.ErrUnexpectedEOF
			}
			b = b[4:]
		case 2: // length-delimited
			l, n := uvarint(b)
			if n <= 0 || l > uint64(len(b)-n) {
				return nil, io.ErrUnexpectedEOF
			}
			val := b[n : n+int(l)]
			b = b[n+int(l):]
			if num == 1 {
				k, v, err := mapEntry(val)
				if err != nil {
					return nil, err
				}
				env[k] = v
			}
		default:
			return nil, fmt.Errorf("unsupported wire type %d", typ)
		}
	}
	return env, nil
}

// mapEntry decodes a map<string,string> entry: field 1 key, field 2 value.
func mapEntry(b []byte) (key, val string, err error) {
	for len(b) > 0 {
		num, typ, n := tag(b)
		if n <= 0 || typ != 2 {
			return "", "", errors.New("bad map entry")
		}
		b = b[n:]
		l, n := uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return "", "", io.ErrUnexpectedEOF
		}
		s := string(b[n : n+int(l)])
		b = b[n+int(l):]
		switch num {
		case 1:
			key = s
		case 2:
			val = s
		}
	}
	return key, val, nil
}

func tag(b []byte) (num uint64, typ uint64, n int) {
	v, n := binary.Uvarint(b)
	return v >> 3, v & 7, n
}

// uvarint is binary.Uvarint (n <= 0 on a short or overlong varint).
func uvarint(b []byte) (uint64, int) { return binary.Uvarint(b) }
