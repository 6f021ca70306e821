//go:build linux

package engines

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/procfs"
)

// fixture is what every engine test shares, built once per test binary:
// the gantry binary under its engine-facing names, the fake driver, the
// configuration that points Gantry at them, and the test image.
type fixture struct {
	dir        string // scratch directory of this run
	binDir     string // gantry and its names; first in every daemon's PATH
	gantry     string
	runtime    string // binDir/gantry-runtime
	nvRuntime  string // binDir/nvidia-container-runtime, the same under NVIDIA's name
	driver     *fakedriver.Result
	config     string // GANTRY_CONFIG for daemons, runtimes and hooks
	runtimeLog string // runtime.log-file: one line per container the shim handled
	rootfs     string // the test image's file tree
	rootfsTar  string // that tree as a tar file, for docker import
	ociArchive string // the same image as an OCI archive, for ctr import
	evilMark   string // host path /evil.so in the image writes if it is ever loaded on the host
	overlay    bool   // overlayfs works on dir's file system
	skip       string
	err        error
}

var (
	fxOnce sync.Once
	fx     fixture
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fx.dir != "" {
		unmountUnder(fx.dir)
		os.RemoveAll(fx.dir)
	}
	os.Exit(code)
}

// need returns the shared fixture, building it on first use; it skips the
// test when the host cannot run engine tests at all.
func need(t *testing.T) *fixture {
	t.Helper()
	fxOnce.Do(fx.build)
	if fx.skip != "" {
		t.Skip(fx.skip)
	}
	if fx.err != nil {
		t.Fatal(fx.err)
	}
	return &fx
}

func (f *fixture) build() {
	if os.Geteuid() != 0 {
		f.skip = "needs root: the tests start private container engines"
		return
	}
	for _, tool := range []string{"runc", "gcc", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			f.skip = tool + " not installed (scripts/deps.sh --test installs the test tools)"
			return
		}
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		f.skip = "busybox not installed (apt-get install busybox-static; scripts/deps.sh --test does)"
		return
	}
	if f.dir, err = os.MkdirTemp("", "gantry-engines-"); err != nil {
		f.err = err
		return
	}
	if err := f.buildAll(busybox); err != nil {
		f.err = fmt.Errorf("building the engine test fixture: %w", err)
	}
}

func (f *fixture) buildAll(busybox string) error {
	f.binDir = filepath.Join(f.dir, "bin")
	f.gantry = filepath.Join(f.binDir, "gantry")
	if err := buildGantry(f.gantry); err != nil {
		return err
	}
	// gantry cdi generate's specs run the CDI hook binary beside gantry.
	if err := buildHook(filepath.Join(f.binDir, "gantry-cdi-hook")); err != nil {
		return err
	}
	// The names engines look for: a runtime path in their config, and the
	// hook Docker finds in its PATH for --gpus.
	for _, name := range []string{"gantry-runtime", "nvidia-container-runtime", "nvidia-container-runtime-hook"} {
		if err := os.Symlink("gantry", filepath.Join(f.binDir, name)); err != nil {
			return err
		}
	}
	f.runtime = filepath.Join(f.binDir, "gantry-runtime")
	f.nvRuntime = filepath.Join(f.binDir, "nvidia-container-runtime")

	var err error
	f.driver, err = fakedriver.Build(filepath.Join(f.dir, "driver"), fakedriver.Options{GPUs: 8, DeviceNodes: true})
	if err != nil {
		return err
	}
	if !f.driver.RealDeviceNodes {
		return fmt.Errorf("the fake driver has no real device nodes: %v", f.driver.Notes)
	}

	f.config = filepath.Join(f.dir, "gantry.toml")
	f.runtimeLog = filepath.Join(f.dir, "runtime.log")
	cfg := fmt.Sprintf(`# engine tests: simulated GPUs over a fake driver root
gpus = 'sim:h100x8'
driver-root = %q
log-level = 'debug'

[runtime]
  cache-dir = %q
  log-file = %q
  kubelet-dir = %q
  driver-tree-dir = %q  # the default layout's trees, here rather than on the host
`, f.driver.Root, filepath.Join(f.dir, "cache"), f.runtimeLog, f.kubeletDir(), filepath.Join(f.dir, "trees"))
	if err := os.WriteFile(f.config, []byte(cfg), 0o644); err != nil {
		return err
	}
	f.rootfs = filepath.Join(f.dir, "image")
	if err := buildImageTree(f.rootfs, busybox); err != nil {
		return err
	}
	f.evilMark = filepath.Join(f.dir, "host-only", "evil-was-loaded")
	if err := addHostileFiles(f.rootfs, f.evilMark); err != nil {
		return err
	}
	layer, err := tarTree(f.rootfs)
	if err != nil {
		return err
	}
	f.rootfsTar = filepath.Join(f.dir, "image.tar")
	if err := os.WriteFile(f.rootfsTar, layer, 0o644); err != nil {
		return err
	}
	f.ociArchive = filepath.Join(f.dir, "image-oci.tar")
	if err := writeOCIArchive(f.ociArchive, layer, ctrImage); err != nil {
		return err
	}
	f.overlay = overlayWorks(f.dir)
	return nil
}

