package containerhook

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/ldcache"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

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

// imageRoot makes a minimal image: the host's glibc loader and libc, a probe
// program, and an ld.so.cache from the real ldconfig that knows nothing of
// /usr/local/nvidia/lib64. The fake driver's libcuda is copied in there, as a
// CDI mount would place it.
func imageRoot(t *testing.T) (dir string, cudaVersion int) {
	t.Helper()
	for _, tool := range []string{"gcc", "ldconfig", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (make test-deps installs it)", tool)
		}
	}
	dir = filepath.Join(t.TempDir(), "rootfs")
	drv := filepath.Join(t.TempDir(), "driver")
	res, err := fakedriver.Build(drv, fakedriver.Options{Version: "580.159.04", GPUs: 1})
	if err != nil {
		t.Fatalf("fake driver: %v", err)
	}
	for _, d := range []string{"lib64", "lib/x86_64-linux-gnu", "etc", "usr/local/nvidia/lib64"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat("/lib/x86_64-linux-gnu/libc.so.6"); err != nil {
		t.Skip("this test copies an x86-64 Debian-layout glibc into the image; none here")
	}
	copyFile(t, "/lib64/ld-linux-x86-64.so.2", filepath.Join(dir, "lib64/ld-linux-x86-64.so.2"))
	copyFile(t, "/lib/x86_64-linux-gnu/libc.so.6", filepath.Join(dir, "lib/x86_64-linux-gnu/libc.so.6"))
	os.WriteFile(filepath.Join(dir, "etc/ld.so.conf"), []byte("/lib/x86_64-linux-gnu\n"), 0o644)
	if out, err := exec.Command("ldconfig", "-r", dir).CombinedOutput(); err != nil {
		t.Fatalf("ldconfig -r: %v\n%s", err, out)
	}
	src := filepath.Join(t.TempDir(), "probe.c")
	os.WriteFile(src, []byte(probeSrc), 0o644)
	if out, err := exec.Command("gcc", "-o", filepath.Join(dir, "probe"), src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	var found bool
	for _, l := range res.Libraries {
		if l.SONAME == "libcuda.so.1" && l.Bits == 64 {
			copyFile(t, filepath.Join(drv, l.Path), filepath.Join(dir, "usr/local/nvidia/lib64", filepath.Base(l.Path)))
			found = true
		}
	}
	if !found {
		t.Fatal("fake driver has no 64-bit libcuda")
	}
	return dir, res.CUDAVersion
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

func probe(t *testing.T, dir string) (string, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	out, err := exec.Command("chroot", dir, "/probe").CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// The real loader, inside the container root, finds libcuda.so.1 only
// thanks to the symlink and the cache the hooks write.
func TestHooksMakeLibcudaLoadable(t *testing.T) {
	dir, want := imageRoot(t)
	if out, err := probe(t, dir); err == nil {
		t.Fatalf("probe found libcuda before the hooks ran: %s", out)
	}
	r, err := rootfs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	l, err := ParseLink("libcuda.so.580.159.04::/usr/local/nvidia/lib64/libcuda.so.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := CreateSymlinks(r, []Link{l}); err != nil {
		t.Fatal(err)
	}
	if err := UpdateLDCache(r, []string{"/usr/local/nvidia/lib64"}, func(w string) { t.Log(w) }); err != nil {
		t.Fatal(err)
	}
	out, err := probe(t, dir)
	if err != nil || out != strconv.Itoa(want) {
		t.Fatalf("probe after hooks: %q, %v (want %d)", out, err, want)
	}
	// The image's own entries are still there, and ours come first.
	c, err := ldcache.Open(filepath.Join(dir, "etc/ld.so.cache"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Lookup("libc.so.6"); len(got) != 1 {
		t.Errorf("image's libc entry lost: %v", got)
	}
	if got := c.Lookup("libcuda.so.1"); len(got) != 1 || got[0] != "/usr/local/nvidia/lib64/libcuda.so.1" {
		t.Errorf("libcuda entry = %v", got)
	}
	conf, _ := os.ReadFile(filepath.Join(dir, ConfFile))
	if !strings.Contains(string(conf), "/usr/local/nvidia/lib64\n") {
		t.Errorf("%s = %q", ConfFile, conf)
	}
	// Running the hooks twice changes nothing.
	before, _ := os.ReadFile(filepath.Join(dir, "etc/ld.so.cache"))
	if err := UpdateLDCache(r, []string{"/usr/local/nvidia/lib64"}, func(string) {}); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "etc/ld.so.cache"))
	if !bytes.Equal(before, after) {
		t.Error("second UpdateLDCache changed the cache")
	}
}

// CVE-2025-23267 class: the image's /etc/ld.so.cache is a link to a host
// file. The host file must stay as it was; the container gets a real file.
func TestUpdateLDCacheHostileLinks(t *testing.T) {
	dir, _ := imageRoot(t)
	victim := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(victim, []byte("host file\n"), 0o644)
	cache := filepath.Join(dir, "etc/ld.so.cache")
	os.Remove(cache)
	if err := os.Symlink(victim, cache); err != nil {
		t.Fatal(err)
	}
	// A --folder that is a link to a host directory is listed inside the root.
	hostLibs := t.TempDir()
	copyFile(t, "/lib/x86_64-linux-gnu/libc.so.6", filepath.Join(hostLibs, "libhostonly.so.1"))
	os.Symlink(hostLibs, filepath.Join(dir, "usr/local/evil"))

	r, err := rootfs.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := UpdateLDCache(r, []string{"/usr/local/nvidia/lib64"}, func(string) {}); err != nil {
		t.Fatalf("UpdateLDCache with a symlinked cache: %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "host file\n" {
		t.Fatalf("host file written through the image's symlink: %q", b)
	}
	if fi, err := os.Lstat(cache); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("/etc/ld.so.cache in the image is not a regular file now: %v", err)
	}
	// The host directory is never listed: the folder resolves (clamped) to a
	// path that does not exist inside the root.
	err = UpdateLDCache(r, []string{"/usr/local/evil"}, func(string) {})
	if err == nil {
		c, _ := ldcache.Open(cache)
		for e := range c.Libraries() {
			if e.Name == "libc.so.6" && strings.Contains(e.Path, "evil") {
				t.Errorf("a library from the host directory entered the cache: %v", e)
			}
		}
	}
	// And when the link's target exists inside the root, that is what is listed.
	inside := filepath.Join(dir, hostLibs)
	os.MkdirAll(inside, 0o755)
	copyFile(t, filepath.Join(dir, "usr/local/nvidia/lib64/libcuda.so.580.159.04"), filepath.Join(inside, "libcuda.so.580.159.04"))
	if err := UpdateLDCache(r, []string{"/usr/local/evil"}, func(string) {}); err != nil {
		t.Fatal(err)
	}
	c, _ := ldcache.Open(cache)
	if got := c.Lookup("libcuda.so.1"); len(got) == 0 || got[0] != "/usr/local/evil/libcuda.so.580.159.04" {
		t.Errorf("clamped folder's library: %v", got)
	}
	for e := range c.Libraries() {
		if e.Name == "libc.so.6" && strings.Contains(e.Path, "evil") {
			t.Errorf("host directory listed: %v", e)
		}
	}
}

func TestRootPath(t *testing.T) {
	bundle := t.TempDir()
	spec := specs.Spec{Root: &specs.Root{Path: "rootfs"}}
	b, _ := json.Marshal(spec)
	os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644)
	state, _ := json.Marshal(specs.State{ID: "c1", Bundle: bundle, Pid: 1})
	got, err := RootPath(bytes.NewReader(state))
	if err != nil || got != filepath.Join(bundle, "rootfs") {
		t.Fatalf("RootPath = %q, %v", got, err)
	}
	for _, bad := range []string{"", "{", `{"bundle":""}`, `{"bundle":"/nonexistent"}`} {
		if _, err := RootPath(strings.NewReader(bad)); err == nil {
			t.Errorf("RootPath(%q) succeeded", bad)
		}
	}
}

func TestParseLink(t *testing.T) {
	for _, tt := range []struct {
		in string
		ok bool
	}{
		{"libcuda.so.1::/usr/lib/libcuda.so", true},
		{"../x::/a/b/../c", true},
		{"libcuda.so.1", false},
		{"::/a", false},
		{"a::", false},
		{"a::relative/b", false},
	} {
		_, err := ParseLink(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("ParseLink(%q) err = %v", tt.in, err)
		}
	}
}
