package engineconfig

import (
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
)

// BackupSuffix is appended to a configuration's path for the copy of the
// old content that Apply and ApplyContainerdDropIn keep each time they
// replace an existing file (the file as it was before the latest change).
const BackupSuffix = ".gantry-backup"

// Apply edits the engine configuration at path (a missing file is created,
// with its directory). It returns a unified diff of the change and the
// change list from Plan, followed by what checked the result and where the
// old file was kept; both are empty when the file is already configured,
// in which case nothing is written. With dryRun nothing is written either.
//
// Before anything is written, the result is read by the engine's own
// parser where its program is found (opts.EngineBinary, else on PATH):
// containerd's `config dump`, which must also show the default runtime's
// entry and every runtime asked for; `dockerd --validate` (Docker 23+;
// dockerd 20.10 has none, and the result is checked by Gantry's stricter
// reading of its runtimes instead); `crio config`. A result the engine
// would not load is refused (ErrEngineRejects) and the file is left as it
// was. Otherwise the old content is kept as path+BackupSuffix and the new
// content replaces the file atomically (same directory temp file, fsync,
// rename), keeping its mode and owner; a symlinked path is followed and
// its target replaced. Errors name the file; on error the file is
// unchanged.
func Apply(engine Engine, path string, opts Options, dryRun bool) (diff string, changes []string, err error) {
	target, err := resolveTarget(path)
	if err != nil {
		return "", nil, err
	}
	current, exists, err := readIfExists(target, path)
	if err != nil {
		return "", nil, err
	}
	normOpts, names, err := opts.normalize(engine)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", path, err)
	}
	source, sourceNote, err := readSource(engine, path, current, normOpts)
	if err != nil {
		return "", nil, err
	}
	r, err := plan(engine, source, opts)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(r.changes) == 0 {
		return "", nil, nil
	}
	if sourceNote != "" {
		r.changes = append([]string{sourceNote}, r.changes...)
	}
	from := path
	if !exists {
		from = "/dev/null"
	}
	diff = unifiedDiff(from, path, current, r.updated)
	checked, err := checkEngine(engine, filepath.Clean(path), r.updated, normOpts, names)
	if err != nil {
		return "", nil, err
	}
	if checked != "" {
		r.changes = append(r.changes, checked)
	}
	if dryRun {
		return diff, r.changes, nil
	}
	if err := writeConfig(target, path, r.updated, exists); err != nil {
		return "", nil, err
	}
	if exists {
		r.changes = append(r.changes, "kept the old file as "+path+BackupSuffix)
	}
	return diff, r.changes, nil
}

// readSource is the configuration Apply edits: the file's content, or
// with SourceCommand the engine's own view of it. The note says which
// when it is not the file.
func readSource(engine Engine, path string, current []byte, opts Options) ([]byte, string, error) {
	d, ok := Lookup(engine)
	if !ok {
		return current, "", nil // plan names the unknown engine
	}
	switch opts.Source {
	case SourceCommand:
	case SourceCommandOrFile:
		if bin, _ := findEngine(engine, opts); bin == "" || d.Source == nil {
			return current, "", nil
		}
	default:
		return current, "", nil
	}
	if d.Source == nil {
		// dockerd has no command that prints its configuration; NVIDIA's
		// tool falls back to the file too.
		return current, fmt.Sprintf("--config-source=command: %s has no command that prints its configuration: read %s as a file", d.Program, path), nil
	}
	bin, why := findEngine(engine, opts)
	return d.Source(bin, why, path, current)
}

// checkEngine has the engine's own parser read the planned content of
// path before it is written (see Apply); the line returned goes in the
// change list.
func checkEngine(engine Engine, path string, planned []byte, opts Options, names []string) (string, error) {
	d, ok := Lookup(engine)
	if !ok {
		return "", nil
	}
	if d.Check == nil {
		return fmt.Sprintf("not checked by %s itself (Gantry has no check that runs it): read back by Gantry's reader only", d.Program), nil
	}
	bin, why := "", "the engine check is off (--no-engine-check)"
	if !opts.SkipEngineCheck {
		bin, why = findEngine(engine, opts)
	}
	line, err := d.Check(bin, path, planned, opts, names)
	if err == nil && bin == "" && line == "" {
		line = fmt.Sprintf("not checked by %s itself (%s): read back by Gantry's reader only", d.Program, why)
	}
	return line, err
}

// writeFileAtomic replaces path with data so that readers see either the
// old or the new content, never a partial file, even across a crash: the
// data is written to a temp file in the same directory, synced, renamed
// over path, and the directory is synced. On failure the temp file is
// removed. uid/gid of -1 leave ownership as created.
func writeFileAtomic(path string, data []byte, mode fs.FileMode, uid, gid int) error {
	return atomicfile.Write(path, data, atomicfile.Options{Mode: mode, Chown: uid >= 0 || gid >= 0, UID: uid, GID: gid, Sync: true})
}
