package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// snapshot returns every file under dir with its content or link target,
// to prove a host directory was not touched.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			m[p] = "-> " + l
		case info.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			m[p] = string(b)
		default:
			m[p] = info.Mode().String()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func sameSnapshot(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Errorf("%s changed on the host:\nbefore %v\nafter  %v", what, before, after)
	}
}

// Images whose paths lead out of the root filesystem (the CVE-2024-0132
// class): the library directory, /etc and the loader cache itself are
// symlinks to host paths. Gantry's writes must land inside the image, the
// host must stay as it was, and the container must still work.
func TestHostileImageLinks(t *testing.T) { eachRuntime(t, testHostileImageLinks) }

func testHostileImageLinks(t *testing.T) {
	host := t.TempDir()
	hostLib := filepath.Join(host, "lib")
	hostEtc := filepath.Join(host, "etc")
	hostCache := filepath.Join(host, "precious-cache")
	for _, d := range []string{hostLib, hostEtc} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, s := range map[string]string{
		filepath.Join(hostLib, "libcuda.so.1"): "host file",
		filepath.Join(hostEtc, "ld.so.cache"):  "host cache",
		filepath.Join(hostEtc, "passwd"):       "root:x:0:0::/root:/bin/sh\n",
		hostCache:                              "do not overwrite",
	} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name   string
		mutate func(rootfs string)
	}{
		{"library dir links to a host dir", func(r string) {
			os.RemoveAll(filepath.Join(r, libDir))
			os.Symlink(hostLib, filepath.Join(r, libDir))
		}},
		{"library dir links upwards", func(r string) {
			os.RemoveAll(filepath.Join(r, libDir))
			os.Symlink("../../../../../../../.."+hostLib, filepath.Join(r, libDir))
		}},
		{"/etc links to a host dir", func(r string) {
			os.RemoveAll(filepath.Join(r, "etc"))
			os.Symlink(hostEtc, filepath.Join(r, "etc"))
		}},
		{"library dir links to a host dir the image also has", func(r string) {
			// The link resolves inside the root, where the directory exists.
			os.MkdirAll(filepath.Join(r, hostLib), 0o755)
			os.RemoveAll(filepath.Join(r, libDir))
			os.Symlink(hostLib, filepath.Join(r, libDir))
		}},
		{"/etc/ld.so.cache links to a host file", func(r string) {
			os.Symlink(hostCache, filepath.Join(r, "etc/ld.so.cache"))
		}},
		// The tree layout replaces a driver library the image carries
		// in its library folder by a link into the tree: never through
		// the image's link.
		{"the image's libcuda.so.1 links to a host file", func(r string) {
			os.Symlink(filepath.Join(hostLib, "libcuda.so.1"), filepath.Join(r, libDir, "libcuda.so.1"))
		}},
		{"the image's libcuda.so.1 links upwards to a host file", func(r string) {
			os.Symlink("../../../../../../.."+filepath.Join(hostLib, "libcuda.so.1"), filepath.Join(r, libDir, "libcuda.so.1"))
		}},
		// The tree layout's links for programs and for the OpenCL vendor
		// file (a compute container's) land in these folders.
		{"/usr/bin links to a host dir", func(r string) {
			os.MkdirAll(filepath.Join(r, "usr"), 0o755)
			os.RemoveAll(filepath.Join(r, "usr/bin"))
			os.Symlink(hostLib, filepath.Join(r, "usr/bin"))
		}},
		{"/etc/OpenCL/vendors links to a host dir", func(r string) {
			os.MkdirAll(filepath.Join(r, "etc/OpenCL"), 0o755)
			os.Symlink(hostEtc, filepath.Join(r, "etc/OpenCL/vendors"))
		}},
	}
	// Each case through gantry-runtime in-process and through the create
	// server, and through Docker's --gpus hook in-process and through the
	// server: four ways of making the same changes, two of them from
	// another process and the hooks' through the container's /proc/PID/root.
	sock, _, _ := startServer(t, need(t).runtime)
	for _, tc := range cases {
		for _, mode := range []struct {
			name   string
			server string
			hook   bool
		}{{"", "", false}, {" (create server)", sock, false}, {" (hook)", "", true}, {" (hook, create server)", sock, true}} {
			t.Run(tc.name+mode.name, func(t *testing.T) {
				before := snapshot(t, host)
				c := newContainer(t, opts{
					env:    []string{"NVIDIA_VISIBLE_DEVICES=0"},
					args:   []string{"probe"},
					mutate: tc.mutate,
				})
				var out, stderr string
				var err error
				if mode.hook {
					withHook(t, c, mode.server, nil)
					out, err = c.lowRun()
					// crun does not pass a failed hook's stderr on: the
					// hook's log record has its error.
					stderr = out
					for _, r := range hookRecords(t, c) {
						if e, ok := r["error"].(string); ok {
							stderr += e
						}
					}
				} else {
					c.server = mode.server
					out, stderr, err = c.run()
				}
				sameSnapshot(t, host, before, snapshot(t, host))
				// Either outcome is safe: the link resolved inside the image
				// and the container works, or (a link to a directory the
				// image lacks) the create is refused with an error naming it.
				switch {
				case err == nil && strings.Contains(out, "cuda="):
				case err != nil && strings.Contains(stderr, "missing in the root") && (mode.hook || strings.Count(strings.TrimSpace(stderr), "\n") == 0):
				default:
					t.Errorf("want a working libcuda or a clear refusal: %v\n%s\n%s", err, out, stderr)
				}
				// A hook run by a low-level runtime in a mount namespace of
				// its own (crun behind its cgroup2 wrapper here) is rightly
				// not served.
				if mode.server != "" && err == nil && !(mode.hook && wrapped(c.low)) {
					recs := logLines(t, c)
					if len(recs) != 1 || recs[0]["server"] != true {
						t.Errorf("the create server did not do this work: %v", recs)
					}
				}
			})
		}
	}
}

