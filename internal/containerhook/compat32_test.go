package containerhook

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/ldcache"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// The compat32 tests: i386 driver libraries beside the x86-64 ones, the
// cache written for both, and the real loaders of both word sizes in one
// image, each of which must find its own libcuda.so.1 through the cache.

// nv32Dir is where a driver root of the GKE kind keeps its 32-bit libraries.
const nv32Dir = "/usr/local/nvidia/lib"

// pathProbeSrc dlopens libcuda.so.1 by SONAME and says which word size it
// runs as, what cuDriverGetVersion reports and which file was loaded.
const pathProbeSrc = `#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
	int (*get)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
	int v = 0;
	if (!get || get(&v) != 0) { printf("cuDriverGetVersion failed\n"); return 1; }
	struct link_map *lm = 0;
	dlinfo(h, RTLD_DI_LINKMAP, &lm);
	printf("bits=%d cuda=%d path=%s\n", (int)(8 * sizeof(void *)), v, lm ? lm->l_name : "?");
	return 0;
}
`

// The 32-bit artifacts, built once.
const (
	probe32   = "probe32"
	probe64   = "probe64"
	driver32  = "libcuda32.so.580.159.04" // i386, SONAME libcuda.so.1, reports 32000, links libc as NVIDIA's do
	version32 = "32000"
)

var (
	m32Once  sync.Once
	m32Skip  string // why 32-bit objects cannot be built here
	m32Err   string
	execSkip string // why 32-bit programs cannot run here
	// i386 loader and libc of the host's multilib packages
	ld32, libc32 string
)

// need32 builds the 32-bit artifacts with gcc -m32 or skips the test with
// the reason they cannot be built.
func need32(t *testing.T) {
	t.Helper()
	needArtifacts(t)
	if runtime.GOARCH != "amd64" {
		t.Skipf("skipping: compat32 libraries exist on x86-64 hosts only (this is %s)", runtime.GOARCH)
	}
	m32Once.Do(build32)
	if m32Skip != "" {
		t.Skip("skipping: " + m32Skip)
	}
	if m32Err != "" {
		t.Fatal(m32Err)
	}
}

// need32Exec is need32 for tests that run 32-bit programs.
func need32Exec(t *testing.T) {
	t.Helper()
	need32(t)
	if execSkip != "" {
		t.Skip("skipping: " + execSkip)
	}
}

