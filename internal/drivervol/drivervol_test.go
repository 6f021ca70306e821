package drivervol

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/ldcache"
	"golang.org/x/sys/unix"
)

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func fakeRoot(t *testing.T, opts fakedriver.Options) (string, *driver.Inventory) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot build the fake driver root (make deps installs it)")
	}
	root := filepath.Join(t.TempDir(), "driver")
	if _, err := fakedriver.Build(root, opts); err != nil {
		t.Fatal(err)
	}
	inv, err := driver.Discover(driver.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	return root, inv
}

// walk lists every entry of the tree: "rel" for files, "rel -> target" for links.
func walk(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out = append(out, rel+" -> "+target)
		case d.Type().IsRegular():
			out = append(out, rel)
		case d.IsDir():
		default:
			t.Errorf("%s: unexpected file type %v", rel, d.Type())
		}
		return nil
	})
	return out
}

func TestTreeLayout(t *testing.T) {
	for _, layout := range []string{fakedriver.LayoutStandard, fakedriver.LayoutGKE} {
		t.Run(layout, func(t *testing.T) {
			const version = "580.159.04"
			root, inv := fakeRoot(t, fakedriver.Options{Version: version, Layout: layout, Compat32: layout == fakedriver.LayoutStandard})
			s := Store{Dir: filepath.Join(t.TempDir(), "volumes", "nvidia_driver")}
			tree, err := s.Ensure(inv)
			if err != nil {
				t.Fatal(err)
			}
			if tree.Path != filepath.Join(s.Dir, version) || tree.Version != version {
				t.Fatalf("tree %+v", tree)
			}
			entries := walk(t, tree.Path)
			for _, want := range []string{
				"bin/nvidia-smi",
				"lib64/libcuda.so." + version,
				"lib64/libcuda.so.1 -> libcuda.so." + version,
				"lib64/libcuda.so -> libcuda.so." + version,
				"lib64/libnvidia-ml.so.1 -> libnvidia-ml.so." + version,
			} {
				if !slices.Contains(entries, want) {
					t.Errorf("tree lacks %q; has %q", want, entries)
				}
			}
			if layout == fakedriver.LayoutStandard && !slices.Contains(entries, "lib/libcuda.so.1 -> libcuda.so."+version) {
				t.Errorf("no 32-bit libcuda in lib/: %q", entries)
			}
			// Every link is a name in its own directory, and every file is
			// one of the inventory's, linked or copied.
			for _, e := range entries {
				if name, target, ok := strings.Cut(e, " -> "); ok {
					if strings.Contains(target, "/") {
						t.Errorf("link %s points out of its directory: %s", name, target)
					}
					if _, err := os.Stat(filepath.Join(tree.Path, name)); err != nil {
						t.Errorf("link %s dangles: %v", name, err)
					}
				}
			}
			want := len(inv.Binaries) + len(inv.Libraries)
			if got := len(tree.Binaries) + len(tree.Libraries); got != want || len(tree.Binaries) == 0 {
				t.Errorf("tree has %d programs and libraries, the inventory %d", got, want)
			}
			// Same filesystem: hard links, not copies.
			var a, b os.FileInfo
			a, _ = os.Stat(filepath.Join(tree.Path, "lib64/libcuda.so."+version))
			for _, l := range inv.Libraries {
				if strings.HasPrefix(l.SONAME, "libcuda.so") && !strings.Contains(l.HostPath, "i386") {
					b, _ = os.Stat(l.HostPath)
				}
			}
			if a == nil || b == nil || !os.SameFile(a, b) {
				t.Errorf("libcuda in the tree is not a hard link of %s", root)
			}
			// The runtime's view: libraries with their SONAMEs.
			found := false
			for _, l := range tree.Libraries {
				if l.Path == "lib64/libcuda.so."+version && l.SONAME == "libcuda.so.1" && l.Bits == 64 &&
					l.ContainerPath("/usr/local/nvidia") == "/usr/local/nvidia/lib64/libcuda.so.1" {
					found = true
				}
			}
			if !found {
				t.Errorf("Tree.Libraries lacks libcuda: %+v", tree.Libraries)
			}
			// The manifest says what a scan of the tree says.
			scanned, err := scan(version, tree.Path)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(scanned, tree) {
				t.Errorf("manifest %+v\nscan     %+v", tree, scanned)
			}
			loads(t, tree.Path)
		})
	}
}