// An image that sets LD_PRELOAD and LD_LIBRARY_PATH (the CVE-2025-23266
// attack on hooks): nothing Gantry runs on the host may load the image's
// library. evil.so leaves a mark at a host-only path when it is loaded by a
// process that sees the host's file system; inside the container that path
// does not exist.
func TestImagePreloadNeverRunsOnHost(t *testing.T) { eachRuntime(t, testImagePreloadNeverRunsOnHost) }

func testImagePreloadNeverRunsOnHost(t *testing.T) {
	f := need(t)
	os.Remove(f.mark)
	c := newContainer(t, opts{
		env:  []string{"NVIDIA_VISIBLE_DEVICES=all", "LD_PRELOAD=/evil.so", "LD_LIBRARY_PATH=/"},
		args: []string{"sh", "-c", "probe; test -e " + f.mark + " && echo mark-visible || echo mark-not-visible"},
	})
	out, stderr, err := c.run()
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, out, stderr)
	}
	if _, err := os.Stat(f.mark); err == nil {
		t.Fatalf("the image's LD_PRELOAD library ran on the host")
	}
	// The control: evil.so does work, when loaded where the mark's
	// directory exists (here: on the host, on purpose, by us).
	cmd := exec.Command(filepath.Join(c.rootfs, "bin/true"))
	cmd.Env = []string{"LD_PRELOAD=" + filepath.Join(c.rootfs, "evil.so")}
	_ = cmd.Run() // busybox is static: the preload cannot take; use the probe
	cmd = exec.Command(filepath.Join(f.imageDir, "bin/probe"))
	cmd.Env = []string{"LD_PRELOAD=" + filepath.Join(f.imageDir, "evil.so")}
	_ = cmd.Run()
	if _, err := os.Stat(f.mark); err != nil {
		t.Fatalf("control failed: evil.so leaves no mark even when preloaded on the host: the test proves nothing")
	}
	os.Remove(f.mark)
}

