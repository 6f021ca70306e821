package containerhook

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/ldcache"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

const nvDir = "/usr/local/nvidia/lib64"

func openRoot(t *testing.T, dir string) *rootfs.Root {
	t.Helper()
	r, err := rootfs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// runHooks runs both hooks as the CDI spec would for the driver library.
func runHooks(t *testing.T, r *rootfs.Root, warn func(string)) error {
	t.Helper()
	l, err := ParseLink(driverLib + "::" + nvDir + "/libcuda.so.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := CreateSymlinks(r, []Link{l}); err != nil {
		return err
	}
	if warn == nil {
		warn = func(w string) { t.Errorf("unexpected warning: %s", w) }
	}
	return UpdateLDCache(r, []string{nvDir}, warn)
}

func readCache(t *testing.T, p string) *ldcache.Cache {
	t.Helper()
	c, err := ldcache.Open(p)
	if err != nil {
		t.Fatalf("the cache written does not parse: %v", err)
	}
	return c
}

// The real loader, inside the image, finds libcuda.so.1 only thanks to the
// symlink and the cache the hooks write.
func TestHooksMakeLibcudaLoadable(t *testing.T) {
	dir := imageRoot(t, nil)
	if out, err := probe(t, dir); err == nil {
		t.Fatalf("probe found libcuda before the hooks ran: %s", out)
	}
	r := openRoot(t, dir)
	if err := runHooks(t, r, nil); err != nil {
		t.Fatal(err)
	}
	if out, err := probe(t, dir); err != nil || out != wantVersion {
		t.Fatalf("probe after the hooks: %q, %v; want %s", out, err, wantVersion)
	}
	c := readCache(t, filepath.Join(dir, CacheFile))
	if got := c.Lookup("libc.so.6"); len(got) != 1 {
		t.Errorf("the image's libc entry was lost: %v", got)
	}
	if got := c.Lookup("libcuda.so.1"); len(got) != 1 || got[0] != nvDir+"/libcuda.so.1" {
		t.Errorf("libcuda.so.1 entries = %v; want [%s/libcuda.so.1]", got, nvDir)
	}
	if conf, _ := os.ReadFile(filepath.Join(dir, ConfFile)); !strings.Contains(string(conf), "\n"+nvDir+"\n") {
		t.Errorf("%s = %q", ConfFile, conf)
	}
	// Running the hooks again changes nothing.
	before, _ := os.ReadFile(filepath.Join(dir, CacheFile))
	if err := runHooks(t, r, nil); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, CacheFile)); !bytes.Equal(before, after) {
		t.Error("a second run changed the cache")
	}
}

// An image with its own libcuda.so.1 (a stub in a standard directory, in
// the image's cache) must get ours: the loader takes the first of equal
// names, and our entries go first.
func TestOurEntriesWin(t *testing.T) {
	var stubDir string
	dir := imageRoot(t, func(dir string) {
		stubDir = "/usr/lib/stubs"
		mkdirs(t, dir, stubDir)
		copyFile(t, filepath.Join(artifacts, stubLib), filepath.Join(dir, stubDir, "libcuda.so.1"))
		f, _ := os.OpenFile(filepath.Join(dir, "etc/ld.so.conf"), os.O_APPEND|os.O_WRONLY, 0)
		f.WriteString(stubDir + "\n")
		f.Close()
	})
	if out, err := probe(t, dir); err != nil || out != "1" {
		t.Fatalf("probe before the hooks: %q, %v; want the image's stub (1)", out, err)
	}
	if err := runHooks(t, openRoot(t, dir), nil); err != nil {
		t.Fatal(err)
	}
	if out, err := probe(t, dir); err != nil || out != wantVersion {
		t.Fatalf("probe after the hooks: %q, %v; want %s (ours ahead of the image's)", out, err, wantVersion)
	}
	got := readCache(t, filepath.Join(dir, CacheFile)).Lookup("libcuda.so.1")
	if len(got) != 2 || got[0] != nvDir+"/libcuda.so.1" || got[1] != stubDir+"/libcuda.so.1" {
		t.Errorf("libcuda.so.1 entries = %v; want ours, then the image's", got)
	}
}

