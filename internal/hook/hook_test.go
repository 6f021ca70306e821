package hook

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// Built once by TestMain: the gantry binary under the hook's names, a fake
// driver root with real device nodes, the image template and the config.
var (
	work     string
	hookBin  string // .../nvidia-container-runtime-hook -> gantry
	imageDir string // template root filesystem
	cfgFile  string
	logFile  string // runtime.log-file of cfgFile
	setupErr error  // why the integration tests cannot run
)

const probeSrc = `#include <dlfcn.h>
#include <stdio.h>
int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
	int (*get)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
	int v = 0;
	if (!get || get(&v) != 0) { printf("cuDriverGetVersion failed\n"); return 1; }
	printf("%d\n", v);
	return 0;
}
`

var applets = []string{"sh", "ls", "cat", "stat", "test", "head", "echo", "grep", "sort", "tr"}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gantry-hook-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	work = dir
	setupErr = setup(dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

func setup(dir string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("skip: runc containers and device nodes need root")
	}
	for _, tool := range []string{"runc", "gcc", "ldd", "ldconfig"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("skip: %s not installed", tool)
		}
	}
	busybox := ""
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if f, err := elf.Open(p); err == nil {
			static := true
			for _, prog := range f.Progs {
				static = static && prog.Type != elf.PT_INTERP
			}
			f.Close()
			if static {
				busybox = p
				break
			}
		}
	}
	if busybox == "" {
		return fmt.Errorf("skip: no statically linked busybox (apt-get install busybox-static; scripts/deps.sh --test does)")
	}

	goTool := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	bin := filepath.Join(dir, "bin")
	if err := run(goTool, "build", "-o", filepath.Join(bin, "gantry"), "github.com/gantry-gpu/gantry/cmd/gantry"); err != nil {
		return err
	}
	hookBin = filepath.Join(bin, "nvidia-container-runtime-hook")
	if err := os.Symlink("gantry", hookBin); err != nil {
		return err
	}

	drv, err := fakedriver.Build(filepath.Join(dir, "driver"), fakedriver.Options{GPUs: 8, DeviceNodes: true})
	if err != nil {
		return err
	}
	if !drv.RealDeviceNodes {
		return fmt.Errorf("the fake driver has no real device nodes: %v", drv.Notes)
	}
	cfgFile = filepath.Join(dir, "config.toml")
	logFile = filepath.Join(dir, "gantry.log")
	// The default driver layout is the tree: its trees here, not on the host.
	cfg := fmt.Sprintf("gpus = \"sim:h100x8\"\ndriver-root = %q\n[runtime]\ncache-dir = %q\nlog-file = %q\ndriver-tree-dir = %q\n", drv.Root, filepath.Join(dir, "cache"), logFile, filepath.Join(dir, "trees"))
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return err
	}

	// The image: busybox, and a dlopen probe with the host's glibc, its own
	// ld.so.conf and an ld.so.cache made by the real ldconfig.
	imageDir = filepath.Join(dir, "image")
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(imageDir, d), 0o755); err != nil {
			return err
		}
	}
	if err := copyFile(busybox, filepath.Join(imageDir, "bin/busybox")); err != nil {
		return err
	}
	for _, a := range applets {
		if err := os.Symlink("busybox", filepath.Join(imageDir, "bin", a)); err != nil {
			return err
		}
	}
	src := filepath.Join(dir, "probe.c")
	if err := os.WriteFile(src, []byte(probeSrc), 0o644); err != nil {
		return err
	}
	probe := filepath.Join(imageDir, "bin/probe")
	if err := run("gcc", "-O2", "-o", probe, src, "-ldl"); err != nil {
		return err
	}
	conf, err := fakedriver.CopyLoaderDeps(probe, imageDir)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(imageDir, "etc/ld.so.conf"), []byte(strings.Join(conf, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	return run("ldconfig", "-r", imageDir)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

func needSetup(t *testing.T) {
	t.Helper()
	if setupErr != nil {
		if strings.HasPrefix(setupErr.Error(), "skip: ") {
			t.Skip(strings.TrimPrefix(setupErr.Error(), "skip: "))
		}
		t.Fatal(setupErr)
	}
}

// bundle copies the image into a new bundle and writes its config.json:
// runc's default spec running script, with env added and the hook as
// Docker's --gpus adds it (path, args [nvidia-container-runtime-hook
// prestart]; GANTRY_CONFIG in the hook's own env).
func bundle(t *testing.T, script string, env ...string) (dir, rootfs string) {
	t.Helper()
	return bundleWith(t, script, nil, env...)
}

// bundleWith is bundle with edit applied to the spec before it is written.
func bundleWith(t *testing.T, script string, edit func(*specs.Spec), env ...string) (dir, rootfs string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "bundle")
	rootfs = filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := run("cp", "-a", imageDir, rootfs); err != nil {
		t.Fatal(err)
	}
	if err := run("runc", "spec", "--bundle", dir); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	s.Process.Terminal = false
	s.Process.Args = []string{"sh", "-c", script}
	s.Process.Env = append(s.Process.Env, env...)
	s.Hooks = &specs.Hooks{Prestart: []specs.Hook{{ //nolint:staticcheck // what Docker adds
		Path: hookBin,
		Args: []string{"nvidia-container-runtime-hook", "prestart"},
		Env:  []string{"GANTRY_CONFIG=" + cfgFile},
	}}}
	if edit != nil {
		edit(&s)
	}
	if b, err = json.MarshalIndent(&s, "", "  "); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, rootfs
}

func isCgroup2(p string) bool {
	out, err := exec.Command("stat", "-f", "-c", "%T", p).Output()
	return err == nil && strings.TrimSpace(string(out)) == "cgroup2fs"
}

// cgroupModes: "v1" or "v2" as the host runs runc, plus "v2" through a
// private mount namespace with the unified hierarchy over /sys/fs/cgroup on a
// hybrid host (what runc checks to pick v2).
func cgroupModes() []string {
	if isCgroup2("/sys/fs/cgroup") {
		return []string{"v2"}
	}
	modes := []string{"v1"}
	if _, err := exec.LookPath("unshare"); err == nil && isCgroup2("/sys/fs/cgroup/unified") {
		modes = append(modes, "v2")
	}
	return modes
}

func runContainer(t *testing.T, dir, id, mode string) (string, error) {
	t.Helper()
	state := filepath.Join(t.TempDir(), "runc-state")
	args := []string{"runc", "--root", state, "run", "--bundle", dir, id}
	var cmd *exec.Cmd
	if mode == "v2" && !isCgroup2("/sys/fs/cgroup") {
		script := `mount --make-rprivate / && mount --bind /sys/fs/cgroup/unified /sys/fs/cgroup && exec "$@"`
		cmd = exec.Command("unshare", append([]string{"-m", "sh", "-c", script, "sh"}, args...)...)
	} else {
		cmd = exec.Command(args[0], args[1:]...)
	}
	out, err := cmd.CombinedOutput()
	exec.Command("runc", "--root", state, "delete", "--force", id).Run()
	return string(out), err
}

func lines(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, ": "); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// snapshot records every file of a tree (type, mode, size, link target,
// content hash) to show that a root filesystem was left as it was.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		v := fmt.Sprintf("%v %d", info.Mode(), info.Size())
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			v += " -> " + l
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h := sha256.Sum256(b)
			v += " " + hex.EncodeToString(h[:])
		}
		m[strings.TrimPrefix(p, root)] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

