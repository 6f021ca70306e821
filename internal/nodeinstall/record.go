package nodeinstall

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// recordName is the record's file name in StateDir.
const recordName = "install.json"

// record is what install changed on the host, kept there so that
// uninstall (another process, maybe another image) can undo it.
type record struct {
	Version int    `json:"version"`
	Engine  string `json:"engine"`
	BinDir  string `json:"binDir"`
	// Files are the originals of every file install may write, as they
	// were before the first install.
	Files []savedFile `json:"files"`
	// Binaries are the names install put in BinDir.
	Binaries []string `json:"binaries"`
	// CreatedDirs are directories install made (deepest last); uninstall
	// removes them when they are empty.
	CreatedDirs []string `json:"createdDirs"`
}

// savedFile is one file's original state.
type savedFile struct {
	Path    string      `json:"path"`
	Existed bool        `json:"existed"`
	Data    []byte      `json:"data,omitempty"`
	Mode    fs.FileMode `json:"mode,omitempty"`
	UID     int         `json:"uid,omitempty"`
	GID     int         `json:"gid,omitempty"`
}

// host turns a host path into the path this process opens: p under
// HostRoot, its symlinks resolved as the host resolves them (an absolute
// target, such as /var/run -> /run, is the host's path, not this
// container's). Components that do not exist yet are appended as they are.
func (o *Options) host(p string) string {
	if o.HostRoot == "/" {
		return p
	}
	return filepath.Join(o.HostRoot, resolveIn(o.HostRoot, p))
}

// hostEntry is host for a directory entry itself: its directory resolved
// as host does, the last component not followed (a link to remove).
func (o *Options) hostEntry(p string) string {
	return filepath.Join(o.host(filepath.Dir(p)), filepath.Base(p))
}

// resolveIn resolves p's symlinks inside root and returns the host path.
func resolveIn(root, p string) string {
	rest := strings.Split(strings.Trim(filepath.Clean("/"+p), "/"), "/")
	cur := "/"
	for links := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			if err != nil {
				// Not there (yet): the rest as it is.
				return filepath.Join(append([]string{next}, rest...)...)
			}
			cur = next
			continue
		}
		if links++; links > 40 {
			return filepath.Join(append([]string{next}, rest...)...)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return filepath.Join(append([]string{next}, rest...)...)
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(strings.Trim(target, "/"), "/"), rest...)
	}
	return cur
}

func (o *Options) recordPath() string { return o.host(filepath.Join(o.StateDir, recordName)) }

// loadRecord reads the record; nil when there is none.
func (o *Options) loadRecord() (*record, error) {
	b, err := os.ReadFile(o.recordPath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the install record %s: %w", filepath.Join(o.StateDir, recordName), err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil || r.Version != 1 {
		return nil, fmt.Errorf("the install record %s is not one this gantry wrote (%v): restore the engine's configuration by hand, then remove it", filepath.Join(o.StateDir, recordName), err)
	}
	return &r, nil
}

func (o *Options) saveRecord(r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(o.recordPath(), b, 0o600, -1, -1)
}

// snapshot reads a host file's original state.
func (o *Options) snapshot(p string) (savedFile, error) {
	f := savedFile{Path: p}
	fi, err := os.Lstat(o.host(p))
	if errors.Is(err, fs.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, fmt.Errorf("reading %s: %w", p, err)
	}
	if !fi.Mode().IsRegular() {
		return f, fmt.Errorf("%s is not a regular file (%s): the installer only edits regular files; make it one or name another path", p, fi.Mode().Type())
	}
	data, err := os.ReadFile(o.host(p))
	if err != nil {
		return f, fmt.Errorf("reading %s: %w", p, err)
	}
	f.Existed, f.Data, f.Mode = true, data, fi.Mode().Perm()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		f.UID, f.GID = int(st.Uid), int(st.Gid)
	}
	return f, nil
}

// restore puts one file back as it was: its bytes, mode and owner, or
// removes it when it did not exist.
func (o *Options) restore(f savedFile) error {
	if !f.Existed {
		if err := os.Remove(o.host(f.Path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing %s: %w", f.Path, err)
		}
		return nil
	}
	if cur, err := os.ReadFile(o.host(f.Path)); err == nil && string(cur) == string(f.Data) {
		if fi, err := os.Stat(o.host(f.Path)); err == nil && fi.Mode().Perm() == f.Mode {
			return nil
		}
	}
	if err := writeAtomic(o.host(f.Path), f.Data, f.Mode, f.UID, f.GID); err != nil {
		return fmt.Errorf("restoring %s: %w", f.Path, err)
	}
	return nil
}

// writeAtomic writes data to a temporary file beside path and renames it
// over path, so that a reader sees the old content or the new, never part.
func writeAtomic(path string, data []byte, mode fs.FileMode, uid, gid int) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".gantry-tmp-*")
	if err != nil {
		return err
	}
	name := tmp.Name()
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(name)
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		return err
	}
	if uid >= 0 || gid >= 0 {
		if err := tmp.Chown(uid, gid); err != nil {
			return err
		}
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(name, path); err != nil {
		return err
	}
	ok = true
	return nil
}