// daemonEnv is the environment every engine daemon runs with: Gantry's
// names first in PATH (Docker looks the hook up there; runtimes and hooks
// inherit it) and GANTRY_CONFIG, which the runtime and the hook read.
func (f *fixture) daemonEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH", k == "GANTRY_CONFIG", k == "NOTIFY_SOCKET",
			strings.HasPrefix(k, "DOCKER_"), strings.HasPrefix(k, "CONTAINERD_"):
			continue
		}
		env = append(env, kv)
	}
	path := f.binDir + ":" + os.Getenv("PATH")
	for _, d := range []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"} {
		if !strings.Contains(":"+path+":", ":"+d+":") {
			path += ":" + d
		}
	}
	return append(env, "PATH="+path, "GANTRY_CONFIG="+f.config)
}

// runtimeLogTail is the end of the shim's per-container log, for failure
// messages.
func (f *fixture) runtimeLogTail() string {
	return "gantry-runtime log (" + f.runtimeLog + "):\n" + tail(f.runtimeLog, 4000)
}

func buildGantry(dst string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = "/usr/local/go/bin/go" // where the Makefile looks too
	}
	cmd := exec.Command(goTool, "build", "-o", dst, "github.com/gantry-gpu/gantry/cmd/gantry")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/gantry: %v\n%s", err, out)
	}
	return nil
}

// buildHook builds cmd/gantry-cdi-hook as make build does: CGO_ENABLED=0,
// statically linked.
func buildHook(dst string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = "/usr/local/go/bin/go"
	}
	cmd := exec.Command(goTool, "build", "-trimpath", "-o", dst, "github.com/gantry-gpu/gantry/cmd/gantry-cdi-hook")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/gantry-cdi-hook: %v\n%s", err, out)
	}
	return nil
}

// evilSrc is the library a hostile image names in LD_PRELOAD
// (CVE-2025-23266): loaded anywhere it leaves two marks, HOSTMARK, a host
// path no container sees, and evil-rootfs-mark in its working directory
// (the image's root, for a createContainer hook and for the container).
const evilSrc = `#include <stdio.h>
static void leave(const char *p) {
	FILE *f = fopen(p, "w");
	if (f) { fputs("loaded", f); fclose(f); }
}
__attribute__((constructor)) static void mark(void) {
	leave(HOSTMARK);
	leave("evil-rootfs-mark");
}
`

// addHostileFiles puts what the image-environment tests point at into the
// image: /evil.so (evilSrc, marking hostMark), /evil-libs and /evil-gconv
// for LD_LIBRARY_PATH and GCONV_PATH, and /etc/gantry-evil.toml, a
// configuration that fails whoever reads it (an unknown GPU backend).
func addHostileFiles(root, hostMark string) error {
	for _, d := range []string{filepath.Dir(hostMark), filepath.Join(root, "evil-libs"), filepath.Join(root, "evil-gconv")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	src := filepath.Join(filepath.Dir(hostMark), "evil.c")
	if err := os.WriteFile(src, []byte(evilSrc), 0o644); err != nil {
		return err
	}
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-DHOSTMARK=\""+hostMark+"\"", "-o", filepath.Join(root, "evil.so"), src).CombinedOutput(); err != nil {
		return fmt.Errorf("gcc evil.so: %v\n%s", err, out)
	}
	toml := "gpus = \"opencl\"\n[cdi]\nhook-path = \"/proc/self/cwd/evil\"\n"
	return os.WriteFile(filepath.Join(root, "etc/gantry-evil.toml"), []byte(toml), 0o644)
}

// probeName is the probe program's path inside the image.
const probeName = "/usr/bin/probe"

