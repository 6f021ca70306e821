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
// error names the file. A FIFO is never opened.
func TestBounds(t *testing.T) {
	dir := t.TempDir()
	for i := 0; i < 6; i++ {
		write(t, filepath.Join(dir, fmt.Sprintf("s%d.yaml", i)), specYAML("example.com/fpga", "x", fmt.Sprintf("f%d", i)))
	}
	big := specYAML("example.com/big", "x", "b0") + "# " + strings.Repeat("x", 8<<10) + "\n"
	write(t, filepath.Join(dir, "big.yaml"), big)
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	var warnings []string
	o := Options{Dirs: []string{dir}, CacheDir: t.TempDir(), MaxSpecs: 5, MaxSpecSize: 4 << 10,
		Warn: func(s string) { warnings = append(warnings, s) }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := Devices(o, []string{"example.com/fpga=f0", "example.com/fpga=f3"}); err != nil {
			t.Errorf("devices within the limits: %v", err)
		}
		_, err := Devices(o, []string{"example.com/big=b0"})
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
