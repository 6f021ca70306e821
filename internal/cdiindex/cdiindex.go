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
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

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
	indexFormat = 2
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
	// Bound says the file was skipped for a limit (count, size, total):
	// it may define devices, so none is taken from a file of its
	// priority or lower.
	Bound bool `json:"b,omitempty"`
}

// index is what the index file holds.
type index struct {
	Format      int
	Dirs        []string
	MaxSpecs    int
	MaxSpecSize int64
	MaxTotal    int64
	DirStamps   []stamp
	// Files are every *.json and *.yaml entry of the directories, also
	// those that are no spec file (missing, a dangling link, a directory:
	// no devices), so that one becoming a spec changes its stamp.
	Files []file
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
// A file's priority is its directory's position in o.Dirs (checked, not
// taken from the index file). A device is refused when a file of its
// priority or higher was skipped for a limit: that file may define it too,
// and the library, reading it, would take its definition or call it a
// conflict.
func lookup(o Options, idx *index, names []string) ([]*cdi.Device, error) {
	prio := make([]int, len(idx.Files))
	bound := -1 // the highest-priority file skipped for a limit
	for i, f := range idx.Files {
		if f.Priority < 0 || f.Priority >= len(o.Dirs) || filepath.Dir(f.Path) != filepath.Clean(o.Dirs[f.Priority]) {
			return nil, fmt.Errorf("%w: %s is not in directory %d of %s", errStale, f.Path, f.Priority, strings.Join(o.Dirs, ", "))
		}
		prio[i] = f.Priority
		if f.Bound && (bound < 0 || prio[i] > prio[bound]) {
			bound = i
		}
	}
	type owner struct {
		file     int
		conflict []string
	}
	owners := map[string]*owner{}
	for i, f := range idx.Files {
		for _, d := range f.Devices {
			prev := owners[d]
			switch {
			case prev == nil || prio[prev.file] < prio[i]:
				owners[d] = &owner{file: i}
			case prio[prev.file] == prio[i]:
				prev.conflict = append(prev.conflict, f.Path)
			}
		}
	}
	specs := map[int]*cdi.Spec{}
	var out []*cdi.Device
	var missing, conflicts, unsure []string
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
		if bound >= 0 && prio[bound] >= prio[w.file] {
			unsure = append(unsure, fmt.Sprintf("%s (defined in %s)", n, idx.Files[w.file].Path))
			continue
		}
		spec := specs[w.file]
		if spec == nil {
			spec = idx.parsed[idx.Files[w.file].Path]
		}
		if spec == nil {
			f := idx.Files[w.file]
			var err error
			if spec, _, err = readSpec(f.Path, prio[w.file], o.MaxSpecSize); err != nil {
				return nil, fmt.Errorf("%w: %v", errStale, err)
			}
			specs[w.file] = spec
		}
		kind, name, _ := strings.Cut(n, "=")
		d := spec.GetDevice(name)
		if d == nil || spec.Kind != kind {
			return nil, fmt.Errorf("%w: %s no longer defines %s", errStale, idx.Files[w.file].Path, n)
		}
		if err := relativeHook(d, idx.Files[w.file].Path); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	if len(conflicts) > 0 {
		return nil, fmt.Errorf("CDI devices defined twice in one spec directory: %s: remove one of the files", strings.Join(conflicts, "; "))
	}
	if len(unsure) > 0 {
		b := idx.Files[bound]
		return nil, fmt.Errorf("CDI devices %s: %s was not read (%s) and, in a directory of the same or a higher priority, may define them too: shrink or remove it",
			strings.Join(unsure, ", "), b.Path, b.Skipped)
	}
	if len(missing) > 0 {
		skipped, unusable := skippedFor(idx, missing)
		return nil, &NotFoundError{Names: missing, Dirs: idx.Dirs, Skipped: skipped, Unusable: unusable}
	}
	return out, nil
}

// NotFoundError is returned for names no spec read defines.
type NotFoundError struct {
	Names, Dirs []string
	// Skipped are the spec files (or directories) not read, with why:
	// one of them may define the names.
	Skipped []string
	// Unusable are the spec files read that do not parse (or could not be
	// read whole), each with the error: one of them may define the names.
	Unusable []string
}

func (e *NotFoundError) Error() string {
	names, dirs := strings.Join(e.Names, ", "), strings.Join(e.Dirs, ", ")
	s := fmt.Sprintf("CDI devices %s are not in any spec under %s: generate one (gantry cdi generate) or fix the names", names, dirs)
	if len(e.Unusable) > 0 {
		// A spec is there; it is broken, not missing.
		s = fmt.Sprintf("CDI devices %s are in no spec under %s that Gantry can use, and %s: fix or regenerate it (gantry cdi generate), or fix the names", names, dirs, strings.Join(e.Unusable, "; "))
	}
	if len(e.Skipped) > 0 {
		s += "; not read, and may define them: " + strings.Join(e.Skipped, "; ")
	}
	return s
}

// skippedFor lists the files and directories the index skipped, those whose
// name has a wanted vendor first, at most 5: those not read, and apart the
// ones read that were unusable (a spec that does not parse), each "FILE
// does not parse: ERROR" or "FILE: ERROR".
func skippedFor(idx *index, names []string) (skipped, unusable []string) {
	var first, rest []string
	for _, f := range idx.Files {
		if f.Skipped == "" {
			continue
		}
		if why, ok := strings.CutPrefix(f.Skipped, unusablePrefix); ok {
			if parse, ok := strings.CutPrefix(why, parsePrefix); ok {
				unusable = append(unusable, f.Path+" does not parse: "+parse)
			} else {
				unusable = append(unusable, f.Path+": "+why)
			}
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
	if len(unusable) > 5 {
		unusable = append(unusable[:5], fmt.Sprintf("%d more", len(unusable)-5))
	}
	return out, unusable
}

// The reasons a file read is recorded as unusable (file.Skipped): a read
// error, or with parsePrefix too the parser's error.
const (
	unusablePrefix = "unusable: "
	parsePrefix    = "parse: "
)

// errNotRegular is readBounded's refusal of what is not a regular file.
var errNotRegular = errors.New("not a regular file")

// overError is readBounded's refusal of a file larger than its limit.
type overError struct {
	Size  int64 // what fstat said, or the bytes read when it grew since
	Limit int64
}

func (e *overError) Error() string {
	return fmt.Sprintf("%d bytes, over the %d-byte limit", e.Size, e.Limit)
}

// beforeRead, when set (by tests), is called by readBounded with the path
// it checked, just before it reads the file's bytes.
var beforeRead func(p string)

// readBounded reads the file at p once: opened without waiting for a
// writer (O_NONBLOCK: a FIFO swapped in after a stat is not waited on),
// checked through that descriptor (fstat) to be a regular file of at most
// limit bytes, and read for at most limit+1 bytes, so that a file grown
// since is refused, not read whole. st is the stamp of the file opened.
func readBounded(p string, limit int64) (data []byte, st stamp, err error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, stamp{Absent: true}, &os.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	var fs unix.Stat_t
	if err := unix.Fstat(fd, &fs); err != nil {
		return nil, stamp{Absent: true}, &os.PathError{Op: "fstat", Path: p, Err: err}
	}
	st = stamp{Dev: uint64(fs.Dev), Ino: fs.Ino, Size: fs.Size, Mode: fs.Mode,
		Mtime: fs.Mtim.Nano(), Ctime: fs.Ctim.Nano()}
	if fs.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, st, errNotRegular
	}
	if fs.Size > limit {
		return nil, st, &overError{Size: fs.Size, Limit: limit}
	}
	if beforeRead != nil {
		beforeRead(p)
	}
	want := limit + 1 // a byte over the limit: a file grown since the fstat shows
	data = make([]byte, 0, min(fs.Size+1, want))
	for int64(len(data)) < want {
		if len(data) == cap(data) {
			data = slices.Grow(data, int(min(want-int64(len(data)), 64<<10)))
		}
		n, err := unix.Read(fd, data[len(data):min(int64(cap(data)), want)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, st, &os.PathError{Op: "read", Path: p, Err: err}
		}
		if n == 0 {
			return data, st, nil
		}
		data = data[:len(data)+n]
	}
	return nil, st, &overError{Size: int64(len(data)), Limit: limit}
}

// parseSpec parses and checks the bytes of the spec file p with the
// library's parser and checks. The library reads specs only from a path, so
// the bytes (read once, bounded) go to a sealed memfd that it reads through
// /proc/self/fd: the file itself is never read again. The Spec's GetPath
// is then that of the memfd, not p; errors name p.
func parseSpec(p string, data []byte, priority int) (*cdi.Spec, error) {
	fd, err := unix.MemfdCreate("cdi-spec", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	defer unix.Close(fd)
	for b := data; len(b) > 0; {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: copying to a memfd: %w", p, err)
		}
		b = b[n:]
	}
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		return nil, fmt.Errorf("%s: sealing its memfd: %w", p, err)
	}
	fdPath := "/proc/self/fd/" + strconv.Itoa(fd)
	spec, err := cdi.ReadSpec(fdPath, priority)
	if err != nil {
		return nil, errors.New(strings.ReplaceAll(err.Error(), fdPath, p))
	}
	return spec, nil
}

// readSpec reads the spec at p, a regular file of at most max bytes, once
// (readBounded), with the library's parser and checks (parseSpec).
func readSpec(p string, priority int, max int64) (*cdi.Spec, stamp, error) {
	data, st, err := readBounded(p, max)
	if err != nil {
		return nil, st, err
	}
	specReads.Add(1)
	spec, err := parseSpec(p, data, priority)
	return spec, st, err
}

// specReads counts the spec files parsed, for the tests.
var specReads atomic.Int64

// build reads the directories into an index, within o's limits. The total
// budget is spent on the highest-priority directory first: a limit skips
// the files of lower priority before those that override them.
func build(o Options) *index {
	idx := &index{Format: indexFormat, Dirs: o.Dirs, MaxSpecs: o.MaxSpecs, MaxSpecSize: o.MaxSpecSize, MaxTotal: o.MaxTotal,
		DirStamps: make([]stamp, len(o.Dirs)), parsed: map[string]*cdi.Spec{}}
	files := make([][]file, len(o.Dirs))
	notes := make([][]string, len(o.Dirs))
	total := int64(0)
	for prio := len(o.Dirs) - 1; prio >= 0; prio-- {
		dir := o.Dirs[prio]
		idx.DirStamps[prio] = stampOf(dir)
		names, more := listSpecs(dir)
		if more {
			note := fmt.Sprintf("%s: over %d entries, the rest not looked at", dir, maxNames)
			notes[prio] = append(notes[prio], note)
			o.Warn("CDI spec directory " + note)
		}
		read := 0
		for _, n := range names {
			p := filepath.Join(dir, n)
			files[prio] = append(files[prio], buildFile(o, p, prio, &read, &total, idx.parsed))
		}
	}
	for prio := range o.Dirs {
		idx.Files = append(idx.Files, files[prio]...)
		idx.DirNotes = append(idx.DirNotes, notes[prio]...)
	}
	return idx
}

// buildFile is build's entry for the spec file p, read if within the limits
// (read files of its directory so far, total bytes so far).
func buildFile(o Options, p string, prio int, read *int, total *int64, parsed map[string]*cdi.Spec) file {
	f := file{Path: p, Priority: prio, Stamp: stampOf(p)}
	sizeSkip := func(size int64) {
		f.Skipped = fmt.Sprintf("%d bytes, over the %d-byte limit of a spec file", size, o.MaxSpecSize)
		f.Bound = true
	}
	totalSkip := func() {
		f.Skipped = fmt.Sprintf("over %d bytes of spec files in all", o.MaxTotal)
		f.Bound = true
	}
	switch {
	case f.Stamp.Absent, f.Stamp.Mode&syscall.S_IFMT == syscall.S_IFDIR:
		// Missing (a dangling link) or a directory: no spec, as the
		// library has it, but kept with its stamp, so that a spec
		// appearing there is seen.
	case f.Stamp.Mode&syscall.S_IFMT != syscall.S_IFREG:
		f.Skipped = errNotRegular.Error()
	case *read >= o.MaxSpecs:
		f.Skipped = fmt.Sprintf("over %d spec files in %s", o.MaxSpecs, filepath.Dir(p))
		f.Bound = true
	case f.Stamp.Size > o.MaxSpecSize:
		sizeSkip(f.Stamp.Size)
	case *total+f.Stamp.Size > o.MaxTotal:
		totalSkip()
	default:
		*read++
		data, st, err := readBounded(p, min(o.MaxSpecSize, o.MaxTotal-*total))
		if !st.Absent || errors.Is(err, os.ErrNotExist) {
			f.Stamp = st
		}
		*total += int64(len(data))
		var over *overError
		switch {
		case errors.Is(err, os.ErrNotExist):
			// Gone since the stat: recorded absent.
		case errors.As(err, &over) && over.Size > o.MaxSpecSize:
			sizeSkip(over.Size)
		case over != nil:
			totalSkip()
		case err != nil:
			f.Skipped = err.Error()
			if !errors.Is(err, errNotRegular) {
				f.Skipped = unusablePrefix + f.Skipped
			}
		default:
			specReads.Add(1)
			spec, err := parseSpec(p, data, prio)
			if err != nil {
				f.Skipped = unusablePrefix + parsePrefix + err.Error()
				break
			}
			parsed[p] = spec
			for _, name := range sortedDevices(spec) {
				f.Devices = append(f.Devices, spec.Kind+"="+name)
			}
		}
	}
	if f.Skipped != "" && !strings.HasPrefix(f.Skipped, unusablePrefix) {
		o.Warn(fmt.Sprintf("CDI spec %s not read: %s", p, f.Skipped))
	}
	return f
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
	f, err := os.OpenFile(indexPath(o), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
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

// relativeHook refuses a device whose edits (or its spec's) run a hook
// named by a relative path: runc and crun run hooks with the container's
// root filesystem as their working directory, so the image's file of that
// name would run as root on the host.
func relativeHook(d *cdi.Device, path string) error {
	for _, hooks := range [][]*cdispecs.Hook{d.ContainerEdits.Hooks, d.GetSpec().ContainerEdits.Hooks} {
		for _, h := range hooks {
			if h != nil && !filepath.IsAbs(h.Path) {
				return fmt.Errorf("refusing CDI device %s: the spec %s has a %s hook with the relative path %q, which a runtime resolves in the container's root filesystem (the image's file would run as root on the host): give the hook an absolute path (gantry doctor names such specs; gantry cdi fix-hooks rewrites Gantry's and NVIDIA's)", d.GetQualifiedName(), path, h.HookName, h.Path)
			}
		}
	}
	return nil
}
