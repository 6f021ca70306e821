// Package ocibundle reads what Gantry's front ends are handed about a container:
// an OCI bundle's config.json and the OCI state a runtime gives hooks on
// stdin, with bounds, so that a bundle whose config.json is a FIFO, a
// device or a huge file costs an error rather than a hung runtime or
// gigabytes of memory.
//
// The engine writes the bundle and runs Gantry, so the bundle is trusted to
// be the engine's; but it is the last stop before every container starts
// and a mistake there (or a file planted by whoever can write the bundle
// directory) must fail one container with an error that names it, never
// block the engine's every create.
package ocibundle

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// MaxSpecSize bounds config.json. Real specs are a few KiB, and tens of KiB
// with hundreds of mounts; 16 MiB leaves room for any real one while a
// 200 MB spec (which cost 1.56 GB of memory to decode) is refused.
const MaxSpecSize = 16 << 20

// MaxStateSize bounds the OCI state on a hook's stdin: an id, a pid, a
// bundle path and the annotations.
const MaxStateSize = 1 << 20

// ErrTooLarge is returned for an input over its bound.
var ErrTooLarge = errors.New("too large")

// ErrNotRegular is returned for a config.json that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// SpecPath is the path of dir's config.json.
func SpecPath(dir string) string { return filepath.Join(dir, "config.json") }

// ReadSpec reads the bundle's config.json: a regular file (a FIFO, socket or
// device is refused without blocking on it) of at most MaxSpecSize bytes.
func ReadSpec(dir string) ([]byte, error) {
	return ReadRegular(SpecPath(dir), "the bundle's config.json", MaxSpecSize)
}

// ReadRegular reads the regular file at p, of at most max bytes; what names
// the file in errors. The open does not block (O_NONBLOCK), so a FIFO in the
// file's place is refused at once.
func ReadRegular(p, what string, max int64) ([]byte, error) {
	return readRegular(p, what, max, 0)
}

// ReadRegularNoFollow is ReadRegular for a file that must not be a
// symbolic link (root's own state files: a link there is refused).
func ReadRegularNoFollow(p, what string, max int64) ([]byte, error) {
	return readRegular(p, what, max, syscall.O_NOFOLLOW)
}

func readRegular(p, what string, max int64, flags int) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC|flags, 0)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s is %s, %w: the engine must write a regular file there", what, p, describe(st.Mode()), ErrNotRegular)
	}
	if st.Size() > max {
		return nil, fmt.Errorf("%s %s is %d bytes, %w (the limit is %d): refusing to read it", what, p, st.Size(), ErrTooLarge, max)
	}
	b, err := ReadAtMost(f, max, what+" "+p)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// ReadAtMost reads r to its end, failing once it gives more than max bytes
// (named what in the error) rather than truncating or reading on.
func ReadAtMost(r io.Reader, max int64, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is over %d bytes: %w", what, max, ErrTooLarge)
	}
	return b, nil
}

func describe(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m.IsDir():
		return "a directory"
	}
	return "not a regular file (" + m.Type().String() + ")"
}
