package lowlevel

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
)

// CacheFile is the file, in the runtime's cache directory, that records
// the versions of the low-level runtimes gantry-runtime ran, by the
// binary's identity: --version runs once per binary, not per create.
const CacheFile = "low-level-runtimes.json"

// maxCache bounds what CheckOnce reads of the cache file.
const maxCache = 64 << 10

type cacheEntry struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Version string `json:"version"`
}

// identity names a file as it is now: device, inode, size, modification
// time. An upgrade of the runtime changes it.
func identity(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d:%d:%d:%d.%09d", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec), nil
}

// CheckOnce returns the warning about the low-level runtime at path (see
// Warning) the first time it sees this binary (its identity), "" every
// other time and when nothing affects it. What it saw is kept in
// dir/CacheFile; with dir "" (no cache) it never probes. Errors (a runtime
// that prints no version) are returned once too, as a warning of their
// own is not worth a create's failure.
func CheckOnce(dir, path string) (string, error) {
	if dir == "" {
		return "", nil
	}
	id, err := identity(path)
	if err != nil {
		return "", err
	}
	file := filepath.Join(dir, CacheFile)
	entries := map[string]cacheEntry{}
	// Read on the create path: never through a link, never waiting on a
	// FIFO, a regular file only (anything else counts as no cache).
	if fd, err := unix.Open(file, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
		f := os.NewFile(uintptr(fd), file)
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			b, _ := io.ReadAll(io.LimitReader(f, maxCache+1))
			if len(b) <= maxCache {
				_ = json.Unmarshal(b, &entries)
			}
		}
		f.Close()
	}
	if e, ok := entries[path]; ok && e.ID == id {
		return "", nil
	}
	ver, perr := Probe(context.Background(), path)
	entries[path] = cacheEntry{ID: id, Name: ver.Name, Version: ver.Version}
	if len(entries) > 64 {
		entries = map[string]cacheEntry{path: entries[path]}
	}
	if b, err := json.Marshal(entries); err == nil {
		if err := os.MkdirAll(dir, 0o755); err == nil {
			_ = atomicfile.Write(file, append(b, '\n'), atomicfile.Options{Mode: 0o644})
		}
	}
	if perr != nil {
		return "", perr
	}
	advs, err := Advisories(ver)
	if err != nil {
		return "", err
	}
	return Warning(path, ver, advs), nil
}
