package cdiindex

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"

	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
)

// Limits, overridable in Options for tests.
const (
	// DefaultMaxSpecs is the most spec files read from one directory. A
	// node holds a spec per vendor and, with DRA drivers, one transient
	// spec per claim: hundreds on a busy node.
	DefaultMaxSpecs = 1024
	// DefaultMaxSpecSize is the most bytes of one spec file: Gantry's own
	// spec for 8 GPUs with MIG is some 100 KiB.
	DefaultMaxSpecSize = 4 << 20
	// DefaultMaxTotal is the most bytes read to build one index.
	DefaultMaxTotal = 64 << 20
	// maxNames is the most directory entries looked at in one directory.
	maxNames = 16384
	// maxIndexSize bounds the index file read back.
	maxIndexSize = 16 << 20
	// indexFormat changes whenever the index's meaning does.
	indexFormat = 1
)

// Options say where the specs are and where the index is kept.
type Options struct {
	// Dirs are the spec directories, lowest priority first.
	Dirs []string
	// CacheDir holds the index file; "" keeps no index (every call reads
	// the directories, still bounded).
	CacheDir string
	// MaxSpecs, MaxSpecSize and MaxTotal default to the constants above.
	MaxSpecs    int
	MaxSpecSize int64
	MaxTotal    int64
	// Warn is told of skipped files when the index is built (nil: quiet).
	Warn func(string)
}

func (o *Options) defaults() {
	if o.MaxSpecs <= 0 {
		o.MaxSpecs = DefaultMaxSpecs
	}
	if o.MaxSpecSize <= 0 {
		o.MaxSpecSize = DefaultMaxSpecSize
	}
	if o.MaxTotal <= 0 {
		o.MaxTotal = DefaultMaxTotal
	}
	if o.Warn == nil {
		o.Warn = func(string) {}
	}
}

// stamp is what says a file or directory is unchanged.
type stamp struct {
	Absent   bool `json:"a,omitempty"`
	Dev, Ino uint64
	Size     int64 `json:"s"`
	Mtime    int64 `json:"m"`
	Ctime    int64 `json:"c"`
	Mode     uint32
}

func stampOf(p string) stamp {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return stamp{Absent: true}
	}
	return stamp{Dev: uint64(st.Dev), Ino: st.Ino, Size: st.Size, Mode: st.Mode,
		Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}
}

// file is one spec file of the index.
type file struct {
	Path     string   `json:"p"`
	Priority int      `json:"r"`
	Stamp    stamp    `json:"t"`
	Devices  []string `json:"d,omitempty"` // qualified names
	// Skipped says why the file was not read or not usable ("" if it was).
	Skipped string `json:"k,omitempty"`
}

// index is what the index file holds.
type index struct {
	Format      int
	Dirs        []string
	MaxSpecs    int
	MaxSpecSize int64
	MaxTotal    int64
	DirStamps   []stamp
	Files       []file
	// DirNotes are the directories' own skips (too many files).
	DirNotes []string `json:",omitempty"`

	// parsed are the specs build read, by path: the create that builds
	// the index parses none twice.
	parsed map[string]*cdi.Spec
}

// Devices returns the devices named (qualified CDI names, vendor.com/class=name),
// in order, each with its spec (Device.GetSpec). The devices are fresh
// copies: the caller may change them.
func Devices(o Options, names []string) ([]*cdi.Device, error) {
	o.defaults()
	idx, cached := loadIndex(o)
	if idx == nil {
		idx = build(o)
		saveIndex(o, idx)
	}
	devs, err := lookup(o, idx, names)
	var nf *NotFoundError
	if cached && (errors.Is(err, errStale) || errors.As(err, &nf)) {
		// A file changed under an unchanged stamp (rewritten within one
		// tick of the file system's clock, or the clock set back): read
		// the directories again.
		idx = build(o)
		saveIndex(o, idx)
		devs, err = lookup(o, idx, names)
	}
	return devs, err
}

var errStale = errors.New("the CDI index is stale")

