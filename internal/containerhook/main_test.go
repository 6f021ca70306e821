package containerhook

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// Test artifacts, compiled once by TestMain with the real gcc.
var (
	artifacts   string // directory holding them
	artifactErr error  // why they could not be built
)

const (
	driverLib   = "libcuda.so.580.159.04" // SONAME libcuda.so.1, cuDriverGetVersion -> 13000
	stubLib     = "libcuda-stub.so"       // SONAME libcuda.so.1, cuDriverGetVersion -> 1
	hostOnlyLib = "libhostonly.so.1"      // SONAME libhostonly.so.1: must never enter a cache
	probeBin    = "probe"
	wantVersion = "13000"
)

const libSrc = `int cuDriverGetVersion(int *v) { *v = VERSION; return 0; }
`

const probeSrc = `#include <dlfcn.h>
#include <stdio.h>
int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
	int (*get)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
	int v = 0;
	if (!get || get(&v) != 0) { printf("cuDriverGetVersion failed\n"); return 1; }
	printf("%d\n", v);
	return 0;
}
`

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "containerhook-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	artifacts = dir
	artifactErr = buildArtifacts(dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func buildArtifacts(dir string) error {
	if _, err := exec.LookPath("gcc"); err != nil {
		return fmt.Errorf("gcc not installed (needed to build test libraries)")
	}
	src := filepath.Join(dir, "lib.c")
	if err := os.WriteFile(src, []byte(libSrc), 0o644); err != nil {
		return err
	}
	psrc := filepath.Join(dir, "probe.c")
	if err := os.WriteFile(psrc, []byte(probeSrc), 0o644); err != nil {
		return err
	}
	for _, c := range [][]string{
		{"-shared", "-fPIC", "-DVERSION=13000", "-Wl,-soname,libcuda.so.1", "-o", driverLib, src},
		{"-shared", "-fPIC", "-DVERSION=1", "-Wl,-soname,libcuda.so.1", "-o", stubLib, src},
		{"-shared", "-fPIC", "-DVERSION=666", "-Wl,-soname,libhostonly.so.1", "-o", hostOnlyLib, src},
		// -ldl for glibc before 2.34, where dlopen lived in libdl.
		{"-o", probeBin, psrc, "-ldl"},
	} {
		cmd := exec.Command("gcc", c...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("gcc %s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	return nil
}

func needArtifacts(t *testing.T) {
	t.Helper()
	if artifactErr != nil {
		t.Skipf("skipping: %v", artifactErr)
	}
}

// basicRoot is an image root without a loader: enough for tests that only
// look at the cache written. The driver library is in
// /usr/local/nvidia/lib64, as a CDI mount would place it.
func basicRoot(t *testing.T) string {
	t.Helper()
	needArtifacts(t)
	dir := filepath.Join(t.TempDir(), "rootfs")
	mkdirs(t, dir, "etc", "usr/local/nvidia/lib64")
	copyFile(t, filepath.Join(artifacts, driverLib), filepath.Join(dir, "usr/local/nvidia/lib64", driverLib))
	return dir
}

// imageRoot is a minimal real image: the host's glibc loader and the
// libraries the probe needs (found with ldd on the probe and copied to the
// same paths), the probe at /probe, an /etc/ld.so.conf naming only those
// libraries' directories, and an /etc/ld.so.cache made by the real
// `ldconfig -r`. The driver library sits in /usr/local/nvidia/lib64, which
// the image's configuration does not name. extra is called before ldconfig
// runs, to add image content.
func imageRoot(t *testing.T, extra func(dir string)) string {
	t.Helper()
	for _, tool := range []string{"ldconfig", "ldd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: %s not installed", tool)
		}
	}
	dir := basicRoot(t)
	conf, err := fakedriver.CopyLoaderDeps(filepath.Join(artifacts, probeBin), dir)
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	writeFile(t, filepath.Join(dir, "etc/ld.so.conf"), strings.Join(conf, "\n")+"\n")
	copyFile(t, filepath.Join(artifacts, probeBin), filepath.Join(dir, probeBin))
	if extra != nil {
		extra(dir)
	}
	if out, err := exec.Command("ldconfig", "-r", dir).CombinedOutput(); err != nil {
		t.Fatalf("ldconfig -r %s: %v\n%s", dir, err, out)
	}
	return dir
}

// probe runs /probe in the image with chroot: the real loader, the
// image's libc, and the cache on disk decide what dlopen finds.
func probe(t *testing.T, dir string) (string, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: chroot needs root")
	}
	if _, err := exec.LookPath("chroot"); err != nil {
		t.Skip("skipping: chroot not installed")
	}
	cmd := exec.Command("chroot", dir, "/"+probeBin)
	// A clean environment: a GPU host's LD_LIBRARY_PATH (GKE sets one)
	// would find libcuda without the cache this test checks.
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func mkdirs(t *testing.T, root string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatalf("copying into the test image: %v", err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// bundle writes an OCI bundle around rootDir (root.path relative when
// rootDir is the bundle's "rootfs") and returns the state JSON a runtime
// would give a hook.
func bundle(t *testing.T, rootDir string) []byte {
	t.Helper()
	b := filepath.Dir(rootDir)
	rp := rootDir
	if filepath.Base(rootDir) == "rootfs" {
		rp = "rootfs"
	}
	cfg, _ := json.Marshal(specs.Spec{Version: specs.Version, Root: &specs.Root{Path: rp}})
	writeFile(t, filepath.Join(b, "config.json"), string(cfg))
	st, _ := json.Marshal(specs.State{Version: specs.Version, ID: "c1", Status: specs.StateCreating, Pid: os.Getpid(), Bundle: b})
	return st
}
