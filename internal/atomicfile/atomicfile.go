// Package atomicfile replaces a file's content all at once: the data goes
// to a temporary file in the same directory, which is renamed over the
// target, so a reader sees the old file or the new one and never half of
// one, and a failure leaves the old file as it was and no temporary file
// behind. Every file Gantry writes for others to read (CDI specs, engine
// configurations, the container's config.json, caches, label files, the
// migrated configuration) goes through Write.
package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// Options say how the file is written.
type Options struct {
	// Mode is the new file's permission bits (0644 when zero).
	Mode fs.FileMode
	// Chown sets the new file's owner to UID and GID (e.g. the replaced
	// file's, which a rename would otherwise lose); -1 leaves either as
	// created.
	Chown    bool
	UID, GID int
	// Sync flushes the file and then its directory entry to disk before
	// returning (files that must survive a crash: configurations, specs).
	// The per-container hot path leaves it off: its files live in tmpfs or
	// are rebuilt on the next container.
	Sync bool
	// NoReplace fails with fs.ErrExist instead of replacing an existing
	// file (a hard link instead of a rename).
	NoReplace bool
}

// Write replaces path's content with data.
func Write(path string, data []byte, o Options) (err error) {
	s, err := stage(path, data, o)
	if err != nil {
		return err
	}
	if o.NoReplace {
		// Linked, or failed: the temporary name goes either way.
		defer s.Abort()
		if err = os.Link(s.tmp, path); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return &fs.PathError{Op: "write", Path: path, Err: fs.ErrExist}
			}
			return err
		}
	} else if err = s.Commit(); err != nil {
		return err
	}
	if o.Sync {
		// The rename is durable once the directory entry is on disk; a
		// failure here leaves a complete file, so it is not reported.
		dir := filepath.Dir(path)
		if d, derr := os.Open(dir); derr == nil {
			_ = d.Sync()
			_ = d.Close()
		}
	}
	return nil
}

// Staged is a file's new content written beside it (a temporary file in
// the same directory), not yet in its place: Commit puts it there in one
// rename, Abort removes it. It lets a caller write the file while other
// work that decides whether it may replace the old one is still running.
type Staged struct {
	tmp, path string
}

// Stage writes data beside path, with mode, for Commit; no fsync.
func Stage(path string, data []byte, mode os.FileMode) (*Staged, error) {
	return stage(path, data, Options{Mode: mode})
}

// stage writes data to a temporary file beside path as o says (mode,
// owner, fsync), closed and complete; removed again on any error.
func stage(path string, data []byte, o Options) (*Staged, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return nil, err
	}
	s := &Staged{tmp: f.Name(), path: path}
	mode := o.Mode
	if mode == 0 {
		mode = 0o644
	}
	if _, err = f.Write(data); err == nil {
		err = f.Chmod(mode)
	}
	if err == nil && o.Chown {
		err = f.Chown(o.UID, o.GID)
	}
	if err == nil && o.Sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		s.Abort()
		return nil, err
	}
	return s, nil
}

// Commit replaces the file with the staged content.
func (s *Staged) Commit() error {
	if err := os.Rename(s.tmp, s.path); err != nil {
		s.Abort()
		return err
	}
	return nil
}

// Abort removes the staged content; the file stays as it was.
func (s *Staged) Abort() { _ = os.Remove(s.tmp) }