// The merge keeps ours ahead even when the image's entry sorts first on its
// own (a higher OS version from an ABI note).
func TestMergeOrder(t *testing.T) {
	ours := []ldcache.Entry{{Name: "libcuda.so.1", Path: "/ours/libcuda.so.1", Flags: ldcache.FlagsX8664}}
	image := []ldcache.Entry{
		{Name: "libcuda.so.1", Path: "/img/libcuda.so.1", Flags: ldcache.FlagsX8664, OSVersion: 0x030200},
		{Name: "libcuda.so.1", Path: "/ours/libcuda.so.1", Flags: ldcache.FlagsX8664}, // a previous run's
		{Name: "libc.so.6", Path: "/lib/libc.so.6", Flags: ldcache.FlagsX8664},
	}
	c := &ldcache.Cache{Entries: merge(ours, image)}
	c.Sort()
	b, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ldcache.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Lookup("libcuda.so.1"); len(got) != 2 || got[0] != "/ours/libcuda.so.1" {
		t.Errorf("libcuda.so.1 = %v; want ours first, once", got)
	}
}

// CVE-2025-23267 class: the image's /etc/ld.so.cache is a link to a host
// file. The host file must stay as it was; the container gets a real file.
func TestHostileCacheLink(t *testing.T) {
	dir := imageRoot(t, nil)
	victim := filepath.Join(t.TempDir(), "victim")
	writeFile(t, victim, "host file\n")
	cache := filepath.Join(dir, CacheFile)
	os.Remove(cache)
	if err := os.Symlink(victim, cache); err != nil {
		t.Fatal(err)
	}
	if err := runHooks(t, openRoot(t, dir), nil); err != nil {
		t.Fatalf("hooks with a symlinked cache: %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "host file\n" {
		t.Fatalf("host file written through the image's symlink: %q", b)
	}
	if fi, err := os.Lstat(cache); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the image's %s is not a regular file now: %v", CacheFile, err)
	}
	// The cache started empty (the link led nowhere inside the root), so
	// libc comes from the loader's default directories, libcuda from ours.
	if out, err := probe(t, dir); err != nil || out != wantVersion {
		t.Errorf("probe: %q, %v", out, err)
	}
}

// /etc is an absolute link to a host directory: nothing there may change.
// It resolves inside the root, where it dangles, so the hook fails cleanly;
// once the image has that directory, the files land in it.
func TestHostileEtcLink(t *testing.T) {
	dir := basicRoot(t)
	hostEtc := t.TempDir()
	writeFile(t, filepath.Join(hostEtc, "ld.so.cache"), "host cache\n")
	os.RemoveAll(filepath.Join(dir, "etc"))
	if err := os.Symlink(hostEtc, filepath.Join(dir, "etc")); err != nil {
		t.Fatal(err)
	}
	r := openRoot(t, dir)
	err := UpdateLDCache(r, []string{nvDir}, func(w string) { t.Log(w) })
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("UpdateLDCache with /etc dangling inside the root: %v; want a not-exist error", err)
	}
	hostDirUnchanged(t, hostEtc, map[string]string{"ld.so.cache": "host cache\n"})

	inside := filepath.Join(dir, hostEtc)
	mkdirs(t, inside, ".")
	if err := UpdateLDCache(r, []string{nvDir}, func(w string) { t.Log(w) }); err != nil {
		t.Fatal(err)
	}
	hostDirUnchanged(t, hostEtc, map[string]string{"ld.so.cache": "host cache\n"})
	if got := readCache(t, filepath.Join(inside, "ld.so.cache")).Lookup("libcuda.so.1"); len(got) != 1 {
		t.Errorf("cache inside the root: libcuda.so.1 = %v", got)
	}
	if _, err := os.Stat(filepath.Join(inside, "ld.so.conf.d/000-gantry.conf")); err != nil {
		t.Errorf("conf file not inside the root: %v", err)
	}
}

