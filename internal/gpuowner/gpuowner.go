package gpuowner

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// DirName is the owners directory's name in the kubelet's root directory.
const DirName = "gantry-gpu-owners"

// DefaultDir is the owners directory on the host (and, mounted at the same
// path, in the plugins' containers): DirName in the kubelet's default root.
const DefaultDir = "/var/lib/kubelet/" + DirName

// Owner names of Gantry's plugins; each is also its file's name (.json).
const (
	DevicePlugin = "gantry-device-plugin"
	DRAPlugin    = "gantry-dra-plugin"
)

const (
	lockName = ".lock"
	// maxRecord bounds what is read of another owner's file: a record of
	// 64 GPUs is a few KiB.
	maxRecord = 1 << 20
)

// GPU is one GPU an owner offers, whole or in part.
type GPU struct {
	// UUID is the physical GPU's UUID (a MIG device's parent).
	UUID string `json:"uuid"`
	// Index is the GPU's index, for messages ("" when unknown).
	Index string `json:"index,omitempty"`
	// MIG is the MIG device's UUID when only that part is offered.
	MIG string `json:"mig,omitempty"`
}

func (g GPU) String() string {
	s := g.UUID
	if g.Index != "" {
		s += " (index " + g.Index + ")"
	}
	return s
}

// Record is what one owner offers.
type Record struct {
	// Owner names the plugin (DevicePlugin, DRAPlugin, or a description
	// of an outside source).
	Owner string `json:"owner"`
	// Node is the Kubernetes node name, for messages.
	Node string `json:"node,omitempty"`
	// PID is the plugin's process ID in its own PID namespace.
	PID     int       `json:"pid,omitempty"`
	Started time.Time `json:"started"`
	GPUs    []GPU     `json:"gpus"`
	// Select says which settings choose this owner's GPUs, for the fix in
	// the other owner's error ("--devices (GANTRY_DRA_DEVICES)").
	Select string `json:"select,omitempty"`
	// Where is where the record was read (a file, the kubelet's
	// checkpoint); not stored.
	Where string `json:"-"`
}

// ConflictError is the refusal: GPUs that a live owner already offers.
type ConflictError struct {
	Self, Other Record
	GPUs        []GPU
}

// ErrConflict is wrapped by every ConflictError (errors.Is).
var ErrConflict = errors.New("GPU already offered by another plugin on this node")

func (e *ConflictError) Unwrap() error { return ErrConflict }

