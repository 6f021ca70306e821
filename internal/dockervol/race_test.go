package dockervol

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/drivervol"
)

// The attack of issue 27: while Docker's Mount and Remove calls come and go,
// the tree of hard links to the host's driver files was at the served path
// without its read-only mount in 12 of 36 samples; a container bound it
// there then (-v without :ro) could write the host's libcuda. An observer
// opens the served path's lib64 over and over and asks its mount whether it
// is read-only (fstatfs of the very directory it opened), during Mount and
// Remove cycles, one after another and racing: every tree it finds there
// must be read-only. Mount-only cycles are the same attack without the
// tree ever going away (each Mount must find the tree protected, not mount
// it again). Each runs on the kernel's mount API and as on a kernel before
// Linux 5.8 (no mount_setattr, no STATX_MNT_ID: drivervol.LegacyKernel).
func TestServedTreeNeverWritable(t *testing.T) {
	needRoot(t)
	for _, kernel := range []struct {
		name   string
		legacy bool
	}{{"mount API", false}, {"before Linux 5.8", true}} {
		for _, remove := range []bool{true, false} {
			name := kernel.name + "/Mount and Remove"
			if !remove {
				name = kernel.name + "/Mount only"
			}
			t.Run(name, func(t *testing.T) {
				drivervol.LegacyKernel.Store(kernel.legacy)
				// Cleanups run last first: the plugin stops before this.
				t.Cleanup(func() { drivervol.LegacyKernel.Store(false) })
				servedTreeNeverWritable(t, remove)
			})
		}
	}
}

func servedTreeNeverWritable(t *testing.T, remove bool) {
	const version = "580.159.04"
	inv := fakeDriver(t, version)
	store := newStore(t)
	dir := t.TempDir()
	plugin(t, dir, store, inv)
	c := newClient(t, dir)
	vol := VolumeName(version)
	lib64 := filepath.Join(store.Path(version), "lib64")

	var ro, rw atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			fd, err := unix.Open(lib64, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			var st unix.Statfs_t
			if unix.Fstatfs(fd, &st) == nil {
				if st.Flags&unix.ST_RDONLY != 0 {
					ro.Add(1)
				} else {
					rw.Add(1)
				}
			}
			unix.Close(fd)
		}
	}()
	cycle := func(id string) {
		var m mountReply
		c.call("VolumeDriver.Mount", map[string]string{"Name": vol, "ID": id}, &m)
		if remove {
			var e errReply
			c.call("VolumeDriver.Remove", name{vol}, &e)
		}
	}
	for i := 0; i < 40; i++ {
		cycle(fmt.Sprint(i))
	}
	// Racing: two clients at once (errors allowed, a writable tree not).
	var cw sync.WaitGroup
	for g := 0; g < 2; g++ {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for i := 0; i < 20; i++ {
				cycle(fmt.Sprintf("%d-%d", g, i))
			}
		}()
	}
	cw.Wait()
	close(stop)
	wg.Wait()
	t.Logf("the observer found the tree read-only %d times, writable %d times", ro.Load(), rw.Load())
	if rw.Load() > 0 {
		t.Errorf("the driver tree was at the served path without its read-only mount %d times", rw.Load())
	}
	if ro.Load() == 0 {
		t.Error("the observer never saw the tree: it proved nothing")
	}
}