// A --folder that links to a host directory is listed inside the root
// (the clamped directory), never on the host; so is a library that links
// to a host library.
func TestHostileFolderLinks(t *testing.T) {
	dir := basicRoot(t)
	hostLibs := t.TempDir()
	copyFile(t, filepath.Join(artifacts, hostOnlyLib), filepath.Join(hostLibs, hostOnlyLib))
	mkdirs(t, dir, "usr/local")
	mustT(t, os.Symlink(hostLibs, filepath.Join(dir, "usr/local/evil")))
	mustT(t, os.Symlink("../../../../../../../.."+hostLibs, filepath.Join(dir, "usr/local/evil2")))
	mustT(t, os.Symlink(filepath.Join(hostLibs, hostOnlyLib), filepath.Join(dir, nvDir, hostOnlyLib)))
	r := openRoot(t, dir)
	noHostLib := func() {
		t.Helper()
		c := readCache(t, filepath.Join(dir, CacheFile))
		for e := range c.Libraries() {
			if e.Name == hostOnlyLib {
				t.Errorf("a library from the host entered the cache: %v", e)
			}
		}
	}

	// The library link resolves inside the root (to nothing): skipped.
	if err := UpdateLDCache(r, []string{nvDir}, nil); err != nil {
		t.Fatal(err)
	}
	noHostLib()
	for _, f := range []string{"/usr/local/evil", "/usr/local/evil2"} {
		if err := UpdateLDCache(r, []string{f}, nil); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("--folder %s (dangling inside the root): %v; want not-exist", f, err)
		}
	}
	noHostLib()

	// With the clamped directory present in the image, that is what is listed.
	inside := filepath.Join(dir, hostLibs)
	mkdirs(t, inside, ".")
	copyFile(t, filepath.Join(artifacts, driverLib), filepath.Join(inside, driverLib))
	if err := UpdateLDCache(r, []string{"/usr/local/evil", "/usr/local/evil2"}, nil); err != nil {
		t.Fatal(err)
	}
	noHostLib()
	got := readCache(t, filepath.Join(dir, CacheFile)).Lookup("libcuda.so.1")
	if len(got) != 3 || got[0] != "/usr/local/evil/"+driverLib || got[1] != "/usr/local/evil2/"+driverLib {
		t.Errorf("libcuda.so.1 = %v; want the clamped folders' library first", got)
	}
	hostDirUnchanged(t, hostLibs, nil)
}

func hostDirUnchanged(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		want, ok := files[e.Name()]
		if !ok {
			if e.Name() == hostOnlyLib {
				continue
			}
			t.Errorf("created in a host directory: %s/%s", dir, e.Name())
			continue
		}
		if b, _ := os.ReadFile(filepath.Join(dir, e.Name())); string(b) != want {
			t.Errorf("host file %s/%s changed: %q", dir, e.Name(), b)
		}
	}
}

func mustT(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// An unusable cache in the image (garbage, a FIFO) is replaced, with a
// warning; a directory where the cache goes is an error.
func TestUnusableImageCache(t *testing.T) {
	for _, tc := range []struct {
		name    string
		make    func(p string) error
		wantErr bool
	}{
		{"corrupt", func(p string) error { return os.WriteFile(p, []byte("glibc-ld.so.cache1.1 but not really"), 0o644) }, false},
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o644) }, false},
		{"directory", func(p string) error { return os.Mkdir(p, 0o755) }, true},
		// Sparse: never read whole (the limit is the cache reader's, 16 MiB).
		{"100 MB", func(p string) error {
			if err := os.WriteFile(p, []byte("glibc-ld.so.cache1.1"), 0o644); err != nil {
				return err
			}
			return os.Truncate(p, 100<<20)
		}, false},
		// Valid but for the entry count (2 million cost 1.28 GB to decode).
		{"too many entries", func(p string) error {
			entries := make([]ldcache.Entry, ldcache.MaxEntries+1)
			for i := range entries {
				entries[i] = ldcache.Entry{Name: fmt.Sprintf("lib%d.so", i), Path: "/x", Flags: ldcache.FlagELFLibc6 | ldcache.FlagX8664Lib64}
			}
			b, err := (&ldcache.Cache{Entries: entries}).MarshalBinary()
			if err != nil {
				return err
			}
			return os.WriteFile(p, b, 0o644)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := basicRoot(t)
			mustT(t, tc.make(filepath.Join(dir, CacheFile)))
			var warned []string
			err := UpdateLDCache(openRoot(t, dir), []string{nvDir}, func(w string) { warned = append(warned, w) })
			if tc.wantErr {
				if err == nil {
					t.Fatal("succeeded")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(warned) != 1 || !strings.Contains(warned[0], CacheFile) {
				t.Errorf("warnings = %q; want one naming %s", warned, CacheFile)
			}
			if got := readCache(t, filepath.Join(dir, CacheFile)).Lookup("libcuda.so.1"); len(got) != 1 {
				t.Errorf("libcuda.so.1 = %v", got)
			}
		})
	}
}

