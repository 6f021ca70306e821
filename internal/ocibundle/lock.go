package ocibundle

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// LockWait is how long Lock waits for another holder of a bundle's lock:
// longer than any create's work, the NVML helper's bound (60 s, package
// discover) included, and far shorter than forever.
const LockWait = 2 * time.Minute

// ErrLocked is returned by Lock when the bundle stayed locked for wait.
var ErrLocked = errors.New("locked")

// Lock takes an exclusive flock on the bundle directory dir, waiting at
// most wait for another holder, so that the create server and an
// in-process create or hook that stopped waiting for it never work on one
// bundle at once. It returns the directory's descriptor (for files kept
// beside config.json, see Marker) and the function that unlocks it.
func Lock(dir string, wait time.Duration) (int, func(), error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, fmt.Errorf("opening the bundle %s: %w", dir, err)
	}
	deadline := time.Now().Add(wait)
	pause := time.Millisecond
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return fd, func() { unix.Close(fd) }, nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			unix.Close(fd)
			return -1, nil, fmt.Errorf("locking the bundle %s: %w", dir, err)
		}
		if time.Now().After(deadline) {
			unix.Close(fd)
			return -1, nil, fmt.Errorf("the bundle %s stayed %w for %v by another Gantry process working on this container (a create server stuck on it? see its log): %w", dir, ErrLocked, wait, err)
		}
		time.Sleep(pause)
		if pause < 20*time.Millisecond {
			pause *= 2
		}
	}
}