const gpuScript = `
echo "nodes: $(ls /dev | grep nvidia | sort | tr '\n' ' ')"
echo "nvidia1: $(stat -c '%F %t:%T' /dev/nvidia1 2>&1)"
test -e /dev/nvidia0 && echo "nvidia0: present" || echo "nvidia0: absent"
echo "open1: $(head -c1 /dev/nvidia1 2>&1)"
echo "probe: $(/bin/probe 2>&1)"
echo "smi: $(nvidia-smi -L 2>&1 | tr '\n' ' ')"
echo "done: yes"
`

// Docker's --gpus path: NVIDIA_VISIBLE_DEVICES=1 in the container env and
// the hook under NVIDIA's name. Inside, GPU 1's node is there with the right
// numbers and opens as far as the (absent) driver (the cgroup allows it), GPU
// 0's is not, and libcuda.so.1 resolves through the ld.so.cache the hook
// extended.
func TestHookDockerGPUs(t *testing.T) {
	needSetup(t)
	for _, mode := range cgroupModes() {
		t.Run("cgroup-"+mode, func(t *testing.T) {
			dir, _ := bundle(t, gpuScript, "NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
			out, err := runContainer(t, dir, "hook-gpu-"+mode, mode)
			if err != nil {
				t.Fatalf("runc run: %v\n%s", err, out)
			}
			t.Logf("container output:\n%s", out)
			got := lines(out)
			want := map[string]string{
				"nvidia1": "character special file c3:1", // 195:1
				"nvidia0": "absent",
				"open1":   "No such device or address", // allowed; no driver behind it
				"probe":   fmt.Sprint(fakedriver.CUDAVersionFor(fakedriver.DefaultVersion)),
			}
			for k, v := range want {
				if !strings.Contains(got[k], v) {
					t.Errorf("%s: got %q, want %q", k, got[k], v)
				}
			}
			if !strings.Contains(got["smi"], "GPU 1:") || strings.Contains(got["smi"], "GPU 0:") {
				t.Errorf("smi: %q, want GPU 1 only", got["smi"])
			}
			if !strings.Contains(got["nodes"], "nvidiactl") || strings.Contains(got["nodes"], "nvidia2") {
				t.Errorf("nodes: %q, want nvidia1 and the control nodes only", got["nodes"])
			}
		})
	}
}

// The hook writes the runtime's log record (same keys, front-end
// gantry-hook) and, like the runtime, reads the driver inventory from the
// cache in runtime.cache-dir once one container has written it.
func TestHookLogRecord(t *testing.T) {
	needSetup(t)
	for _, id := range []string{"hook-log-1", "hook-log-2"} {
		dir, _ := bundle(t, "true", "NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility")
		if out, err := runContainer(t, dir, id, cgroupModes()[0]); err != nil {
			t.Fatalf("runc run %s: %v\n%s", id, err, out)
		}
	}
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	recs := map[string]map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if id, _ := rec["container"].(string); strings.HasPrefix(id, "hook-log-") {
			recs[id] = rec
		}
	}
	for _, id := range []string{"hook-log-1", "hook-log-2"} {
		rec := recs[id]
		if rec["front-end"] != "gantry-hook" || rec["changed"] != true || fmt.Sprint(rec["devices"]) != "[0]" || rec["source"] != "env" || rec["bundle"] == nil {
			t.Errorf("%s: log record %v: want front-end gantry-hook, changed, devices [0], source env, the bundle", id, rec)
		}
	}
	if inv := recs["hook-log-2"]["inventory"]; inv != "cache" {
		t.Errorf("second container: inventory from %v, want the cache the first one wrote", inv)
	}
}

