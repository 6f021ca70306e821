package engineconfig

import (
	"fmt"
	"io/fs"
	"os"
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
	switch opts.Source {
	case SourceCommand:
	case SourceCommandOrFile:
		if bin, _ := findEngine(engine, opts); bin == "" || engine == Docker {
			return current, "", nil
		}
	default:
		return current, "", nil
	}
	switch engine {
	case Containerd:
		bin, why := findEngine(engine, opts)
		if bin == "" {
			return nil, "", fmt.Errorf("%w: --config-source=command runs `containerd config dump`, but %s: give the binary (--executable-path) or use --config-source=file", ErrInvalidOptions, why)
		}
		if current == nil {
			// containerd's dump of a missing file is its built-in
			// configuration; a file is made from it.
			dir, err := os.MkdirTemp("", "gantry-containerd-source-")
			if err != nil {
				return nil, "", err
			}
			defer os.RemoveAll(dir)
			empty := filepath.Join(dir, "config.toml")
			if err := os.WriteFile(empty, nil, 0o600); err != nil {
				return nil, "", err
			}
			path = empty
		}
		dump, err := containerdDump(bin, path)
		if err != nil {
			return nil, "", fmt.Errorf("%w: --config-source=command: containerd cannot load %s as it is: %v: fix it (or use --config-source=file)", ErrEngineRejects, path, err)
		}
		// The dump lists the files it merged under imports, the file
		// itself first; what they hold is in the dump already. The file's
		// own imports stay as they were, so a file that another tool owns
		// keeps being read.
		doc, err := decodeTOML(dump)
		if err != nil {
			return nil, "", fmt.Errorf("%w: `%s config dump` of %s does not parse: %v", ErrEngineRejects, bin, path, err)
		}
		keep := []any{}
		if cur, err := decodeTOML(current); err == nil {
			if list, ok := cur["imports"].([]any); ok {
				keep = list
			}
		}
		dump, _, err = applyTOMLOps(dump, doc, []tomlOp{{key: "imports", value: keep}})
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", path, err)
		}
		return dump, fmt.Sprintf("started from `%s --config %s config dump` (the file, its imports and containerd's defaults; comments are not kept)", bin, path), nil
	case CRIO:
		bin, why := findEngine(engine, opts)
		if bin == "" {
			return nil, "", fmt.Errorf("%w: --config-source=command runs `crio config`, but %s: give the binary (--executable-path) or use --config-source=file", ErrInvalidOptions, why)
		}
		// crio config prints the whole merged configuration: the
		// drop-in is written from it only when it is the main file.
		if filepath.Base(path) != filepath.Base(CRIOMainConfig) {
			return current, fmt.Sprintf("--config-source=command: %s is a drop-in, which holds only the runtime: read as a file", path), nil
		}
		out, err := runEngine(bin, "--config", path, "config")
		if err != nil {
			return nil, "", fmt.Errorf("%w: --config-source=command: CRI-O cannot load %s as it is: %v: fix it (or use --config-source=file)", ErrEngineRejects, path, err)
		}
		return out, fmt.Sprintf("started from `%s --config %s config`", bin, path), nil
	}
	// dockerd has no command that prints its configuration; NVIDIA's tool
	// falls back to the file too.
	return current, "--config-source=command: dockerd has no command that prints its configuration: read " + path + " as a file", nil
}

// checkEngine has the engine's own parser read the planned content of
// path before it is written (see Apply); the line returned goes in the
// change list.
func checkEngine(engine Engine, path string, planned []byte, opts Options, names []string) (string, error) {
	if engine == Containerd {
		return checkContainerdFiles(path, map[string][]byte{path: planned}, opts, names)
	}
	bin, why := "", "the engine check is off (--no-engine-check)"
	if !opts.SkipEngineCheck {
		bin, why = findEngine(engine, opts)
	}
	switch engine {
	case Docker:
		line, err := checkDocker(bin, path, planned)
		if err == nil && bin == "" {
			line = fmt.Sprintf("not checked by dockerd itself (%s): read back by Gantry's reader only", why)
		}
		return line, err
	case CRIO:
		line, err := checkCRIO(bin, path, planned)
		if err == nil && bin == "" {
			line = fmt.Sprintf("not checked by crio itself (%s): read back by Gantry's reader only", why)
		}
		return line, err
	}
	return "", nil
}

// checkContainerdFiles is checkContainerd with the containerd of opts,
// or the line saying why none checked the files.
func checkContainerdFiles(mainPath string, planned map[string][]byte, opts Options, names []string) (string, error) {
	bin, why := "", "the engine check is off (--no-engine-check)"
	if !opts.SkipEngineCheck {
		bin, why = findEngine(Containerd, opts)
	}
	if bin == "" {
		return fmt.Sprintf("not checked by containerd itself (%s): read back by Gantry's reader only", why), nil
	}
	return checkContainerd(bin, mainPath, planned, opts, names)
}

// writeFileAtomic replaces path with data so that readers see either the
// old or the new content, never a partial file, even across a crash: the
// data is written to a temp file in the same directory, synced, renamed
// over path, and the directory is synced. On failure the temp file is
// removed. uid/gid of -1 leave ownership as created.
func writeFileAtomic(path string, data []byte, mode fs.FileMode, uid, gid int) error {
	return atomicfile.Write(path, data, atomicfile.Options{Mode: mode, Chown: uid >= 0 || gid >= 0, UID: uid, GID: gid, Sync: true})
}