// lookup resolves names through idx, parsing only the files that hold them.
func lookup(o Options, idx *index, names []string) ([]*cdi.Device, error) {
	type owner struct {
		file     int
		conflict []string
	}
	owners := map[string]*owner{}
	for i, f := range idx.Files {
		for _, d := range f.Devices {
			prev := owners[d]
			switch {
			case prev == nil || idx.Files[prev.file].Priority < f.Priority:
				owners[d] = &owner{file: i}
			case idx.Files[prev.file].Priority == f.Priority:
				prev.conflict = append(prev.conflict, f.Path)
			}
		}
	}
	specs := map[int]*cdi.Spec{}
	var out []*cdi.Device
	var missing, conflicts []string
	for _, n := range names {
		w := owners[n]
		if w == nil {
			missing = append(missing, n)
			continue
		}
		if len(w.conflict) > 0 {
			conflicts = append(conflicts, fmt.Sprintf("%s (defined in %s and %s)", n, idx.Files[w.file].Path, strings.Join(w.conflict, ", ")))
			continue
		}
		spec := specs[w.file]
		if spec == nil {
			spec = idx.parsed[idx.Files[w.file].Path]
		}
		if spec == nil {
			f := idx.Files[w.file]
			var err error
			if spec, err = readSpec(f.Path, f.Priority, o.MaxSpecSize); err != nil {
				return nil, fmt.Errorf("%w: %v", errStale, err)
			}
			specs[w.file] = spec
		}
		kind, name, _ := strings.Cut(n, "=")
		d := spec.GetDevice(name)
		if d == nil || spec.Kind != kind {
			return nil, fmt.Errorf("%w: %s no longer defines %s", errStale, spec.GetPath(), n)
		}
		out = append(out, d)
	}
	if len(conflicts) > 0 {
		return nil, fmt.Errorf("CDI devices defined twice in one spec directory: %s: remove one of the files", strings.Join(conflicts, "; "))
	}
	if len(missing) > 0 {
		return nil, &NotFoundError{Names: missing, Dirs: idx.Dirs, Skipped: skippedFor(idx, missing)}
	}
	return out, nil
}

// NotFoundError is returned for names no spec read defines.
type NotFoundError struct {
	Names, Dirs []string
	// Skipped are the spec files (or directories) not read, with why:
	// one of them may define the names.
	Skipped []string
}

func (e *NotFoundError) Error() string {
	s := fmt.Sprintf("CDI devices %s are not in any spec under %s: generate one (gantry cdi generate) or fix the names", strings.Join(e.Names, ", "), strings.Join(e.Dirs, ", "))
	if len(e.Skipped) > 0 {
		s += "; not read, and may define them: " + strings.Join(e.Skipped, "; ")
	}
	return s
}

// skippedFor lists the files and directories the index skipped, those whose
// name has a wanted vendor first, at most 5.
func skippedFor(idx *index, names []string) []string {
	var first, rest []string
	for _, f := range idx.Files {
		if f.Skipped == "" {
			continue
		}
		msg := f.Path + ": " + f.Skipped
		hit := false
		for _, n := range names {
			vendor, _, _ := strings.Cut(n, "/")
			hit = hit || strings.Contains(filepath.Base(f.Path), vendor)
		}
		if hit {
			first = append(first, msg)
		} else {
			rest = append(rest, msg)
		}
	}
	out := append(append(first, rest...), idx.DirNotes...)
	if len(out) > 5 {
		out = append(out[:5], fmt.Sprintf("and %d more", len(out)-5))
	}
	return out
}

// readSpec reads the spec at p if it is a regular file of at most max
// bytes, with the library's parser and checks.
func readSpec(p string, priority int, max int64) (*cdi.Spec, error) {
	st := stampOf(p)
	if st.Absent || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, fmt.Errorf("%s: not a regular file", p)
	}
	if st.Size > max {
		return nil, fmt.Errorf("%s: %d bytes, over the %d-byte limit", p, st.Size, max)
	}
	specReads.Add(1)
	return cdi.ReadSpec(p, priority)
}

// specReads counts the spec files parsed, for the tests.
var specReads atomic.Int64