// loads checks the tree with the real tools: ldconfig -r on a root holding
// the tree at /usr/local/nvidia finds libcuda.so.1 in lib64, and the real
// dynamic loader loads libcuda and NVML from lib64 and calls them.
func loads(t *testing.T, tree string) {
	t.Helper()
	ldconfig, err := exec.LookPath("ldconfig")
	if err != nil {
		t.Skip("ldconfig not installed")
	}
	ctr := t.TempDir()
	os.MkdirAll(filepath.Join(ctr, "etc"), 0o755)
	os.MkdirAll(filepath.Join(ctr, "usr/local"), 0o755)
	os.WriteFile(filepath.Join(ctr, "etc/ld.so.conf"), []byte("/usr/local/nvidia/lib64\n/usr/local/nvidia/lib\n"), 0o644)
	if out, err := exec.Command("cp", "-a", tree, filepath.Join(ctr, "usr/local/nvidia")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if out, err := exec.Command(ldconfig, "-r", ctr).CombinedOutput(); err != nil {
		t.Fatalf("ldconfig -r: %v: %s", err, out)
	}
	cache, err := ldcache.Open(filepath.Join(ctr, "etc/ld.so.cache"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cache.Lookup("libcuda.so.1"); !slices.Contains(got, "/usr/local/nvidia/lib64/libcuda.so.1") {
		t.Errorf("ldconfig -r: libcuda.so.1 -> %q", got)
	}

	src := filepath.Join(t.TempDir(), "probe.c")
	os.WriteFile(src, []byte(`#include <dlfcn.h>
#include <stdio.h>
int main(void) {
	void *cuda = dlopen("libcuda.so.1", RTLD_NOW), *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	if (!cuda || !nvml) { printf("dlopen: %s\n", dlerror()); return 1; }
	int (*ver)(int *) = (int (*)(int *))dlsym(cuda, "cuDriverGetVersion");
	int (*dver)(char *, unsigned) = (int (*)(char *, unsigned))dlsym(nvml, "nvmlSystemGetDriverVersion");
	int (*ninit)(void) = (int (*)(void))dlsym(nvml, "nvmlInit_v2");
	if (!ver || !dver || !ninit) { printf("dlsym failed\n"); return 1; }
	int v = 0; char d[80] = "";
	ver(&v); ninit(); dver(d, sizeof d);
	printf("%d %s\n", v, d);
	return 0;
}
`), 0o644)
	bin := filepath.Join(t.TempDir(), "probe")
	if out, err := exec.Command("gcc", "-o", bin, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v: %s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{"LD_LIBRARY_PATH=" + filepath.Join(tree, "lib64")}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("probe: %v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); !strings.HasSuffix(got, " "+filepath.Base(tree)) {
		t.Errorf("probe printed %q, want the driver version %s", got, filepath.Base(tree))
	}
}

func TestVersionChangeMakesNewTree(t *testing.T) {
	_, inv1 := fakeRoot(t, fakedriver.Options{Version: "550.54.15"})
	_, inv2 := fakeRoot(t, fakedriver.Options{Version: "580.159.04"})
	s := Store{Dir: t.TempDir()}
	t1, err := s.Ensure(inv1)
	if err != nil {
		t.Fatal(err)
	}
	t2, err := s.Ensure(inv2)
	if err != nil {
		t.Fatal(err)
	}
	if t1.Path == t2.Path {
		t.Fatalf("one tree for two versions: %s", t1.Path)
	}
	if _, err := os.Stat(filepath.Join(t2.Path, "lib64/libcuda.so.580.159.04")); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(filepath.Join(t2.Path, "lib64/libcuda.so.550.54.15")); err == nil {
		t.Error("the new tree holds the old driver's libcuda")
	}
	vs, err := s.Versions()
	if err != nil || !slices.Equal(vs, []string{"550.54.15", "580.159.04"}) {
		t.Errorf("Versions: %q %v", vs, err)
	}
	// Ensure again keeps the tree (same inode: not rebuilt).
	before, _ := os.Stat(t2.Path)
	if _, err := s.Ensure(inv2); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(t2.Path)
	if !os.SameFile(before, after) {
		t.Error("Ensure rebuilt an existing tree")
	}
	if err := s.Remove("550.54.15"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("550.54.15"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove: %v", err)
	}
	if vs, _ := s.Versions(); !slices.Equal(vs, []string{"580.159.04"}) {
		t.Errorf("after Remove: %q", vs)
	}
	if ents := names(t, s.Dir); !slices.Equal(ents, []string{".580.159.04.json", "580.159.04"}) {
		t.Errorf("left behind in the store: %v", ents)
	}
	if err := s.Remove("../x"); err == nil {
		t.Error("Remove accepted a path as version")
	}
}

// TestNoEscape: a driver root whose files become symlinks to host files
// after discovery (or that holds such links) never brings a host file into
// the tree; the build fails whole and leaves nothing.
func TestNoEscape(t *testing.T) {
	const version = "580.159.04"
	root, inv := fakeRoot(t, fakedriver.Options{Version: version})
	outside := filepath.Join(t.TempDir(), "host-secret.so")
	if err := os.WriteFile(outside, []byte("\x7fELF host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	var cuda string
	for _, l := range inv.Libraries {
		if strings.HasPrefix(l.SONAME, "libcuda.so") {
			cuda = l.HostPath
		}
	}
	if cuda == "" {
		t.Fatal("no libcuda in the inventory")
	}
	// Swap the real libcuda for a link to a host file (absolute target).
	os.Remove(cuda)
	if err := os.Symlink(outside, cuda); err != nil {
		t.Fatal(err)
	}
	s := Store{Dir: t.TempDir()}
	if tree, err := s.Ensure(inv); err == nil {
		t.Fatalf("built a tree from a driver root whose libcuda points outside: %+v", tree)
	} else if !strings.Contains(err.Error(), "libcuda") {
		t.Errorf("error does not name the file: %v", err)
	}
	if vs, _ := s.Versions(); len(vs) != 0 {
		t.Errorf("a tree was left: %q", vs)
	}
	ents, _ := os.ReadDir(s.Dir)
	if len(ents) != 0 {
		t.Errorf("build left %v", ents)
	}

	// Discovery on that root resolves the link inside the root: libcuda
	// is missing, and the tree built from that inventory has no host file.
	inv2, err := driver.Discover(driver.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	tree, err := s.Ensure(inv2)
	if err != nil {
		t.Fatal(err)
	}
	secret, _ := os.Stat(outside)
	for _, e := range walk(t, tree.Path) {
		name, _, _ := strings.Cut(e, " -> ")
		st, err := os.Stat(filepath.Join(tree.Path, name))
		if err != nil {
			continue
		}
		if os.SameFile(st, secret) {
			t.Errorf("%s is the host file", name)
		}
		b, _ := os.ReadFile(filepath.Join(tree.Path, name))
		if strings.Contains(string(b), "host secret") {
			t.Errorf("%s holds the host file's content", name)
		}
	}
}

// TestConcurrentEnsure: builders racing for one version all succeed and
// leave one tree.
func TestConcurrentEnsure(t *testing.T) {
	_, inv := fakeRoot(t, fakedriver.Options{Version: "580.159.04"})
	s := Store{Dir: t.TempDir()}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Ensure(inv)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if ents := names(t, s.Dir); !slices.Equal(ents, []string{".580.159.04.json", "580.159.04"}) {
		t.Errorf("store holds %v", ents)
	}
}

// TestCopyAcrossFilesystems copies when a hard link is impossible (here:
// /dev/shm, a tmpfs, is another filesystem than the test's temp dir on
// most hosts; skipped otherwise).
func TestCopyAcrossFilesystems(t *testing.T) {
	_, inv := fakeRoot(t, fakedriver.Options{Version: "580.159.04"})
	dir, err := os.MkdirTemp("/dev/shm", "drivervol-")
	if err != nil {
		t.Skip("no /dev/shm")
	}
	defer os.RemoveAll(dir)
	var a, b unixStat
	if statDev(dir, &a) != nil || statDev(inv.Root, &b) != nil || a.Dev == b.Dev {
		t.Skip("/dev/shm is on the driver root's filesystem")
	}
	tree, err := Store{Dir: dir}.Ensure(inv)
	if err != nil {
		t.Fatal(err)
	}
	loads(t, tree.Path)
}

type unixStat = unix.Stat_t

func statDev(p string, st *unix.Stat_t) error { return unix.Stat(p, st) }

// TestProtect: a protected tree cannot be written, not even through a bind
// mount made without ro, and so not through its hard links to the driver;
// Remove takes the mount off and deletes the tree.
// TestProtect runs on the kernel's mount API and on the paths of kernels
// before 5.8 (bind then remount a private mount point; mountinfo for
// whether the served path is a mount).
func TestProtect(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	bothKernels(t, testProtect)
}

// bothKernels runs test with the kernel's mount API and as on a kernel
// before Linux 5.8 (LegacyKernel).
func bothKernels(t *testing.T, test func(t *testing.T)) {
	t.Run("mount API", test)
	t.Run("before Linux 5.8", func(t *testing.T) {
		LegacyKernel.Store(true)
		defer LegacyKernel.Store(false)
		test(t)
	})
}

// mountID is the unique id of the mount at p (statx on this host's kernel:
// the plain mount id of a detached mount is given to the next one).
func mountID(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID_UNIQUE, &st); err != nil || st.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		t.Skipf("statx gives no unique mount id here (%v): Linux 6.8 or later needed to check", err)
	}
	return st.Mnt_id
}

func testProtect(t *testing.T) {
	_, inv := fakeRoot(t, fakedriver.Options{Version: "580.159.04"})
	// A space in the path: mountinfo writes it \040.
	s := Store{Dir: filepath.Join(t.TempDir(), "driver trees")}
	tree, err := s.Ensure(inv)
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(tree.Path, "lib64", "libcuda.so.580.159.04")
	if err := s.Protect("580.159.04"); err != nil {
		t.Fatal(err)
	}
	first := mountID(t, tree.Path)
	if err := s.Protect("580.159.04"); err != nil {
		t.Fatalf("second Protect: %v", err)
	}
	// A tree protected already is left mounted: detaching it for a moment
	// would fail a container binding it then.
	if again := mountID(t, tree.Path); again != first {
		t.Errorf("the second Protect mounted the tree again (mount %d, then %d)", first, again)
	}
	if _, err := os.Lstat(s.staging("580.159.04")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the private mount point is left: %v", err)
	}
	if f, err := os.OpenFile(lib, os.O_WRONLY, 0); err == nil {
		f.Close()
		t.Fatal("a protected tree's library opens for writing")
	} else if !errors.Is(err, unix.EROFS) {
		t.Errorf("writing: %v, want EROFS", err)
	}
	// A rw bind of the tree, as Docker makes for a volume mounted without :ro.
	ctr := t.TempDir()
	if err := unix.Mount(tree.Path, ctr, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatal(err)
	}
	_, werr := os.OpenFile(filepath.Join(ctr, "lib64", "libcuda.so.1"), os.O_WRONLY, 0)
	unix.Unmount(ctr, unix.MNT_DETACH)
	if werr == nil {
		t.Fatal("a rw bind of the protected tree is writable")
	}
	if err := s.Remove("580.159.04"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tree.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("tree after Remove: %v", err)
	}
	if err := s.Protect("580.159.04"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Protect of a removed tree: %v", err)
	}
}

// BenchmarkEnsureExisting is the cost of asking for a tree that exists (what
// a runtime would pay per container before binding it): Load reads the
// directories and each library's ELF header.
func BenchmarkEnsureExisting(b *testing.B) {
	if _, err := exec.LookPath("gcc"); err != nil {
		b.Skip("gcc not installed")
	}
	root := filepath.Join(b.TempDir(), "driver")
	if _, err := fakedriver.Build(root, fakedriver.Options{Version: "580.159.04"}); err != nil {
		b.Fatal(err)
	}
	inv, err := driver.Discover(driver.Options{Root: root})
	if err != nil {
		b.Fatal(err)
	}
	s := Store{Dir: b.TempDir()}
	if _, err := s.Ensure(inv); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Ensure(inv); err != nil {
			b.Fatal(err)
		}
	}
}

// setOf returns the host paths of inv's programs and libraries of the
// given capabilities (those of a container asking for them).
func setOf(inv *driver.Inventory, caps ...driver.Capability) []string {
	var out []string
	for _, f := range append(slices.Clone(inv.Binaries), inv.Libraries...) {
		if slices.Contains(caps, f.Capability) {
			out = append(out, f.HostPath)
		}
	}
	return out
}

// TestEnsureSet: a set's tree holds exactly the set's programs and
// libraries (with their SONAME links), a compute set no graphics library;
// one tree per set, whatever order the paths come in; the sets are never
// listed as versions (the Docker volume plugin's list).
func TestEnsureSet(t *testing.T) {
	const version = "580.159.04"
	_, inv := fakeRoot(t, fakedriver.Options{Version: version, Compat32: true})
	s := Store{Dir: t.TempDir()}
	compute := setOf(inv, driver.Compute, driver.Utility)
	tree, err := s.EnsureSet(inv, compute)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(s.Dir, SetsDir, SetKey(compute), version); tree.Path != want {
		t.Fatalf("set tree at %s, want %s", tree.Path, want)
	}
	entries := walk(t, tree.Path)
	for _, want := range []string{"bin/nvidia-smi", "lib64/libcuda.so." + version, "lib64/libcuda.so.1 -> libcuda.so." + version, "lib64/libcuda.so -> libcuda.so." + version, "lib64/libnvidia-ml.so.1 -> libnvidia-ml.so." + version} {
		if !slices.Contains(entries, want) {
			t.Errorf("compute set lacks %q; has %q", want, entries)
		}
	}
	var files int
	for _, e := range entries {
		if strings.Contains(e, "GLX") || strings.Contains(e, "EGL") || strings.HasPrefix(e, "lib/") {
			t.Errorf("compute set holds %s", e)
		}
		if !strings.Contains(e, " -> ") {
			files++
		}
	}
	if files != len(compute) {
		t.Errorf("compute set holds %d files, asked for %d: %q", files, len(compute), entries)
	}
	loads(t, tree.Path)

	// The same set in another order, with a repeat: the same tree, not
	// rebuilt.
	before, _ := os.Stat(tree.Path)
	same, err := s.EnsureSet(inv, slices.Concat(compute[1:], compute[:1], compute[:1]))
	if err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(same.Path)
	if same.Path != tree.Path || !os.SameFile(before, after) {
		t.Errorf("the same set in another order: %s, want the tree %s kept", same.Path, tree.Path)
	}

	graphics := setOf(inv, driver.Compute, driver.Utility, driver.Graphics)
	gtree, err := s.EnsureSet(inv, graphics)
	if err != nil {
		t.Fatal(err)
	}
	if gtree.Path == tree.Path {
		t.Fatal("compute and graphics sets share a tree")
	}
	gentries := walk(t, gtree.Path)
	for _, want := range []string{"lib64/libEGL_nvidia.so.0 -> libEGL_nvidia.so." + version, "lib64/libGLX_indirect.so.0 -> libGLX_nvidia.so." + version, "lib64/libcuda.so.1 -> libcuda.so." + version} {
		if !slices.Contains(gentries, want) {
			t.Errorf("graphics set lacks %q; has %q", want, gentries)
		}
	}
	// Same filesystem: the set's libcuda is the driver's file.
	a, _ := os.Stat(filepath.Join(tree.Path, "lib64/libcuda.so."+version))
	for _, l := range inv.Libraries {
		if strings.HasPrefix(l.SONAME, "libcuda.so") && l.Capability != driver.Compat32 {
			if b, _ := os.Stat(l.HostPath); a == nil || b == nil || !os.SameFile(a, b) {
				t.Errorf("the set's libcuda is not a hard link of %s", l.HostPath)
			}
		}
	}

	if vs, err := s.Versions(); err != nil || len(vs) != 0 {
		t.Errorf("Versions lists the sets: %q %v", vs, err)
	}
	if _, err := s.Ensure(inv); err != nil {
		t.Fatal(err)
	}
	if vs, err := s.Versions(); err != nil || !slices.Equal(vs, []string{version}) {
		t.Errorf("Versions with a full tree and two sets: %q %v", vs, err)
	}
	if _, err := s.EnsureSet(inv, []string{filepath.Join(inv.Root, "etc/nothing")}); err == nil {
		t.Error("a set of no driver file built a tree")
	}
}

// TestSetLinksFromFullTree: where the driver is on another filesystem
// than the trees, a set's files are hard links of the full tree's copies
// (no second copy), but only of those with the driver file's bytes.
func TestSetLinksFromFullTree(t *testing.T) {
	const version = "580.159.04"
	_, inv := fakeRoot(t, fakedriver.Options{Version: version})
	dir, err := os.MkdirTemp("/dev/shm", "drivervol-")
	if err != nil {
		t.Skip("no /dev/shm")
	}
	defer os.RemoveAll(dir)
	var a, b unixStat
	if statDev(dir, &a) != nil || statDev(inv.Root, &b) != nil || a.Dev == b.Dev {
		t.Skip("/dev/shm is on the driver root's filesystem")
	}
	s := Store{Dir: dir}
	full, err := s.Ensure(inv)
	if err != nil {
		t.Fatal(err)
	}
	// The full tree's NVML no longer has the driver's bytes.
	nvml := filepath.Join(full.Path, "lib64/libnvidia-ml.so."+version)
	f, err := os.OpenFile(nvml, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff}, 100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fw := inv.Firmware[0]
	set, err := s.EnsureSet(inv, append(setOf(inv, driver.Compute, driver.Utility), fw.HostPath))
	if err != nil {
		t.Fatal(err)
	}
	// Firmware, which the full tree lacks, is copied.
	if a, b := readOrFail(t, fw.HostPath), readOrFail(t, filepath.Join(set.Path, FilePath(fw.ContainerPath))); string(a) != string(b) {
		t.Errorf("the set's copy of %s has other bytes", fw.HostPath)
	}
	same := func(rel string) bool {
		x, err1 := os.Stat(filepath.Join(full.Path, rel))
		y, err2 := os.Stat(filepath.Join(set.Path, rel))
		return err1 == nil && err2 == nil && os.SameFile(x, y)
	}
	for _, rel := range []string{"lib64/libcuda.so." + version, "bin/nvidia-smi"} {
		if !same(rel) {
			t.Errorf("the set's %s is not the full tree's file", rel)
		}
	}
	if same("lib64/libnvidia-ml.so." + version) {
		t.Error("the set linked the full tree's changed NVML")
	}
	loads(t, set.Path) // NVML copied from the driver: it loads and answers
}

// TestConcurrentEnsureSet: creates racing for one set all get the one tree.
func TestConcurrentEnsureSet(t *testing.T) {
	const version = "580.159.04"
	_, inv := fakeRoot(t, fakedriver.Options{Version: version})
	s := Store{Dir: t.TempDir()}
	set := setOf(inv, driver.Compute, driver.Utility)
	var wg sync.WaitGroup
	paths := make([]string, 8)
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var tr *Tree
			if tr, errs[i] = s.EnsureSet(inv, set); tr != nil {
				paths[i] = tr.Path
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Error(err)
		} else if paths[i] != paths[0] {
			t.Errorf("trees %s and %s for one set", paths[i], paths[0])
		}
	}
	if ents := names(t, s.Set(SetKey(set)).Dir); !slices.Equal(ents, []string{"." + version + ".json", version}) {
		t.Errorf("set store holds %v", ents)
	}
	if ents := names(t, s.Dir); !slices.Equal(ents, []string{SetsDir}) {
		t.Errorf("store holds %v", ents)
	}
}

// TestEnsureSetFiles: a set's tree holds the set's firmware and
// configuration files too, each at FilePath of its container path (GKE's
// firmware and share files, found below /usr/local/nvidia on the host, at
// /lib/firmware and /usr/share), the driver's own file (a hard link), read
// back the same from the manifest and from a scan. A directory (of
// application profiles) is left out, and so is the GBM backend, which is
// the allocator library the tree has in lib64. The full tree (the Docker
// volume) holds no files/.
func TestEnsureSetFiles(t *testing.T) {
	for _, layout := range []string{fakedriver.LayoutStandard, fakedriver.LayoutGKE} {
		t.Run(layout, func(t *testing.T) {
			const version = "580.159.04"
			root, _ := fakeRoot(t, fakedriver.Options{Version: version, Layout: layout})
			if err := os.MkdirAll(filepath.Join(root, "etc/nvidia/nvidia-application-profiles-rc.d"), 0o755); err != nil {
				t.Fatal(err)
			}
			inv, err := driver.Discover(driver.Options{Root: root})
			if err != nil {
				t.Fatal(err)
			}
			set := setOf(inv, driver.Compute, driver.Utility, driver.Graphics)
			var want []string
			var dirs, gbm int
			for _, f := range slices.Concat(inv.Firmware, inv.Configs) {
				set = append(set, f.HostPath)
				st, err := os.Stat(f.HostPath)
				switch {
				case err != nil:
					t.Fatal(err)
				case st.IsDir():
					dirs++
				case slices.Contains(set[:len(set)-1], f.HostPath):
					gbm++ // a library of the set already
				default:
					want = append(want, FilePath(f.ContainerPath))
				}
			}
			slices.Sort(want)
			if len(inv.Firmware) == 0 || dirs != 1 || gbm != 1 || !slices.Contains(want, "files/usr/share/vulkan/icd.d/nvidia_icd.json") || !slices.Contains(want, FilePath(inv.Firmware[0].ContainerPath)) {
				t.Fatalf("fixture: %d firmware, %d directories, %d GBM backends, files %q", len(inv.Firmware), dirs, gbm, want)
			}
			s := Store{Dir: t.TempDir()}
			tree, err := s.EnsureSet(inv, set)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(tree.Files, want) {
				t.Errorf("the set's files\n%q\nwant\n%q", tree.Files, want)
			}
			var entries []string
			for _, e := range walk(t, tree.Path) {
				if strings.HasPrefix(e, FilesDir+"/") {
					entries = append(entries, e)
				}
			}
			if !slices.Equal(entries, want) {
				t.Errorf("files/ holds\n%q\nwant\n%q", entries, want)
			}
			for _, f := range slices.Concat(inv.Firmware, inv.Configs) {
				rel := FilePath(f.ContainerPath)
				if !slices.Contains(want, rel) {
					continue
				}
				a, _ := os.Stat(f.HostPath)
				b, _ := os.Stat(filepath.Join(tree.Path, rel))
				if a == nil || b == nil || !os.SameFile(a, b) || b.Mode().Perm() != a.Mode().Perm() {
					t.Errorf("%s in the tree is not the driver's file %s", rel, f.HostPath)
				}
			}
			// The manifest and a scan agree.
			if err := os.Remove(s.Set(SetKey(set)).manifest(version)); err != nil {
				t.Fatal(err)
			}
			scanned, err := s.Set(SetKey(set)).Load(version)
			if err != nil || !slices.Equal(scanned.Files, want) {
				t.Errorf("scanned without the manifest: %+v %v, want files %q", scanned, err, want)
			}
			full, err := s.Ensure(inv)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(filepath.Join(full.Path, FilesDir)); err == nil || len(full.Files) != 0 {
				t.Errorf("the full tree (a Docker volume) holds %s: %q", FilesDir, full.Files)
			}
			// A set of firmware alone is a set too.
			fw, err := s.EnsureSet(inv, []string{inv.Firmware[0].HostPath})
			if err != nil || !slices.Equal(fw.Files, []string{FilePath(inv.Firmware[0].ContainerPath)}) {
				t.Errorf("a firmware set: %+v %v", fw, err)
			}
		})
	}
}

// TestSetKeyFormat: a set's key is not the key format 1 gave the same host
// paths, whose tree holds no files/: such a tree is never loaded as one of
// the new meaning.
func TestSetKeyFormat(t *testing.T) {
	paths := []string{"/usr/bin/nvidia-smi", "/lib/firmware/nvidia/580.1/gsp_ga10x.bin"}
	h := sha256.New()
	for _, p := range []string{"/lib/firmware/nvidia/580.1/gsp_ga10x.bin", "/usr/bin/nvidia-smi"} {
		h.Write([]byte(p + "\x00"))
	}
	if old := hex.EncodeToString(h.Sum(nil)[:6]); SetKey(paths) == old {
		t.Fatalf("SetKey %s is format 1's key of the same paths", old)
	}
}

func readOrFail(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
