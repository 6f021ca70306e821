package engineconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
)

// BackupSuffix is appended to a configuration's path for the copy of the
// original that Apply keeps when it had to re-encode the whole file.
const BackupSuffix = ".gantry-backup"

// Apply edits the engine configuration at path (a missing file is created,
// with its directory). It returns a unified diff of the change and the
// change list from Plan; both are empty when the file is already
// configured, in which case nothing is written. With dryRun nothing is
// written either. Otherwise the new content replaces the file atomically
// (same directory temp file, fsync, rename), keeping its mode and owner;
// a symlinked path is followed and its target replaced. Errors name the
// file; on error the file is unchanged.
func Apply(engine Engine, path string, opts Options, dryRun bool) (diff string, changes []string, err error) {
	target := path
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		target = resolved
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", nil, fmt.Errorf("resolving %s: %w", path, err)
	} else if dest, lerr := os.Readlink(path); lerr == nil {
		// A dangling link (for example into a config-management tree not
		// yet populated): create its target rather than replace the link.
		if !filepath.IsAbs(dest) {
			dest = filepath.Join(filepath.Dir(path), dest)
		}
		target = dest
	}
	current, err := os.ReadFile(target)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if !exists {
		current = nil
	}
	r, err := plan(engine, current, opts)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(r.changes) == 0 {
		return "", nil, nil
	}
	from := path
	if !exists {
		from = "/dev/null"
	}
	diff = unifiedDiff(from, path, current, r.updated)
	if dryRun {
		return diff, r.changes, nil
	}

	mode := fs.FileMode(0o644)
	uid, gid := -1, -1
	if exists {
		fi, err := os.Stat(target)
		if err != nil {
			return "", nil, fmt.Errorf("reading %s: %w", path, err)
		}
		mode = fi.Mode().Perm()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(st.Uid), int(st.Gid)
		}
	} else if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return "", nil, fmt.Errorf("creating the directory for %s: %w", path, err)
	}
	if exists && r.lossy {
		if err := writeFileAtomic(target+BackupSuffix, current, mode, uid, gid); err != nil {
			return "", nil, fmt.Errorf("keeping a backup of %s before rewriting it: %w", path, err)
		}
	}
	if err := writeFileAtomic(target, r.updated, mode, uid, gid); err != nil {
		return "", nil, fmt.Errorf("writing %s: %w (the file is unchanged)", path, err)
	}
	return diff, r.changes, nil
}

// writeFileAtomic replaces path with data so that readers see either the
// old or the new content, never a partial file, even across a crash: the
// data is written to a temp file in the same directory, synced, renamed
// over path, and the directory is synced. On failure the temp file is
// removed. uid/gid of -1 leave ownership as created.
func writeFileAtomic(path string, data []byte, mode fs.FileMode, uid, gid int) error {
	return atomicfile.Write(path, data, atomicfile.Options{Mode: mode, Chown: uid >= 0 || gid >= 0, UID: uid, GID: gid, Sync: true})
}
