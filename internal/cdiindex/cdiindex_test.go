package cdiindex

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"
)

// specYAML is a spec of kind with one device per name, each setting
// KIND_NAME=tag in the environment.
func specYAML(kind, tag string, names ...string) string {
	s := fmt.Sprintf("cdiVersion: \"0.6.0\"\nkind: %s\ncontainerEdits:\n  env: [\"SPEC=%s\"]\ndevices:\n", kind, tag)
	for _, n := range names {
		s += fmt.Sprintf("- name: %s\n  containerEdits:\n    env: [\"DEV_%s=%s\"]\n", n, n, tag)
	}
	return s
}

func write(t testing.TB, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// apply is injectCDI's application of devs.
func apply(devs []*cdi.Device) *ocispecs.Spec {
	spec := &ocispecs.Spec{Process: &ocispecs.Process{}}
	all := &cdi.ContainerEdits{ContainerEdits: &cdispecs.ContainerEdits{}}
	seen := map[*cdi.Spec]bool{}
	for _, d := range devs {
		if s := d.GetSpec(); !seen[s] {
			seen[s] = true
			all.Append(&cdi.ContainerEdits{ContainerEdits: &s.ContainerEdits})
		}
		all.Append(&cdi.ContainerEdits{ContainerEdits: &d.ContainerEdits})
	}
	if err := all.Apply(spec); err != nil {
		panic(err)
	}
	return spec
}

// The index resolves names as the CDI library's cache does: a later
// directory overrides an earlier one, two files of one directory defining a
// name is a conflict, an invalid spec is left out; the edits applied are
// the library's.
func TestSameAsLibrary(t *testing.T) {
	base := t.TempDir()
	etc, run := filepath.Join(base, "etc"), filepath.Join(base, "run")
	write(t, filepath.Join(etc, "a.yaml"), specYAML("example.com/fpga", "etc-a", "f0", "f1", "dup"))
	write(t, filepath.Join(etc, "b.json"), specYAML("example.com/fpga", "etc-b", "f2", "dup"))
	write(t, filepath.Join(etc, "c.yaml"), specYAML("example.com/nic", "etc-c", "n0", "n1"))
	write(t, filepath.Join(etc, "bad.yaml"), "cdiVersion: [nonsense\n")
	write(t, filepath.Join(etc, "ignored.txt"), specYAML("example.com/fpga", "txt", "t0"))
	write(t, filepath.Join(run, "z.yaml"), specYAML("example.com/fpga", "run-z", "f1"))
	dirs := []string{etc, run}
	lib, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	for _, names := range [][]string{
		{"example.com/fpga=f0"},
		{"example.com/fpga=f1"}, // from run (higher priority)
		{"example.com/fpga=f0", "example.com/fpga=f2", "example.com/nic=n1"},
		{"example.com/fpga=dup"},
		{"example.com/fpga=t0"},
		{"example.com/nic=n9"},
	} {
		t.Run(strings.Join(names, ","), func(t *testing.T) {
			want := &ocispecs.Spec{Process: &ocispecs.Process{}}
			_, libErr := lib.InjectDevices(want, names...)
			devs, err := Devices(Options{Dirs: dirs, CacheDir: t.TempDir()}, names)
			if (err == nil) != (libErr == nil) {
				t.Fatalf("error %v, the library's %v", err, libErr)
			}
			if err != nil {
				return
			}
			if got := apply(devs); !reflect.DeepEqual(got.Process.Env, want.Process.Env) {
				t.Errorf("env %q, the library's %q", got.Process.Env, want.Process.Env)
			}
		})
	}
}

// A spec over the size limit and the files beyond the count limit are
// skipped with a warning; a device they define is not found, and the
// error names the file; a device of the same directory is refused, naming
// the skipped file (it may define that device too); one of a directory of
// higher priority is served. A FIFO is never opened.
func TestBounds(t *testing.T) {
	dir, high := t.TempDir(), t.TempDir()
	for i := 0; i < 6; i++ {
		write(t, filepath.Join(dir, fmt.Sprintf("s%d.yaml", i)), specYAML("example.com/fpga", "x", fmt.Sprintf("f%d", i)))
	}
	big := specYAML("example.com/big", "x", "b0") + "# " + strings.Repeat("x", 8<<10) + "\n"
	write(t, filepath.Join(dir, "big.yaml"), big)
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(high, "h.yaml"), specYAML("example.com/fpga", "high", "h0"))
	var warnings []string
	o := Options{Dirs: []string{dir, high}, CacheDir: t.TempDir(), MaxSpecs: 5, MaxSpecSize: 4 << 10,
		Warn: func(s string) { warnings = append(warnings, s) }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if devs, err := Devices(o, []string{"example.com/fpga=h0"}); err != nil || apply(devs).Process.Env[1] != "DEV_h0=high" {
			t.Errorf("a device of the higher directory: %v", err)
		}
		_, err := Devices(o, []string{"example.com/fpga=f0", "example.com/fpga=f3"})
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "big.yaml")+" was not read") {
			t.Errorf("devices beside a skipped spec: %v; want a refusal naming big.yaml", err)
		}
		_, err = Devices(o, []string{"example.com/big=b0"})
		var nf *NotFoundError
		if !errors.As(err, &nf) || !strings.Contains(err.Error(), filepath.Join(dir, "big.yaml")) || !strings.Contains(err.Error(), "over the 4096-byte limit") {
			t.Errorf("a device of the oversized spec: %v; want an error naming big.yaml and the limit", err)
		}
		// s0..s4 are read (big.yaml sorts first but is skipped for its
		// size, fifo.yaml for its type); s5 is the sixth readable file.
		_, err = Devices(o, []string{"example.com/fpga=f5"})
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "s5.yaml")+": over 5 spec files") {
			t.Errorf("a device beyond the count limit: %v; want an error naming s5.yaml", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("Devices hangs (a FIFO opened?)")
	}
	w := strings.Join(warnings, "\n")
	for _, want := range []string{"big.yaml not read", "s5.yaml not read", "fifo.yaml not read: not a regular file"} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings lack %q:\n%s", want, w)
		}
	}
}