// runtime.no-cgroups = true (nvidia-ctk config --set
// nvidia-container-cli.no-cgroups, for rootless engines): the hook adds the
// node but leaves the device cgroup alone, so under a rootful runc, whose
// cgroup denies what the spec does not allow, the node exists and opening
// it is refused; without the key it opens (TestHookDockerGPUs).
func TestHookNoCgroupsConfig(t *testing.T) {
	needSetup(t)
	base, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	noCg := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(noCg, []byte(strings.Replace(string(base), "[runtime]\n", "[runtime]\nno-cgroups = true\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, _ := bundleWith(t, gpuScript, func(s *specs.Spec) {
		s.Hooks.Prestart[0].Env = []string{"GANTRY_CONFIG=" + noCg} //nolint:staticcheck // what Docker adds
	}, "NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
	out, err := runContainer(t, dir, "hook-no-cgroups", cgroupModes()[0])
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	got := lines(out)
	if !strings.Contains(got["nvidia1"], "character special file c3:1") || !strings.Contains(got["open1"], "Operation not permitted") {
		t.Errorf("nvidia1 %q, open1 %q: want the node, and the device cgroup refusing it\n%s", got["nvidia1"], got["open1"], out)
	}
}

// The hook as NVIDIA's hooks.d file (oci-nvidia-hook.json, used by Podman and
// CRI-O without CDI) runs it: under the name nvidia-container-toolkit with
// PHASE prestart. The same binary answers to that name.
func TestHookToolkitName(t *testing.T) {
	needSetup(t)
	alias := filepath.Join(filepath.Dir(hookBin), "nvidia-container-toolkit")
	if err := os.Symlink("gantry", alias); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	dir, _ := bundleWith(t, gpuScript, func(s *specs.Spec) {
		h := &s.Hooks.Prestart[0] //nolint:staticcheck // what hooks.d adds
		h.Path, h.Args[0] = alias, "nvidia-container-toolkit"
	}, "NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
	mode := cgroupModes()[0]
	out, err := runContainer(t, dir, "hook-toolkit-name", mode)
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	got := lines(out)
	if !strings.Contains(got["nvidia1"], "character special file c3:1") || !strings.Contains(got["nvidia0"], "absent") {
		t.Errorf("nvidia1 %q, nvidia0 %q: want GPU 1 only\n%s", got["nvidia1"], got["nvidia0"], out)
	}
}

// An image that sets LD_PRELOAD and LD_LIBRARY_PATH to get its code into
// the hook (CVE-2025-23266's class): the hook never sees the container's env
// as its own and runs nothing from the image, so the library's constructor,
// which would leave a mark on the host, never runs on the host.
func TestHookIgnoresImageLoaderEnv(t *testing.T) {
	needSetup(t)
	mark := filepath.Join(t.TempDir(), "evil-ran")
	src := filepath.Join(t.TempDir(), "evil.c")
	code := "#include <stdio.h>\n__attribute__((constructor)) static void evil(void) { FILE *f = fopen(MARK, \"w\"); if (f) fclose(f); }\n"
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, rootfs := bundle(t, gpuScript, "NVIDIA_VISIBLE_DEVICES=1", "LD_PRELOAD=/evil/evil.so", "LD_LIBRARY_PATH=/evil")
	if err := os.MkdirAll(filepath.Join(rootfs, "evil"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := run("gcc", "-shared", "-fPIC", "-DMARK=\""+mark+"\"", "-o", filepath.Join(rootfs, "evil/evil.so"), src); err != nil {
		t.Fatal(err)
	}
	// The same library loaded on the host does leave the mark: the check
	// below can fail.
	probe := exec.Command("/bin/true")
	probe.Env = []string{"LD_PRELOAD=" + filepath.Join(rootfs, "evil/evil.so")}
	if err := probe.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Fatalf("the library does not leave its mark when preloaded on the host: %v", err)
	}
	os.Remove(mark)

	out, err := runContainer(t, dir, "hook-preload", cgroupModes()[0])
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	if got := lines(out); got["probe"] != fmt.Sprint(fakedriver.CUDAVersionFor(fakedriver.DefaultVersion)) {
		t.Errorf("probe: %q\n%s", got["probe"], out)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Errorf("the image's LD_PRELOAD library ran on the host")
	}
}

// A container that asks for no GPU starts and is left exactly as it was.
func TestHookNoRequestUntouched(t *testing.T) {
	needSetup(t)
	dir, rootfs := bundle(t, gpuScript)
	before := snapshot(t, rootfs)
	out, err := runContainer(t, dir, "hook-none", cgroupModes()[0])
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	got := lines(out)
	if got["done"] != "yes" || got["nodes"] != "" || !strings.Contains(got["probe"], "dlopen failed") {
		t.Errorf("container without a request got GPU edits:\n%s", out)
	}
	after := snapshot(t, rootfs)
	for p, v := range after {
		if before[p] != v {
			t.Errorf("%s changed: %q -> %q", p, before[p], v)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			t.Errorf("%s removed", p)
		}
	}
}

// A spec gantry-runtime already injected into (its annotation) while the
// hook is there too (Docker's --gpus with --runtime=nvidia): the hook leaves
// it alone, so nothing is injected twice. Here the runtime did not really
// run, so the container must get nothing at all from the hook.
func TestHookSkipsInjectedSpec(t *testing.T) {
	needSetup(t)
	dir, rootfs := bundleWith(t, gpuScript, func(s *specs.Spec) {
		s.Annotations = map[string]string{edits.InjectedAnnotation: "1"}
	}, "NVIDIA_VISIBLE_DEVICES=1")
	before := snapshot(t, rootfs)
	out, err := runContainer(t, dir, "hook-injected", cgroupModes()[0])
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	if got := lines(out); got["done"] != "yes" || got["nodes"] != "" {
		t.Errorf("the hook injected into a spec marked %s:\n%s", edits.InjectedAnnotation, out)
	}
	after := snapshot(t, rootfs)
	for p, v := range after {
		if before[p] != v {
			t.Errorf("%s changed: %q -> %q", p, before[p], v)
		}
	}
}

// A device index the host does not have: one clear error, and runc does not
// start the container; nothing is left in the image.
func TestHookUnknownDevice(t *testing.T) {
	needSetup(t)
	dir, rootfs := bundle(t, "echo started", "NVIDIA_VISIBLE_DEVICES=9")
	before := snapshot(t, rootfs)
	out, err := runContainer(t, dir, "hook-unknown", cgroupModes()[0])
	if err == nil || strings.Contains(out, "started") {
		t.Fatalf("runc run succeeded; want the hook to refuse device 9\n%s", out)
	}
	t.Logf("runc output:\n%s", out)
	if !strings.Contains(out, "gantry-hook: ") || !strings.Contains(out, "unknown GPU device") || !strings.Contains(out, "9") {
		t.Errorf("runc's output does not carry the hook's error:\n%s", out)
	}
	after := snapshot(t, rootfs)
	if len(after) != len(before) {
		t.Errorf("the image changed although the hook failed: %d files before, %d after", len(before), len(after))
	}
}

// The front end's own behaviour, run as a program: phases other than
// prestart do nothing, errors are one line and exit 1, --help teaches.
func TestHookCommandLine(t *testing.T) {
	needSetup(t)
	for _, tc := range []struct {
		args  []string
		stdin string
		code  int
		want  string
	}{
		{[]string{"--help"}, "", 0, "docker run --gpus"},
		{[]string{"--version"}, "", 0, "gantry-hook "},
		{[]string{"poststop"}, "garbage", 0, ""},
		{[]string{"poststart"}, "", 0, ""},
		{nil, "", 2, "no PHASE given"},
		{[]string{"prestart"}, "", 1, "no container state on stdin"},
		{[]string{"prestart"}, `{"ociVersion":"1.0.2","id":"x","status":"creating","pid":1,"bundle":"/nonexistent"}`, 1, "/nonexistent"},
		{[]string{"--bogus", "prestart"}, "", 2, "bogus"},
	} {
		cmd := exec.Command(hookBin, tc.args...)
		cmd.Stdin = strings.NewReader(tc.stdin)
		cmd.Env = []string{"GANTRY_CONFIG=" + cfgFile}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		msg := stderr.String()
		if code != tc.code || !strings.Contains(msg, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, msg, tc.code, tc.want)
		}
		if code == 1 && strings.Count(msg, "\n") != 1 {
			t.Errorf("%v: error is not one line: %q", tc.args, msg)
		}
	}
}

// Docker's --gpus path with runtime.driver-layout = "tree": the hook binds
// the driver tree into the created container's mount namespace as one
// mount, links each file's usual path into it, and the container finds
// libcuda through its ld.so.cache and nvidia-smi on PATH, under real runc.
func TestHookDriverTreeLayout(t *testing.T) {
	needSetup(t)
	base, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	treeCfg := filepath.Join(t.TempDir(), "tree.toml")
	cfg := strings.Replace(string(base), "[runtime]\n", "[runtime]\ndriver-layout = \"tree\"\n", 1) // the default, said
	if err := os.WriteFile(treeCfg, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	script := gpuScript + `echo "tree: $(grep -c ' /usr/local/nvidia ' /proc/self/mountinfo)"` + "\n" +
		`echo "link: $(readlink /usr/bin/nvidia-smi)"` + "\n" +
		`echo "gl: $(ls -R /usr/local/nvidia | grep -c -e EGL_nvidia -e GLX_nvidia)"` + "\n"
	dir, _ := bundleWith(t, script, func(s *specs.Spec) {
		s.Hooks.Prestart[0].Env = []string{"GANTRY_CONFIG=" + treeCfg} //nolint:staticcheck // what Docker adds
	}, "NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
	out, err := runContainer(t, dir, "hook-tree", cgroupModes()[0])
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	got := lines(out)
	if !strings.Contains(got["nvidia1"], "character special file") || !strings.Contains(got["nvidia0"], "absent") {
		t.Errorf("nvidia1 %q, nvidia0 %q: want GPU 1 only\n%s", got["nvidia1"], got["nvidia0"], out)
	}
	if got["probe"] != fmt.Sprint(fakedriver.CUDAVersionFor(fakedriver.DefaultVersion)) || !strings.Contains(got["smi"], "GPU 1") {
		t.Errorf("probe %q, smi %q: want libcuda loaded and nvidia-smi listing GPU 1\n%s", got["probe"], got["smi"], out)
	}
	if got["tree"] != "1" || got["link"] != "/usr/local/nvidia/bin/nvidia-smi" {
		t.Errorf("tree mounts %q, nvidia-smi link %q: want one mount at /usr/local/nvidia and the link into it\n%s", got["tree"], got["link"], out)
	}
	if got["gl"] != "0" {
		t.Errorf("a compute,utility container sees %q graphics library names under /usr/local/nvidia, want 0\n%s", got["gl"], out)
	}
}