// build reads the directories into an index, within o's limits.
func build(o Options) *index {
	idx := &index{Format: indexFormat, Dirs: o.Dirs, MaxSpecs: o.MaxSpecs, MaxSpecSize: o.MaxSpecSize, MaxTotal: o.MaxTotal,
		parsed: map[string]*cdi.Spec{}}
	total := int64(0)
	for prio, dir := range o.Dirs {
		idx.DirStamps = append(idx.DirStamps, stampOf(dir))
		names, more := listSpecs(dir)
		if more {
			note := fmt.Sprintf("%s: over %d entries, the rest not looked at", dir, maxNames)
			idx.DirNotes = append(idx.DirNotes, note)
			o.Warn("CDI spec directory " + note)
		}
		read := 0
		for _, n := range names {
			p := filepath.Join(dir, n)
			f := file{Path: p, Priority: prio, Stamp: stampOf(p)}
			switch {
			case f.Stamp.Absent:
				continue
			case f.Stamp.Mode&syscall.S_IFMT == syscall.S_IFDIR:
				continue // as the library does
			case f.Stamp.Mode&syscall.S_IFMT != syscall.S_IFREG:
				f.Skipped = "not a regular file"
			case read >= o.MaxSpecs:
				f.Skipped = fmt.Sprintf("over %d spec files in %s", o.MaxSpecs, dir)
			case f.Stamp.Size > o.MaxSpecSize:
				f.Skipped = fmt.Sprintf("%d bytes, over the %d-byte limit of a spec file", f.Stamp.Size, o.MaxSpecSize)
			case total+f.Stamp.Size > o.MaxTotal:
				f.Skipped = fmt.Sprintf("over %d bytes of spec files in all", o.MaxTotal)
			default:
				read++
				total += f.Stamp.Size
				specReads.Add(1)
				spec, err := cdi.ReadSpec(p, prio)
				if err != nil {
					f.Skipped = "unusable: " + err.Error()
					break
				}
				idx.parsed[p] = spec
				for _, name := range sortedDevices(spec) {
					f.Devices = append(f.Devices, spec.Kind+"="+name)
				}
			}
			if f.Skipped != "" && !strings.HasPrefix(f.Skipped, "unusable") {
				o.Warn(fmt.Sprintf("CDI spec %s not read: %s", p, f.Skipped))
			}
			idx.Files = append(idx.Files, f)
		}
	}
	return idx
}

func sortedDevices(spec *cdi.Spec) []string {
	var out []string
	for _, d := range spec.Devices {
		out = append(out, d.Name)
	}
	sort.Strings(out)
	return out
}

// listSpecs returns the sorted *.json and *.yaml names in dir (the
// library's choice of files), at most maxNames entries looked at; more says
// the directory has more.
func listSpecs(dir string) (names []string, more bool) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, false
	}
	defer d.Close()
	all, err := d.Readdirnames(maxNames)
	if err == nil {
		if extra, _ := d.Readdirnames(1); len(extra) > 0 {
			more = true
		}
	}
	for _, n := range all {
		if ext := filepath.Ext(n); ext == ".json" || ext == ".yaml" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names, more
}

// fresh says whether idx was made for o and nothing it depends on changed.
func fresh(o Options, idx *index) bool {
	if idx.Format != indexFormat || idx.MaxSpecs != o.MaxSpecs || idx.MaxSpecSize != o.MaxSpecSize ||
		idx.MaxTotal != o.MaxTotal || len(idx.Dirs) != len(o.Dirs) || len(idx.DirStamps) != len(o.Dirs) {
		return false
	}
	for i, d := range o.Dirs {
		if idx.Dirs[i] != d || stampOf(d) != idx.DirStamps[i] {
			return false
		}
	}
	for _, f := range idx.Files {
		if !inDirs(f.Path, o.Dirs) || stampOf(f.Path) != f.Stamp {
			return false
		}
	}
	return true
}

func inDirs(p string, dirs []string) bool {
	for _, d := range dirs {
		if filepath.Dir(p) == filepath.Clean(d) {
			return true
		}
	}
	return false
}

// indexPath names the index after the directories it covers.
func indexPath(o Options) string {
	h := sha256.Sum256([]byte(strings.Join(o.Dirs, "\x00")))
	return filepath.Join(o.CacheDir, "cdi-index-"+hex.EncodeToString(h[:6])+".json")
}

// loadIndex returns the index file's index if it is ours (a regular file
// of this user, writable by no one else, bounded) and fresh.
func loadIndex(o Options) (*index, bool) {
	if o.CacheDir == "" {
		return nil, false
	}
	f, err := os.Open(indexPath(o))
	if err != nil {
		return nil, false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o022 != 0 || st.Size() > maxIndexSize {
		return nil, false
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || int(sys.Uid) != os.Geteuid() {
		return nil, false
	}
	b, err := io.ReadAll(io.LimitReader(f, maxIndexSize))
	if err != nil {
		return nil, false
	}
	var idx index
	if json.Unmarshal(b, &idx) != nil || !fresh(o, &idx) {
		return nil, false
	}
	return &idx, true
}

// saveIndex writes idx for the next create; failing that, the next create
// builds it again.
func saveIndex(o Options, idx *index) {
	if o.CacheDir == "" {
		return
	}
	b, err := json.Marshal(idx)
	if err != nil || os.MkdirAll(o.CacheDir, 0o700) != nil {
		return
	}
	_ = atomicfile.Write(indexPath(o), b, atomicfile.Options{Mode: 0o600})
}