// CUDA forward compatibility: an image whose /usr/local/cuda/compat holds a
// libcuda newer than the host driver uses it; an older one is ignored.
func TestForwardCompat(t *testing.T) {
	f := need(t)
	src := filepath.Join(t.TempDir(), "compat.c")
	if err := os.WriteFile(src, []byte(compatSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	hostMajor := strings.Split(f.driver.Version, ".")[0]
	for _, tc := range []struct {
		version string
		want    string
	}{
		{"999.1.2", "cuda=99990 path=/usr/local/cuda/compat/libcuda.so.1"},
		{hostMajor + ".0.1", fmt.Sprintf("cuda=%d path=%s/libcuda.so.1", f.driver.CUDAVersion, treeLibDir)},
		{"100.1.1", fmt.Sprintf("cuda=%d path=%s/libcuda.so.1", f.driver.CUDAVersion, treeLibDir)},
	} {
		t.Run(tc.version, func(t *testing.T) {
			c := newContainer(t, opts{
				env:  []string{"NVIDIA_VISIBLE_DEVICES=0"},
				args: []string{"probe"},
				mutate: func(r string) {
					dir := filepath.Join(r, "usr/local/cuda/compat")
					if err := os.MkdirAll(dir, 0o755); err != nil {
						t.Fatal(err)
					}
					lib := filepath.Join(dir, "libcuda.so."+tc.version)
					if err := run("gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", lib, src); err != nil {
						t.Fatal(err)
					}
					if err := os.Symlink("libcuda.so."+tc.version, filepath.Join(dir, "libcuda.so.1")); err != nil {
						t.Fatal(err)
					}
				},
			})
			out, stderr, err := c.run()
			if err != nil {
				t.Fatalf("%v\n%s\n%s", err, out, stderr)
			}
			if strings.TrimSpace(out) != tc.want {
				t.Errorf("compat %s on a %s host: probe says %q, want %q", tc.version, f.driver.Version, strings.TrimSpace(out), tc.want)
			}
		})
	}
}

// A config.json that names "linux" twice: runc's decoder merges the two
// objects, so the container's masked paths, given only in the first, hold.
// gantry-runtime's in-place patch of config.json must not keep only the
// last object (which dropped maskedPaths and seccomp before the fix): the
// container still has its masked path masked and gets its GPUs.
func TestDuplicateKeysKeepMaskedPaths(t *testing.T) { eachRuntime(t, testDuplicateKeysKeepMaskedPaths) }

func testDuplicateKeysKeepMaskedPaths(t *testing.T) {
	// A path of runc's default masked list that this kernel has (runc
	// masks only those that exist).
	path := ""
	for _, p := range []string{"/proc/keys", "/proc/timer_list", "/proc/kcore"} {
		if _, err := os.Stat(p); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Skip("none of /proc/keys, /proc/timer_list, /proc/kcore exists here")
	}
	c := newContainer(t, opts{
		env:  []string{"NVIDIA_VISIBLE_DEVICES=0"},
		args: []string{"sh", "-c", "probe; echo masked-mounts=$(grep -c ' " + path + " ' /proc/self/mountinfo)"},
	})
	var top map[string]json.RawMessage
	if err := json.Unmarshal(c.configJSON(), &top); err != nil {
		t.Fatal(err)
	}
	var linux map[string]json.RawMessage
	if err := json.Unmarshal(top["linux"], &linux); err != nil {
		t.Fatal(err)
	}
	masked, ok := linux["maskedPaths"]
	if !ok || !strings.Contains(string(masked), `"`+path+`"`) {
		t.Fatalf("the test spec does not mask %s: %s", path, masked)
	}
	delete(linux, "maskedPaths")
	delete(top, "linux")
	rest, _ := json.Marshal(linux)
	others, _ := json.Marshal(top)
	// {"linux":{"maskedPaths":[...]}, ...the other members..., "linux":{...the rest...}}
	spec := `{"linux":{"maskedPaths":` + string(masked) + `},` + strings.TrimPrefix(strings.TrimSuffix(string(others), "}"), "{") + `,"linux":` + string(rest) + `}`
	if err := os.WriteFile(filepath.Join(c.bundle, "config.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := c.run()
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, out, stderr)
	}
	if !strings.Contains(out, "masked-mounts=1") {
		t.Errorf("%s is not masked in the container (a repeated key lost maskedPaths):\n%s", path, out)
	}
	if !strings.Contains(out, "cuda=") {
		t.Errorf("the container did not get its GPU:\n%s", out)
	}
}

// wrapped reports whether the low-level runtime p is a script (a wrapper
// that runs the real one in a namespace of its own) rather than the program.
func wrapped(p string) bool {
	b := make([]byte, 2)
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	n, _ := f.Read(b)
	return n == 2 && string(b) == "#!"
}