// buildImageTree makes the test image's file tree: a merged-/usr layout as
// Debian's, busybox with its applets, the probe program (testdata/probe.c)
// with the host's glibc, and an ld.so.cache made by the host's ldconfig, as
// real images have. The image carries no NVIDIA file: whatever the probe
// finds was put there by Gantry.
func buildImageTree(root, busybox string) error {
	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc/ld.so.conf.d",
		"dev", "proc", "sys", "root", "run", "var", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o777|fs.ModeSticky); err != nil {
		return err
	}
	for link, target := range map[string]string{"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			return err
		}
	}
	if err := copyFile(busybox, filepath.Join(root, "usr/bin/busybox"), 0o755); err != nil {
		return err
	}
	for _, applet := range []string{"sh", "ls", "cat", "echo", "env", "grep", "stat", "test", "true", "head", "wc", "readlink"} {
		if err := os.Symlink("busybox", filepath.Join(root, "usr/bin", applet)); err != nil {
			return err
		}
	}
	src, err := filepath.Abs("testdata/probe.c")
	if err != nil {
		return err
	}
	probe := filepath.Join(root, probeName)
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-o", probe, src, "-ldl").CombinedOutput(); err != nil {
		return fmt.Errorf("gcc %s: %v\n%s", src, err, out)
	}
	libDirs := map[string]bool{}
	for _, prog := range []string{probe, filepath.Join(root, "usr/bin/busybox")} {
		if err := copyLibs(prog, root, libDirs); err != nil {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd":                           "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":                            "root:x:0:\n",
		"etc/ld.so.conf":                       "include /etc/ld.so.conf.d/*.conf\n",
		"etc/ld.so.conf.d/libc.conf":           "/usr/local/lib\n",
		"etc/ld.so.conf.d/system-libdirs.conf": joinSorted(libDirs),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	ldconfig, err := exec.LookPath("ldconfig")
	if err != nil {
		ldconfig = "/sbin/ldconfig"
	}
	if out, err := exec.Command(ldconfig, "-r", root).CombinedOutput(); err != nil {
		return fmt.Errorf("ldconfig -r %s: %v\n%s", root, err, out)
	}
	return nil
}

func joinSorted(set map[string]bool) string {
	var s []string
	for k := range set {
		s = append(s, k)
	}
	sort.Strings(s)
	return strings.Join(s, "\n") + "\n"
}

// lddLine matches the paths ldd prints: "libc.so.6 => /lib/.../libc.so.6 (0x...)"
// and "/lib64/ld-linux-x86-64.so.2 (0x...)".
var lddLine = regexp.MustCompile(`(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)`)

// copyLibs copies the shared objects prog needs from the host into root at
// the same paths, and notes their directories.
func copyLibs(prog, root string, dirs map[string]bool) error {
	if f, err := elf.Open(prog); err == nil {
		static := true
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				static = false
			}
		}
		f.Close()
		if static {
			return nil
		}
	}
	out, err := exec.Command("ldd", prog).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ldd %s: %v\n%s", prog, err, out)
	}
	for _, m := range lddLine.FindAllStringSubmatch(string(out), -1) {
		host := m[1]
		real, err := filepath.EvalSymlinks(host)
		if err != nil {
			return err
		}
		dst := filepath.Join(root, host)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := copyFile(real, dst, 0o755); err != nil {
			return err
		}
		dirs[filepath.Dir(host)] = true
	}
	return nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}