// A spec that grows past the size limit after it was checked is not read
// whole (it was read by path after a stat: a file grown in between was
// read and parsed at any size): its device is not found, the error saying
// it is over the limit.
func TestGrowAfterCheck(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.yaml")
	small := specYAML("example.com/fpga", "x", "f0")
	write(t, p, small)
	grown := small + "# " + strings.Repeat("x", 1<<20) + "\n"
	beforeRead = func(string) {
		if err := os.WriteFile(p, []byte(grown), 0o644); err != nil {
			t.Error(err)
		}
	}
	defer func() { beforeRead = nil }()
	o := Options{Dirs: []string{dir}, MaxSpecSize: 64 << 10}
	_, err := Devices(o, []string{"example.com/fpga=f0"})
	var nf *NotFoundError
	if !errors.As(err, &nf) || !strings.Contains(err.Error(), p+": ") || !strings.Contains(err.Error(), "over the 65536-byte limit") {
		t.Errorf("a spec grown to 1 MiB after its check: %v; want it not read, over the 65536-byte limit", err)
	}
	// The same in a lookup through a current index.
	beforeRead = nil
	write(t, p, small)
	o.CacheDir = t.TempDir()
	if _, err := Devices(o, []string{"example.com/fpga=f0"}); err != nil {
		t.Fatal(err)
	}
	beforeRead = func(string) {
		// In place: the index's stamp of the file is unchanged only if
		// the size is; grow it after the stamp was compared.
		if err := os.WriteFile(p, []byte(grown), 0o644); err != nil {
			t.Error(err)
		}
	}
	if _, err := Devices(o, []string{"example.com/fpga=f0"}); err == nil {
		t.Error("a spec grown to 1 MiB while a lookup read it was read")
	}
}

// A spec file swapped for a FIFO after it was checked is not waited on
// (opened by path after the stat, a FIFO without a writer blocked the
// create for ever): the file read is the one checked.
func TestFIFOSwap(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.yaml")
	write(t, p, specYAML("example.com/fpga", "x", "f0"))
	swaps := 0
	beforeRead = func(string) {
		fifo := filepath.Join(dir, "fifo.tmp")
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Error(err)
		}
		if err := os.Rename(fifo, p); err != nil {
			t.Error(err)
		}
		swaps++
	}
	defer func() { beforeRead = nil }()
	done := make(chan error, 1)
	go func() {
		_, err := Devices(Options{Dirs: []string{dir}}, []string{"example.com/fpga=f0"})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil || swaps == 0 {
			t.Errorf("the spec checked, then a FIFO at its path: %v (%d swaps); want the checked file's device", err, swaps)
		}
	case <-time.After(2 * time.Minute):
		// Unblock the open: a writer for the FIFO.
		if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		t.Fatal("Devices blocks on a FIFO swapped in after the check")
	}
}