// Only 64-bit shared objects of the host's machine with a SONAME enter the
// cache; the SONAME link is preferred as the path; a folder without one
// records the file.
func TestLibrarySelection(t *testing.T) {
	dir := basicRoot(t)
	d := filepath.Join(dir, nvDir)
	writeFile(t, filepath.Join(d, "libGL.so"), "/* GNU ld script */ INPUT(libGL.so.1)\n")
	copyFile(t, filepath.Join(artifacts, probeBin), filepath.Join(d, "libnotalib.so.1")) // an executable: no SONAME
	mustT(t, os.Mkdir(filepath.Join(d, "libdir.so.1"), 0o755))
	mustT(t, syscall.Mkfifo(filepath.Join(d, "libfifo.so.1"), 0o644))
	mustT(t, os.Symlink("missing", filepath.Join(d, "libdangling.so.1")))
	copyFile(t, filepath.Join(artifacts, hostOnlyLib), filepath.Join(d, "notlib-hostonly.so")) // name does not match lib*.so*
	if err := UpdateLDCache(openRoot(t, dir), []string{nvDir, nvDir + "/"}, nil); err != nil {
		t.Fatal(err)
	}
	c := readCache(t, filepath.Join(dir, CacheFile))
	var names []string
	for e := range c.Libraries() {
		names = append(names, e.Name+"="+e.Path)
		if e.Flags != ldcache.FlagsX8664 && e.Flags != ldcache.FlagsAArch64 {
			t.Errorf("flags %#x", e.Flags)
		}
	}
	want := "libcuda.so.1=" + nvDir + "/" + driverLib
	if len(names) != 1 || names[0] != want {
		t.Errorf("entries = %v; want [%s]", names, want)
	}
	if conf, _ := os.ReadFile(filepath.Join(dir, ConfFile)); strings.Count(string(conf), nvDir) != 1 {
		t.Errorf("%s = %q; want the folder once", ConfFile, conf)
	}
}

func TestUpdateLDCacheBadFolders(t *testing.T) {
	dir := basicRoot(t)
	r := openRoot(t, dir)
	for _, f := range [][]string{nil, {"relative/lib"}, {"/a\nb"}, {"/a\x00"}, {"/does/not/exist"}} {
		if err := UpdateLDCache(r, f, nil); err == nil {
			t.Errorf("UpdateLDCache(%q) succeeded", f)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, CacheFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed run wrote the cache: %v", err)
	}
}

func TestCreateSymlinks(t *testing.T) {
	dir := basicRoot(t)
	r := openRoot(t, dir)
	writeFile(t, filepath.Join(dir, nvDir, "libcuda.so"), "old file")
	var links []Link
	for _, s := range []string{
		driverLib + "::" + nvDir + "/libcuda.so.1",
		"libcuda.so.1::" + nvDir + "/libcuda.so", // replaces a file, like ln -sf
		"../../bin/x::/new/dir/x",                // parents created
		driverLib + "::" + nvDir + "/libcuda.so.1",
	} {
		l, err := ParseLink(s)
		mustT(t, err)
		links = append(links, l)
	}
	mustT(t, CreateSymlinks(r, links))
	mustT(t, CreateSymlinks(r, links)) // idempotent
	for link, want := range map[string]string{nvDir + "/libcuda.so.1": driverLib, nvDir + "/libcuda.so": "libcuda.so.1", "/new/dir/x": "../../bin/x"} {
		if got, err := os.Readlink(filepath.Join(dir, link)); err != nil || got != want {
			t.Errorf("%s -> %q, %v; want %q", link, got, err, want)
		}
	}
	// A directory in the way is an error, not replaced.
	l, _ := ParseLink("x::" + nvDir)
	if err := CreateSymlinks(r, []Link{l}); err == nil {
		t.Error("replacing a directory with a link succeeded")
	}
}

// TestSpecWritersNames: every hook subcommand the spec writer (package
// edits, whose CDI specs run this binary) names is a command here, by the
// same name; containerhook spells the names itself so that the static
// hook binary does not link the model for three strings.
func TestSpecWritersNames(t *testing.T) {
	for _, name := range []string{edits.HookCreateSymlinks, edits.HookUpdateLDCache, edits.HookEnableCUDACompat} {
		if Lookup(name) == nil {
			t.Errorf("the spec writer names hook %q, which gantry-cdi-hook has no command for", name)
		}
	}
}