// tarTree returns the tree at root as an uncompressed tar, owned by root,
// in a stable order.
func tarTree(root string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if d.Type()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "root", "root"
		hdr.ModTime = time.Unix(0, 0)
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeOCIArchive writes a one-layer OCI image archive (the format
// `ctr image import` reads) named name, whose command is /bin/sh.
func writeOCIArchive(path string, layer []byte, name string) error {
	return writeImageArchive(path, layer, name, []string{"/bin/sh"})
}

// writeImageArchive is writeOCIArchive with the image's command cmd.
func writeImageArchive(path string, layer []byte, name string, cmd []string) error {
	type descriptor struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int               `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	blobs := map[string][]byte{}
	add := func(mediaType string, b []byte) descriptor {
		sum := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(sum[:])
		blobs[d] = b
		return descriptor{MediaType: mediaType, Digest: d, Size: len(b)}
	}
	layerDesc := add("application/vnd.oci.image.layer.v1.tar", layer)
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Env": []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"Cmd": cmd,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        add("application/vnd.oci.image.config.v1+json", config),
		"layers":        []descriptor{layerDesc},
	})
	if err != nil {
		return err
	}
	manifestDesc := add("application/vnd.oci.image.manifest.v1+json", manifest)
	_, tag, _ := strings.Cut(name[strings.LastIndex(name, "/")+1:], ":")
	manifestDesc.Annotations = map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": tag,
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []descriptor{manifestDesc},
	})
	if err != nil {
		return err
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	file := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)})
	}
	if err := file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := file("index.json", index); err != nil {
		return err
	}
	if err := dir("blobs/"); err != nil {
		return err
	}
	if err := dir("blobs/sha256/"); err != nil {
		return err
	}
	var digests []string
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		if err := file("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), blobs[d]); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// overlayWorks reports whether an overlay mount can be made under dir, so
// the engines can use their overlay storage rather than full copies.
func overlayWorks(dir string) bool {
	base, err := os.MkdirTemp(dir, "overlay-probe-")
	if err != nil {
		return false
	}
	defer os.RemoveAll(base)
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		if err := os.Mkdir(filepath.Join(base, d), 0o755); err != nil {
			return false
		}
	}
	opts := fmt.Sprintf("lowerdir=%s/lower,upperdir=%s/upper,workdir=%s/work", base, base, base)
	merged := filepath.Join(base, "merged")
	if err := syscall.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		return false
	}
	return syscall.Unmount(merged, 0) == nil
}

// daemon is an engine process the tests started, in its own process group.
type daemon struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // from Wait, once done is closed
}

// startDaemon starts argv in its own process group with env, logging to
// logPath, and stops it (and whatever it left behind under scratch) when
// the test ends.
func startDaemon(t *testing.T, name, logPath, scratch string, env []string, argv ...string) *daemon {
	t.Helper()
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, so that stopping it reaches its helpers too;
	// the death signal stops it if the test binary itself dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	d := &daemon{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		logFile.Close()
		close(d.done)
	}()
	t.Cleanup(func() {
		d.stop(t)
		killUnder(scratch)
		if left := unmountUnder(scratch); len(left) > 0 {
			t.Errorf("%s: could not unmount %v", name, left)
		}
	})
	return d
}

// stop ends the daemon gracefully (SIGTERM to its process group), and with
// SIGKILL if it has not gone after a while.
func (d *daemon) stop(t *testing.T) {
	pgid := d.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		t.Logf("%s did not stop on SIGTERM; killing it", d.name)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-d.done
	}
	// Anything still in the group (a helper that ignored SIGTERM).
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// waitReady polls ready until it succeeds, failing the test with the
// daemon's log if the daemon exits or does not come up.
func (d *daemon) waitReady(t *testing.T, ready func() error) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := ready()
		if err == nil {
			return
		}
		select {
		case <-d.done:
			t.Fatalf("%s exited (%v) before it was ready:\n%s", d.name, d.err, tail(d.log, 6000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready: %v\n%s", d.name, err, tail(d.log, 6000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killUnder kills the processes a daemon left behind that name scratch on
// their command line (containerd's shims are started in their own process
// groups, outside the daemon's).
func killUnder(scratch string) {
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(scratch+"/")) {
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// unmountUnder detaches every mount below dir, deepest first, and returns
// the ones it could not.
func unmountUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := procfs.UnescapeMountinfo(fields[4])
		if strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	var left []string
	for _, mp := range mounts {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			left = append(left, mp)
		}
	}
	return left
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// command runs a client program with env and returns its combined output.
// The deadline only keeps a wedged engine from hanging the test binary.
func command(env []string, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	return string(out), nil
}

// engineHostDirs are the host directories the engines create whatever
// their configuration says: containerd's shims put their sockets under
// /run/containerd/s, and dockerd makes /run/docker/plugins for plugin
// discovery.
var engineHostDirs = []string{
	"/run/containerd/s", "/run/containerd/fifo", "/run/containerd/runc", "/run/containerd",
	"/run/docker/plugins", "/run/docker",
}

// hostDirsCleanup removes, when the test ends, those of engineHostDirs that
// did not exist before it and are empty by then (never anything in them).
// Call it before starting daemons, so that it runs after they stop.
func hostDirsCleanup(t *testing.T) {
	var absent []string
	for _, d := range engineHostDirs {
		if _, err := os.Lstat(d); errors.Is(err, fs.ErrNotExist) {
			absent = append(absent, d)
		}
	}
	t.Cleanup(func() {
		for _, d := range absent {
			_ = os.Remove(d) // only if empty
		}
	})
}