// A FIFO swapped in at random times while indexes are built: no build
// waits on it (at most 2 minutes for 20000 builds; the race is won in
// some of them).
func TestFIFOSwapRace(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.yaml")
	small := specYAML("example.com/fpga", "x", "f0")
	stop := make(chan struct{})
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			r := filepath.Join(dir, "r.tmp")
			os.WriteFile(r, []byte(small), 0o644)
			os.Rename(r, p)
			f := filepath.Join(dir, "f.tmp")
			syscall.Mkfifo(f, 0o644)
			os.Rename(f, p)
		}
	}()
	o := Options{Dirs: []string{dir}}
	o.defaults()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 20000; i++ {
			build(o)
		}
	}()
	select {
	case <-done:
		close(stop)
		<-swapped
	case <-time.After(2 * time.Minute):
		close(stop)
		<-swapped
		// Unblock a build waiting in open(2) on the FIFO.
		if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		t.Fatal("a build blocked on a FIFO swapped in after its check")
	}
}

// An entry of a spec directory that is no spec yet (a dangling link, a
// link to a directory) is in the index: when a spec appears there (the
// directory itself unchanged), the next create sees it, as the library
// does, instead of the lower directory's definition.
func TestIndexSeesLinkTarget(t *testing.T) {
	for _, tc := range []string{"dangling link", "link to a directory"} {
		t.Run(tc, func(t *testing.T) {
			base := t.TempDir()
			etc, run, opt := filepath.Join(base, "etc"), filepath.Join(base, "run"), filepath.Join(base, "opt")
			write(t, filepath.Join(etc, "a.yaml"), specYAML("example.com/fpga", "etc", "f0"))
			target := filepath.Join(opt, "vendor.yaml")
			if err := os.MkdirAll(opt, 0o755); err != nil {
				t.Fatal(err)
			}
			if tc == "link to a directory" {
				if err := os.Mkdir(target, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.MkdirAll(run, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, filepath.Join(run, "vendor.yaml")); err != nil {
				t.Fatal(err)
			}
			dirs := []string{etc, run}
			o := Options{Dirs: dirs, CacheDir: t.TempDir()}
			devs, err := Devices(o, []string{"example.com/fpga=f0"})
			if err != nil || apply(devs).Process.Env[1] != "DEV_f0=etc" {
				t.Fatalf("before: %v", err)
			}
			if err := os.RemoveAll(target); err != nil {
				t.Fatal(err)
			}
			write(t, target, specYAML("example.com/fpga", "run", "f0"))
			devs, err = Devices(o, []string{"example.com/fpga=f0"})
			if err != nil {
				t.Fatal(err)
			}
			lib := &ocispecs.Spec{Process: &ocispecs.Process{}}
			c, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
			if _, err := c.InjectDevices(lib, "example.com/fpga=f0"); err != nil {
				t.Fatal(err)
			}
			if got := apply(devs).Process.Env; !reflect.DeepEqual(got, lib.Process.Env) || got[1] != "DEV_f0=run" {
				t.Errorf("after the link's target appeared: %q; the library %q", got, lib.Process.Env)
			}
		})
	}
}

// The total budget goes to the highest-priority directory first: a lower
// directory that fills it does not hide a definition that overrides its
// own (the index served the lower one, the library the higher).
func TestBudgetHighestFirst(t *testing.T) {
	base := t.TempDir()
	etc, run := filepath.Join(base, "etc"), filepath.Join(base, "run")
	write(t, filepath.Join(etc, "a.yaml"), specYAML("example.com/fpga", "etc", "f0"))
	write(t, filepath.Join(etc, "filler.yaml"), specYAML("example.com/other", "x", "o0")+"# "+strings.Repeat("x", 3000)+"\n")
	write(t, filepath.Join(run, "z.yaml"), specYAML("example.com/fpga", "run", "f0"))
	dirs := []string{etc, run}
	total := stampOf(filepath.Join(etc, "a.yaml")).Size + stampOf(filepath.Join(etc, "filler.yaml")).Size + 10
	o := Options{Dirs: dirs, CacheDir: t.TempDir(), MaxTotal: total}
	devs, err := Devices(o, []string{"example.com/fpga=f0"})
	if err != nil || apply(devs).Process.Env[1] != "DEV_f0=run" {
		t.Errorf("a device of the higher directory, the lower filling the budget: %v, %v; want run's", envOf(devs), err)
	}
	// The budget spent on run and etc/a.yaml: filler.yaml is skipped, and
	// etc's devices are refused.
	_, err = Devices(o, []string{"example.com/other=o0"})
	if err == nil || !strings.Contains(err.Error(), "filler.yaml") {
		t.Errorf("a device of the file over the budget: %v; want an error naming it", err)
	}
}

// A device defined in a lower directory is refused when a file of a higher
// one was skipped for its size: that file may override it.
func TestBoundRefusal(t *testing.T) {
	base := t.TempDir()
	etc, run := filepath.Join(base, "etc"), filepath.Join(base, "run")
	write(t, filepath.Join(etc, "a.yaml"), specYAML("example.com/fpga", "etc", "f0"))
	big := filepath.Join(run, "big.yaml")
	write(t, big, specYAML("example.com/fpga", "run", "f0")+"# "+strings.Repeat("x", 8<<10)+"\n")
	o := Options{Dirs: []string{etc, run}, CacheDir: t.TempDir(), MaxSpecSize: 4 << 10}
	devs, err := Devices(o, []string{"example.com/fpga=f0"})
	if err == nil || !strings.Contains(err.Error(), big+" was not read") || !strings.Contains(err.Error(), "over the 4096-byte limit") {
		t.Errorf("a device overridden by a skipped spec: %v, %q; want a refusal naming %s", err, envOf(devs), big)
	}
}

// A conflict in a lower directory (two files defining a name) is overridden
// by a definition in a higher directory: the higher one is served. The CDI
// library v1.1.1 drops the name (doc.go says why the index does not).
func TestConflictOverridden(t *testing.T) {
	base := t.TempDir()
	etc, run := filepath.Join(base, "etc"), filepath.Join(base, "run")
	write(t, filepath.Join(etc, "a.yaml"), specYAML("example.com/fpga", "etc-a", "f0"))
	write(t, filepath.Join(etc, "b.yaml"), specYAML("example.com/fpga", "etc-b", "f0"))
	write(t, filepath.Join(run, "z.yaml"), specYAML("example.com/fpga", "run-z", "f0"))
	devs, err := Devices(Options{Dirs: []string{etc, run}, CacheDir: t.TempDir()}, []string{"example.com/fpga=f0"})
	if err != nil || apply(devs).Process.Env[1] != "DEV_f0=run-z" {
		t.Errorf("a lower conflict under a higher definition: %q, %v; want run-z's", envOf(devs), err)
	}
	// Within the highest directory a conflict stays one.
	write(t, filepath.Join(run, "y.yaml"), specYAML("example.com/fpga", "run-y", "f0"))
	if _, err := Devices(Options{Dirs: []string{etc, run}, CacheDir: t.TempDir()}, []string{"example.com/fpga=f0"}); err == nil || !strings.Contains(err.Error(), "defined twice") {
		t.Errorf("a conflict in the highest directory: %v", err)
	}
}

func envOf(devs []*cdi.Device) []string {
	if devs == nil {
		return nil
	}
	return apply(devs).Process.Env
}

// With the index current, a create parses only the spec that defines its
// device; a spec added, changed in place or removed is seen by the next.
func TestIndexCached(t *testing.T) {
	dir := t.TempDir()
	for i := 0; i < 50; i++ {
		write(t, filepath.Join(dir, fmt.Sprintf("s%02d.yaml", i)), specYAML("example.com/fpga", "x", fmt.Sprintf("f%d", i)))
	}
	o := Options{Dirs: []string{dir, filepath.Join(dir, "absent")}, CacheDir: t.TempDir()}
	get := func(name string) (string, int64, error) {
		before := specReads.Load()
		devs, err := Devices(o, []string{name})
		if err != nil {
			return "", specReads.Load() - before, err
		}
		return apply(devs).Process.Env[1], specReads.Load() - before, nil
	}
	if _, n, err := get("example.com/fpga=f7"); err != nil || n != 50 {
		t.Fatalf("first create: %d specs read, %v; want all 50", n, err)
	}
	if env, n, err := get("example.com/fpga=f9"); err != nil || n != 1 || env != "DEV_f9=x" {
		t.Fatalf("second create: %q, %d specs read, %v; want 1", env, n, err)
	}
	// A new spec: the directory changed.
	write(t, filepath.Join(dir, "new.yaml"), specYAML("example.com/fpga", "new", "g0"))
	if env, _, err := get("example.com/fpga=g0"); err != nil || env != "DEV_g0=new" {
		t.Fatalf("a new spec's device: %q, %v", env, err)
	}
	// A spec rewritten in place (the directory unchanged).
	write(t, filepath.Join(dir, "s03.yaml"), specYAML("example.com/fpga", "changed", "f3", "h3"))
	if env, _, err := get("example.com/fpga=h3"); err != nil || env != "DEV_h3=changed" {
		t.Fatalf("a device added in place: %q, %v", env, err)
	}
	if _, n, err := get("example.com/fpga=f1"); err != nil || n != 1 {
		t.Fatalf("after the change: %d specs read, %v; want 1", n, err)
	}
	if err := os.Remove(filepath.Join(dir, "s01.yaml")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get("example.com/fpga=f1"); err == nil {
		t.Fatal("a removed spec's device was found")
	}
}

// An index file that is not root's own (another owner, writable by others)
// or names a file outside the spec directories is not used.
func TestIndexNotOurs(t *testing.T) {
	dir, cache := t.TempDir(), t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), specYAML("example.com/fpga", "a", "f0"))
	outside := filepath.Join(t.TempDir(), "evil.yaml")
	write(t, outside, specYAML("example.com/fpga", "evil", "f0"))
	o := Options{Dirs: []string{dir}, CacheDir: cache}
	o.defaults()
	if _, err := Devices(o, []string{"example.com/fpga=f0"}); err != nil {
		t.Fatal(err)
	}
	p := indexPath(o)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	// The same index, its file now the one outside.
	evil := strings.ReplaceAll(string(b), filepath.Join(dir, "a.yaml"), outside)
	st := stampOf(outside)
	evil = strings.Replace(evil, string(mustJSON(t, stampOf(filepath.Join(dir, "a.yaml")))), string(mustJSON(t, st)), 1)
	if err := os.WriteFile(p, []byte(evil), 0o600); err != nil {
		t.Fatal(err)
	}
	devs, err := Devices(o, []string{"example.com/fpga=f0"})
	if err != nil || apply(devs).Process.Env[1] != "DEV_f0=a" {
		t.Errorf("an index naming a file outside the dirs: %v, %v; want the spec in the directory", devs, err)
	}
	// Devices rewrote a good index; one writable by others is not read.
	if idx, _ := loadIndex(o); idx == nil {
		t.Fatal("the index just written is not used")
	}
	if err := os.Chmod(p, 0o620); err != nil {
		t.Fatal(err)
	}
	if idx, _ := loadIndex(o); idx != nil {
		t.Error("a group-writable index was used")
	}
}

// An index file whose priorities were changed (the lower directory's
// file given the higher's) is not believed: a file's priority is its
// directory's place in Options.Dirs.
func TestIndexPriorityChecked(t *testing.T) {
	base := t.TempDir()
	etc, run := filepath.Join(base, "etc"), filepath.Join(base, "run")
	write(t, filepath.Join(etc, "a.yaml"), specYAML("example.com/fpga", "etc", "f0"))
	write(t, filepath.Join(run, "z.yaml"), specYAML("example.com/fpga", "run", "f0"))
	o := Options{Dirs: []string{etc, run}, CacheDir: t.TempDir()}
	o.defaults()
	if _, err := Devices(o, []string{"example.com/fpga=f0"}); err != nil {
		t.Fatal(err)
	}
	var idx index
	b, err := os.ReadFile(indexPath(o))
	if err != nil || json.Unmarshal(b, &idx) != nil {
		t.Fatal(err)
	}
	for i := range idx.Files {
		idx.Files[i].Priority = 1 - idx.Files[i].Priority
	}
	if err := os.WriteFile(indexPath(o), mustJSON(t, &idx), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := loadIndex(o); got == nil {
		t.Fatal("the changed index is not loaded: the test proves nothing")
	}
	devs, err := Devices(o, []string{"example.com/fpga=f0"})
	if err != nil || apply(devs).Process.Env[1] != "DEV_f0=run" {
		t.Errorf("with the priorities swapped in the index file: %q, %v; want run's definition", envOf(devs), err)
	}
}

// The index file is not followed through a symbolic link (the cache
// directory's entry must be the file itself).
func TestIndexNoFollow(t *testing.T) {
	dir, cache := t.TempDir(), t.TempDir()
	for i := 0; i < 5; i++ {
		write(t, filepath.Join(dir, fmt.Sprintf("s%d.yaml", i)), specYAML("example.com/fpga", "x", fmt.Sprintf("f%d", i)))
	}
	o := Options{Dirs: []string{dir}, CacheDir: cache}
	o.defaults()
	if _, err := Devices(o, []string{"example.com/fpga=f0"}); err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(t.TempDir(), "index.json")
	if err := os.Rename(indexPath(o), elsewhere); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, indexPath(o)); err != nil {
		t.Fatal(err)
	}
	if idx, _ := loadIndex(o); idx != nil {
		t.Error("an index reached through a symbolic link was used")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// 1001 specs in one directory, one device named per create: the CDI
// library's cache as the runtime made it on every create, against the
// index (current, and built afresh).
func BenchmarkCDI1001(b *testing.B) {
	dir := b.TempDir()
	for i := 0; i < 1001; i++ {
		write(b, filepath.Join(dir, fmt.Sprintf("vendor%04d.yaml", i)), specYAML(fmt.Sprintf("vendor%d.example.com/dev", i), "x", "d0", "d1"))
	}
	name := []string{"vendor500.example.com/dev=d1"}
	b.Run("library", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			c, _ := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
			if _, err := c.InjectDevices(&ocispecs.Spec{Process: &ocispecs.Process{}}, name...); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("index", func(b *testing.B) {
		o := Options{Dirs: []string{dir}, CacheDir: b.TempDir()}
		if _, err := Devices(o, name); err != nil { // the index, built once
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := Devices(o, name); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("index-cold", func(b *testing.B) {
		o := Options{Dirs: []string{dir}}
		for i := 0; i < b.N; i++ {
			if _, err := Devices(o, name); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A spec that is there but does not parse is named with its parse error:
// the device is not "in no spec" (what the error said before), the spec
// that should define it is broken. Spec files that were not read are
// still named apart.
func TestUnparseableSpecNamed(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "nvidia.yaml")
	write(t, bad, "cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n- name: 0\n  containerEdits:\n    env: [\"A=1\"]\n  bogus: [\n")
	o := Options{Dirs: []string{dir}, CacheDir: t.TempDir()}
	_, err := Devices(o, []string{"nvidia.com/gpu=0"})
	var nf *NotFoundError
	if !errors.As(err, &nf) {
		t.Fatalf("a device of an unparseable spec: %v; want a NotFoundError", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "not in any spec") || !strings.Contains(msg, bad+" does not parse: ") || !strings.Contains(msg, "yaml") {
		t.Errorf("error %q: want it to name %s and its parse error, not to say the device is in no spec", msg, bad)
	}
	// With the index current, the same.
	if _, err := Devices(o, []string{"nvidia.com/gpu=0"}); err == nil || err.Error() != msg {
		t.Errorf("through the current index: %v, want %q", err, msg)
	}
	// A name no spec defines, beside a good spec, is still not in any spec.
	write(t, bad, specYAML("nvidia.com/gpu", "x", "0"))
	if _, err := Devices(o, []string{"nvidia.com/gpu=1"}); err == nil || !strings.Contains(err.Error(), "not in any spec under "+dir) {
		t.Errorf("a name no spec defines: %v", err)
	}
}