func (e *ConflictError) Error() string {
	names := make([]string, len(e.GPUs))
	for i, g := range e.GPUs {
		names[i] = g.String()
	}
	other := e.Other.Owner
	var about []string
	if e.Other.PID > 0 {
		about = append(about, fmt.Sprintf("pid %d", e.Other.PID))
	}
	if !e.Other.Started.IsZero() {
		about = append(about, "since "+e.Other.Started.UTC().Format(time.RFC3339))
	}
	if e.Other.Where != "" {
		about = append(about, e.Other.Where)
	}
	if len(about) > 0 {
		other += " (" + strings.Join(about, ", ") + ")"
	}
	fix := "give the two plugins disjoint GPUs"
	var sel []string
	for _, r := range []Record{e.Self, e.Other} {
		if r.Select != "" {
			sel = append(sel, r.Owner+": "+r.Select)
		}
	}
	if len(sel) > 0 {
		fix += " (" + strings.Join(sel, "; ") + ")"
	}
	return fmt.Sprintf("%s %s already offered by %s on this node: %s will not offer %s too, as the kubelet would give %s to two pods at once; %s, or run only one of them on this node",
		plural(len(names), "GPU", "GPUs"), strings.Join(names, ", "), other, e.Self.Owner,
		plural(len(names), "it", "them"), plural(len(names), "it", "each"), fix)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// Registration is a live owner's claim: its file and the flock on it.
type Registration struct {
	f    *os.File
	path string
}

// Path is the owner's file.
func (r *Registration) Path() string { return r.path }

// Release removes the owner's file and drops its lock. A plugin that ends
// without calling it (killed) leaves a stale file, which its lock's end
// already marks as such.
func (r *Registration) Release() error {
	if r == nil || r.f == nil {
		return nil
	}
	err := os.Remove(r.path)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	r.f = nil
	return err
}

// Register records rec as a live owner in dir, unless a live owner there
// (or one of extra, owners found elsewhere) already offers one of its GPUs:
// then it returns a *ConflictError and records nothing. Another live
// instance of the same owner is refused as well, overlapping or not.
func Register(dir string, rec Record, extra ...Record) (*Registration, error) {
	if rec.Owner == "" || strings.ContainsAny(rec.Owner, "/\x00") || strings.HasPrefix(rec.Owner, ".") {
		return nil, fmt.Errorf("gpuowner: bad owner name %q", rec.Owner)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the GPU owners directory %s: %w (it is a host directory the plugins share; check the DaemonSet's volume)", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("GPU owners directory %s: %w", dir, err)
	}
	defer lock.Close()
	if err := flock(lock, syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("locking %s: %w", lock.Name(), err)
	}
	live, err := Live(dir)
	if err != nil {
		return nil, err
	}
	for _, other := range append(live, extra...) {
		if other.Owner == rec.Owner && other.Where != "" && filepath.Dir(other.Where) == filepath.Clean(dir) {
			return nil, fmt.Errorf("another %s already runs on this node (pid %d, %s): stop it first, one per node", rec.Owner, other.PID, other.Where)
		}
		if both := Overlap(rec.GPUs, other.GPUs); len(both) > 0 {
			return nil, &ConflictError{Self: rec, Other: other, GPUs: both}
		}
	}
	if rec.PID == 0 {
		rec.PID = os.Getpid()
	}
	if rec.Started.IsZero() {
		rec.Started = time.Now().UTC().Truncate(time.Second)
	}
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, rec.Owner+".json")
	tmp, err := os.CreateTemp(dir, "."+rec.Owner+".*")
	if err != nil {
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := flock(tmp, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return nil, fmt.Errorf("locking %s: %w", tmp.Name(), err)
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	ok = true
	return &Registration{f: tmp, path: path}, nil
}

// Live reads the owners in dir whose writers still run (they hold the lock
// on their file); stale and unreadable files are skipped.
func Live(dir string) ([]Record, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the GPU owners directory: %w", err)
	}
	var out []Record
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") || !e.Type().IsRegular() {
			continue
		}
		rec, alive, err := readLive(filepath.Join(dir, name))
		if err != nil || !alive {
			continue
		}
		out = append(out, rec)
	}
	return out, nil
}

// readLive reads one owner file and tells whether its writer holds its lock.
func readLive(path string) (Record, bool, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return Record{}, false, err
	}
	defer f.Close()
	switch err := flock(f, syscall.LOCK_SH|syscall.LOCK_NB); {
	case err == nil:
		return Record{}, false, nil // nobody holds it: stale
	case !errors.Is(err, syscall.EWOULDBLOCK):
		return Record{}, false, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxRecord))
	if err != nil {
		return Record{}, false, err
	}
	var rec Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return Record{}, false, fmt.Errorf("%s: %w", path, err)
	}
	rec.Where = path
	return rec, true, nil
}

// Overlap lists the GPUs of a that b also has: the same physical GPU,
// unless both are distinct MIG devices of it.
func Overlap(a, b []GPU) []GPU {
	var out []GPU
	for _, x := range a {
		for _, y := range b {
			if x.UUID != y.UUID || (x.MIG != "" && y.MIG != "" && x.MIG != y.MIG) {
				continue
			}
			if !slices.ContainsFunc(out, func(g GPU) bool { return g == x }) {
				out = append(out, x)
			}
			break
		}
	}
	return out
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