func build32() {
	src := filepath.Join(artifacts, "pathprobe.c")
	if err := os.WriteFile(src, []byte(pathProbeSrc), 0o644); err != nil {
		m32Err = err.Error()
		return
	}
	gcc := func(args ...string) error {
		cmd := exec.Command("gcc", args...)
		cmd.Dir = artifacts
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := gcc("-m32", "-o", probe32, src, "-ldl"); err != nil {
		m32Skip = "gcc -m32 cannot link a 32-bit program (scripts/deps.sh --test installs gcc-multilib): " + firstLine(err.Error())
		return
	}
	for _, c := range [][]string{
		{"-o", probe64, src, "-ldl"},
		// --no-as-needed keeps DT_NEEDED libc.so.6, which makes ldconfig
		// flag the library "(libc6)" as it does NVIDIA's 32-bit libraries.
		{"-m32", "-shared", "-fPIC", "-DVERSION=" + version32, "-Wl,--no-as-needed", "-Wl,-soname,libcuda.so.1", "-o", driver32, "lib.c", "-lc"},
	} {
		if err := gcc(c...); err != nil {
			m32Err = err.Error()
			return
		}
	}
	for _, p := range []*string{&ld32, &libc32} {
		name := map[*string]string{&ld32: "ld-linux.so.2", &libc32: "libc.so.6"}[p]
		out, err := exec.Command("gcc", "-m32", "-print-file-name="+name).Output()
		f := strings.TrimSpace(string(out))
		if err != nil || !filepath.IsAbs(f) {
			m32Skip = "gcc -m32 does not know the host's 32-bit " + name + " (install gcc-multilib)"
			return
		}
		if *p, err = filepath.EvalSymlinks(f); err != nil {
			m32Skip = "the host's 32-bit " + name + ": " + err.Error()
			return
		}
	}
	// The probe cannot find libcuda on the host; what matters is whether
	// the kernel runs it at all.
	err := exec.Command(filepath.Join(artifacts, probe32)).Run()
	var ee *exec.ExitError
	switch {
	case errors.Is(err, syscall.ENOEXEC):
		execSkip = "this kernel does not run 32-bit programs (IA-32 emulation is off; boot with ia32_emulation=on)"
	case err != nil && !errors.As(err, &ee):
		execSkip = "cannot run a 32-bit program here: " + err.Error()
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// link makes the SONAME link beside a library, as create-symlinks does.
func link(t *testing.T, dir, target, name string) {
	t.Helper()
	if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// image32 is an image with both loaders: the host's x86-64 glibc (for
// probe64) and the i386 loader and libc of its multilib packages (for
// probe32), each at the path the probe asks for, an /etc/ld.so.conf naming
// those directories only, and an /etc/ld.so.cache from the real
// `ldconfig -r`. extra adds content first.
func image32(t *testing.T, extra func(dir string)) string {
	t.Helper()
	need32Exec(t)
	for _, tool := range []string{"ldconfig", "ldd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s not installed", tool)
		}
	}
	dir := filepath.Join(t.TempDir(), "rootfs")
	mkdirs(t, dir, "etc", "lib", "lib32")
	conf, err := fakedriver.CopyLoaderDeps(filepath.Join(artifacts, probe64), dir)
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	// probe32's interpreter is /lib/ld-linux.so.2; its libc is found
	// through the cache.
	copyFile(t, ld32, filepath.Join(dir, "lib/ld-linux.so.2"))
	copyFile(t, libc32, filepath.Join(dir, "lib32/libc.so.6"))
	writeFile(t, filepath.Join(dir, "etc/ld.so.conf"), strings.Join(append(conf, "/lib32"), "\n")+"\n")
	copyFile(t, filepath.Join(artifacts, probe64), filepath.Join(dir, probe64))
	copyFile(t, filepath.Join(artifacts, probe32), filepath.Join(dir, probe32))
	if extra != nil {
		extra(dir)
	}
	if out, err := exec.Command("ldconfig", "-r", dir).CombinedOutput(); err != nil {
		t.Fatalf("ldconfig -r %s: %v\n%s", dir, err, out)
	}
	return dir
}

// runIn runs /prog in the image with chroot, so that the image's loader,
// libc and cache decide what dlopen finds.
func runIn(t *testing.T, dir, prog string) (string, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: chroot needs root")
	}
	cmd := exec.Command("chroot", dir, "/"+prog)
	// Only the cache may decide: an inherited LD_LIBRARY_PATH (GPU hosts
	// often set /usr/local/nvidia/lib64:/usr/local/nvidia/lib) must not.
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// bothLibs puts the 64-bit and the 32-bit libcuda in nvDir and nv32Dir of
// the image, with their SONAME links.
func bothLibs(t *testing.T, dir string) {
	t.Helper()
	d64, d32 := filepath.Join(dir, nvDir), filepath.Join(dir, nv32Dir)
	mkdirs(t, dir, nvDir, nv32Dir)
	copyFile(t, filepath.Join(artifacts, driverLib), filepath.Join(d64, driverLib))
	copyFile(t, filepath.Join(artifacts, driver32), filepath.Join(d32, driverLib))
	link(t, d64, driverLib, "libcuda.so.1")
	link(t, d32, driverLib, "libcuda.so.1")
}

// The hook's path (UpdateLDCache reads each library's ELF header): both
// folders, one SONAME twice, and each loader gets its own.
func TestCompat32UpdateLDCacheRealLoaders(t *testing.T) {
	dir := image32(t, func(dir string) { bothLibs(t, dir) })
	if out, err := runIn(t, dir, probe32); err == nil {
		t.Fatalf("probe32 found libcuda before the cache was updated: %s", out)
	}
	r, err := rootfs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := UpdateLDCache(r, []string{nvDir, nv32Dir}, func(s string) { t.Error(s) }); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		probe64: "bits=64 cuda=" + wantVersion + " path=" + nvDir + "/libcuda.so.1",
		probe32: "bits=32 cuda=" + version32 + " path=" + nv32Dir + "/libcuda.so.1",
	}
	for prog, w := range want {
		if out, err := runIn(t, dir, prog); err != nil || out != w {
			t.Errorf("%s in the image: %q, %v; want %q", prog, out, err, w)
		}
	}
	conf, err := os.ReadFile(filepath.Join(dir, ConfFile))
	if err != nil || !strings.Contains(string(conf), "\n"+nvDir+"\n"+nv32Dir+"\n") {
		t.Errorf("%s: %q, %v; want both folders listed", ConfFile, conf, err)
	}
}

// The cache UpdateLDCache writes for 64-bit and 32-bit libraries is the one
// glibc's ldconfig writes for the same tree, as glibc's own reader
// (`ldconfig -p -C FILE`) prints both.
func TestCompat32CacheMatchesLdconfig(t *testing.T) {
	need32(t)
	if _, err := exec.LookPath("ldconfig"); err != nil {
		t.Skip("skipping: ldconfig not installed")
	}
	tree := func() string {
		dir := filepath.Join(t.TempDir(), "rootfs")
		mkdirs(t, dir, "etc")
		bothLibs(t, dir)
		return dir
	}
	ours, theirs := tree(), tree()

	r, err := rootfs.Open(ours)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := UpdateLDCache(r, []string{nvDir, nv32Dir}, func(s string) { t.Error(s) }); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(theirs, "etc/ld.so.conf"), nvDir+"\n"+nv32Dir+"\n")
	if out, err := exec.Command("ldconfig", "-X", "-r", theirs).CombinedOutput(); err != nil {
		t.Fatalf("ldconfig -r: %v\n%s", err, out)
	}

	list := func(root string) string {
		out, err := exec.Command("ldconfig", "-p", "-C", filepath.Join(root, CacheFile)).CombinedOutput()
		if err != nil {
			t.Fatalf("ldconfig -p -C %s: %v\n%s", filepath.Join(root, CacheFile), err, out)
		}
		var keep []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			switch {
			case strings.HasPrefix(l, "Cache generated by"):
				// ldconfig names itself; we write no generator.
			case strings.Contains(l, " libs found in cache "):
				// The file name differs; the count must not.
				keep = append(keep, strings.Fields(l)[0]+" libs")
			default:
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	got, want := list(ours), list(theirs)
	if got != want {
		t.Errorf("ldconfig -p of our cache:\n%s\nof ldconfig's own for the same tree:\n%s", got, want)
	}
	if !strings.Contains(got, "libcuda.so.1 (libc6) => "+nv32Dir+"/libcuda.so.1") ||
		!strings.Contains(got, "libcuda.so.1 (libc6,x86-64) => "+nvDir+"/libcuda.so.1") {
		t.Errorf("ldconfig -p of our cache: want libcuda.so.1 for both ABIs:\n%s", got)
	}

	c, err := ldcache.Open(filepath.Join(ours, CacheFile))
	if err != nil {
		t.Fatal(err)
	}
	for flags, want := range map[int32]string{
		ldcache.FlagsX8664: nvDir + "/libcuda.so.1",
		ldcache.FlagsI386:  nv32Dir + "/libcuda.so.1",
	} {
		if got := c.LookupFlags("libcuda.so.1", flags); len(got) != 1 || got[0] != want {
			t.Errorf("libcuda.so.1 with flags %#x: %q, want [%s]", flags, got, want)
		}
	}
}

// AddToLDCache takes the word size from the caller, reading nothing: a
// Compat32 library gets the i386 flags, others the native ones.
func TestAddToLDCacheCompat32Flags(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("skipping: x86-64 flags (this is %s)", runtime.GOARCH)
	}
	dir := t.TempDir()
	r, err := rootfs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	libs := []Library{
		{SONAME: "libcuda.so.1", Path: "/usr/lib/i386-linux-gnu/libcuda.so.1", Compat32: true},
		{SONAME: "libcuda.so.1", Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
	}
	if err := AddToLDCache(r, libs, []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu"}, nil); err != nil {
		t.Fatal(err)
	}
	c, err := ldcache.Open(filepath.Join(dir, CacheFile))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for e := range c.Libraries() {
		got = append(got, fmt.Sprintf("%s %#x %s", e.Name, e.Flags, e.Path))
	}
	// The loader's order: equal names, highest flags first.
	want := []string{
		"libcuda.so.1 0x303 /usr/lib/x86_64-linux-gnu/libcuda.so.1",
		"libcuda.so.1 0x3 /usr/lib/i386-linux-gnu/libcuda.so.1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("cache entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
