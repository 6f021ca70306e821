//go:build linux

package engines

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// podmanEngine is a rootful podman whose every path is private: storage
// (graph root, run root), its temporary and lock files, events, network
// configuration and default hooks directory are all under dir, and
// containers.conf, storage.conf and registries.conf are the test's own
// files. Nothing of the host's containers/storage is read or written, and
// no registry is contacted: the image comes from the fixture's OCI archive.
type podmanEngine struct {
	f            *fixture
	dir          string
	env          []string // CONTAINERS_CONF, CONTAINERS_STORAGE_CONF, ..., PATH, GANTRY_CONFIG
	global       []string // podman's global flags: --root, --runroot, --storage-driver, ...
	image        string   // the loaded test image's ID
	cgroupParent string   // cgroupfs parent of the test's containers and their conmons
	specDir      string   // what /etc/cdi and /var/run/cdi are in withCDI's namespace
	etcSpecDir   string   // if set, what /etc/cdi is there (through an overlay of /etc where the host has none)
}

// podmanContainersConf is the private containers.conf: runc (Podman
// prefers crun when it is installed; the tests name runc's state root with
// --runtime-flag, and crun 1.8 refuses hybrid cgroup hosts), cgroupfs (no
// systemd), file locks and events under the test's directory, no default
// hooks (the host's hooks.d would otherwise apply), the open-files and
// process limits this process has, nproc at most 32768 (podman's defaults,
// 1048576 files, need CAP_SYS_RESOURCE where the hard limit is lower, and
// a root without it exists: a container host's), the network
// configuration directory private, and the environment conmon (and through
// it the OCI runtime) gets, with GANTRY_CONFIG.
const podmanContainersConf = `[containers]
log_driver = "k8s-file"
default_ulimits = [%q, %q]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = %q
tmp_dir = %q
lock_type = "file"
hooks_dir = [%q]
conmon_env_vars = [%s]

[network]
network_config_dir = %q
`

const podmanStorageConf = `[storage]
driver = %q
graphroot = %q
runroot = %q
`

// podmanSkip returns why podman cannot run here, or "".
func podmanSkip() string {
	for _, tool := range []string{"podman", "conmon"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not installed (apt-get install podman; scripts/deps.sh --test does)"
		}
	}
	return ""
}

// startPodman sets up the private podman, loads the test image into it
// with podman load, and checks that its storage is the private one.
func startPodman(t *testing.T) *podmanEngine {
	f := need(t)
	if why := podmanSkip(); why != "" {
		t.Skip(why)
	}
	e := &podmanEngine{f: f, dir: t.TempDir(), cgroupParent: fmt.Sprintf("/gantry-podman-test-%d", os.Getpid())}
	// Registered first, so they run last: the storage driver's mounts
	// (overlay keeps its directory a private mount), anything left running,
	// and the (empty) cgroups podman made for conmon.
	t.Cleanup(func() {
		killUnder(e.dir)
		if left := unmountUnder(e.dir); len(left) > 0 {
			t.Errorf("podman: could not unmount %v", left)
		}
		// The containers' own cgroups too: podman runs the runtime's
		// delete without the --runtime-flag root and, for --runtime
		// gantry-runtime, without PATH or GANTRY_CONFIG, so runc does not
		// always get to remove them. Only empty cgroups can be removed.
		children, _ := filepath.Glob("/sys/fs/cgroup/*" + e.cgroupParent + "/*")
		more, _ := filepath.Glob("/sys/fs/cgroup" + e.cgroupParent + "/*")
		for _, c := range append(children, more...) {
			if st, err := os.Lstat(c); err == nil && st.IsDir() {
				_ = os.Remove(c)
			}
		}
		removeCgroupDirs(e.cgroupParent)
	})
	podmanHostCleanup(t)
	for _, d := range []string{"tmp", "net", "nohooks", "cdi"} {
		if err := os.Mkdir(filepath.Join(e.dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	e.specDir = filepath.Join(e.dir, "cdi")
	storage := "vfs"
	if f.overlay {
		storage = "overlay"
	}
	base := f.daemonEnv()
	var conmonEnv []string
	for _, kv := range base {
		if strings.HasPrefix(kv, "PATH=") || strings.HasPrefix(kv, "GANTRY_CONFIG=") {
			conmonEnv = append(conmonEnv, fmt.Sprintf("%q", kv))
		}
	}
	var ulimits []any
	for name, res := range map[string]int{"nofile": syscall.RLIMIT_NOFILE, "nproc": unix.RLIMIT_NPROC} {
		var lim syscall.Rlimit
		if err := syscall.Getrlimit(res, &lim); err != nil {
			t.Fatal(err)
		}
		// podman's own processes run with nproc at most 32768 (its
		// default), so conmon's runc could not raise a container's to more.
		if name == "nproc" {
			lim.Cur, lim.Max = min(lim.Cur, 32768), min(lim.Max, 32768)
		}
		ulimits = append(ulimits, fmt.Sprintf("%s=%d:%d", name, int64(lim.Cur), int64(lim.Max)))
	}
	conf := filepath.Join(e.dir, "containers.conf")
	storageConf := filepath.Join(e.dir, "storage.conf")
	registriesConf := filepath.Join(e.dir, "registries.conf")
	for name, content := range map[string]string{
		conf: fmt.Sprintf(podmanContainersConf, append(ulimits, filepath.Join(e.dir, "events.log"), filepath.Join(e.dir, "tmp"),
			filepath.Join(e.dir, "nohooks"), strings.Join(conmonEnv, ", "), filepath.Join(e.dir, "net"))...),
		storageConf:    fmt.Sprintf(podmanStorageConf, storage, filepath.Join(e.dir, "root"), filepath.Join(e.dir, "runroot")),
		registriesConf: "unqualified-search-registries = []\n",
	} {
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.env = slices.Concat(base, []string{
		"CONTAINERS_CONF=" + conf,
		"CONTAINERS_STORAGE_CONF=" + storageConf,
		"CONTAINERS_REGISTRIES_CONF=" + registriesConf,
		"HOME=" + e.dir, // podman's per-user files (auth, ~/.config/containers) are looked up there
	})
	e.global = []string{
		"--root", filepath.Join(e.dir, "root"),
		"--runroot", filepath.Join(e.dir, "runroot"),
		"--storage-driver", storage,
		"--tmpdir", filepath.Join(e.dir, "tmp"),
		"--cgroup-manager", "cgroupfs",
		"--events-backend", "file",
		"--network-config-dir", filepath.Join(e.dir, "net"),
		// runc's (and through gantry-runtime its) container state, which
		// would otherwise go to /run/runc
		"--runtime-flag", "root=" + filepath.Join(e.dir, "runc"),
	}
	if out, err := e.podman("version", "--format", "{{.Client.Version}}"); err != nil {
		t.Skipf("podman cannot run here: %v\n%s", err, out)
	} else {
		t.Logf("podman %s, storage driver %s", strings.TrimSpace(out), storage)
	}
	out, err := e.podman("info", "--format", "{{.Store.GraphRoot}} {{.Store.RunRoot}}")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if want := filepath.Join(e.dir, "root") + " " + filepath.Join(e.dir, "runroot"); strings.TrimSpace(out) != want {
		t.Fatalf("podman's storage is %q, want the private %q: the test would touch the host's", strings.TrimSpace(out), want)
	}
	if out, err := e.podman("load", "-i", f.ociArchive); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	ids, err := e.podman("images", "--quiet", "--no-trunc")
	if err != nil {
		t.Fatalf("%v\n%s", err, ids)
	}
	if fields := strings.Fields(ids); len(fields) != 1 {
		t.Fatalf("podman images after loading %s: %q, want one image", f.ociArchive, ids)
	} else {
		e.image = fields[0]
	}
	return e
}

// podmanHostPaths are what podman 4.3 creates on the host whatever its
// configuration says: /run/netns (even for --network none) and the image
// library's blob-info cache, which it keeps in /var/lib/containers/cache
// for root rather than under the storage's graph root.
var podmanHostPaths = []string{"/var/lib/containers/cache/blob-info-cache-v1.boltdb", "/var/lib/containers/cache", "/var/lib/containers", "/run/netns"}

// podmanHostCleanup removes, when the test ends, those of podmanHostPaths
// that did not exist before it (directories only if empty; /run/netns
// unmounted first).
func podmanHostCleanup(t *testing.T) {
	var absent []string
	for _, p := range podmanHostPaths {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			absent = append(absent, p)
		}
	}
	t.Cleanup(func() {
		for _, p := range absent {
			if entries, err := os.ReadDir(p); p == "/run/netns" && err == nil && len(entries) == 0 {
				// podman makes it a shared mount of itself, as ip netns does
				_ = syscall.Unmount(p, syscall.MNT_DETACH)
			}
			_ = os.Remove(p)
		}
	})
}

// podman runs podman with the private configuration and global flags.
func (e *podmanEngine) podman(args ...string) (string, error) {
	return command(e.env, slices.Concat([]string{"podman"}, e.global, args)...)
}

// runArgs are podman run's arguments for gpuScript in a throwaway
// container with opts; global are extra global flags (--hooks-dir,
// --runtime).
func (e *podmanEngine) runArgs(global, opts []string) []string {
	args := slices.Concat([]string{"podman"}, e.global, global,
		[]string{"run", "--rm", "--network", "none", "--cgroup-parent", e.cgroupParent})
	if apparmorUnusable() {
		args = append(args, "--security-opt", "apparmor=unconfined")
	}
	return slices.Concat(args, opts, []string{e.image, "sh", "-c", gpuScript})
}

// run runs gpuScript with podman run.
func (e *podmanEngine) run(global []string, opts ...string) (string, error) {
	return command(e.env, e.runArgs(global, opts)...)
}

// withCDI runs argv in a private mount namespace whose /run is an empty
// tmpfs holding cdi/, the test's spec directory (so /var/run/cdi is that
// directory), and whose /etc/cdi, if the host has one, is hidden under an
// empty directory: podman 4.3 reads CDI specs only from /etc/cdi and
// /var/run/cdi (containers.conf's cdi_spec_dirs came in 4.4), and the host's
// must be neither read nor written.
func (e *podmanEngine) withCDI(argv ...string) (string, error) {
	cmd, err := e.cdiCmd(argv...)
	if err != nil {
		return "", err
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s (in a private mount namespace): %w", strings.Join(argv, " "), err)
	}
	return string(out), nil
}

// cdiCmd is withCDI's command, not started.
func (e *podmanEngine) cdiCmd(argv ...string) (*exec.Cmd, error) {
	script := `set -e
mount -t tmpfs -o mode=0755 gantry-test-run /run
mkdir /run/cdi
mount --bind "$SPEC_DIR" /run/cdi
if [ -n "$ETC_SPEC_DIR" ]; then
  if [ ! -d /etc/cdi ]; then
    mount -t overlay -o "lowerdir=/etc,upperdir=$ETC_OVERLAY/up,workdir=$ETC_OVERLAY/work" gantry-test-etc /etc
    mkdir /etc/cdi
  fi
  mount --bind "$ETC_SPEC_DIR" /etc/cdi
elif [ -d /etc/cdi ]; then mount -t tmpfs -o mode=0755 gantry-test-etc-cdi /etc/cdi; fi
exec "$@"`
	cmd := exec.Command("sh", slices.Concat([]string{"-c", script, "sh"}, argv)...)
	cmd.Env = append(slices.Clone(e.env), "SPEC_DIR="+e.specDir)
	if e.etcSpecDir != "" {
		overlay, err := os.MkdirTemp(e.dir, "etc-overlay-")
		if err != nil {
			return nil, err
		}
		for _, d := range []string{"up", "work"} {
			if err := os.Mkdir(filepath.Join(overlay, d), 0o755); err != nil {
				return nil, err
			}
		}
		cmd.Env = append(cmd.Env, "ETC_SPEC_DIR="+e.etcSpecDir, "ETC_OVERLAY="+overlay)
	}
	// A new mount namespace, its mounts private (Go makes / MS_PRIVATE|MS_REC
	// in the child before sh runs): nothing mounted here reaches the host.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	return cmd, nil
}

// TestPodman drives a real rootful podman three ways: the devices of the
// CDI spec `gantry cdi generate` writes (podman's --device
// nvidia.com/gpu=N), Gantry as the OCI hook of a hooks.d file under the
// name NVIDIA's oci-nvidia-hook.json uses, and gantry-runtime as podman's
// --runtime over the runc podman would use.
func TestPodman(t *testing.T) {
	e := startPodman(t)
	f := e.f

	t.Run("CDI", func(t *testing.T) {
		// The guide's line, run where /var/run/cdi is the test's directory.
		spec := "/var/run/cdi/nvidia.yaml"
		if out, err := e.withCDI(f.gantry, "cdi", "generate", "--output", spec); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if _, err := os.Stat(filepath.Join(e.specDir, "nvidia.yaml")); err != nil {
			t.Fatalf("gantry cdi generate --output %s did not write the spec into the namespace's /var/run/cdi: %v", spec, err)
		}
		out, err := e.withCDI(e.runArgs(nil, []string{"--device", "nvidia.com/gpu=1"})...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		report(t, f, "podman run --device nvidia.com/gpu=1", checkOnlyGPU1(f, out), out)
		// The spec's common edits set NVIDIA_VISIBLE_DEVICES=void, so that
		// a hook or runtime of the older kind does not inject again.
		if env := sections(out)["env"]; strings.Join(env, " ") != "NVIDIA_VISIBLE_DEVICES=void" {
			t.Errorf("the CDI container's NVIDIA_ env: %q, want NVIDIA_VISIBLE_DEVICES=void alone", env)
		}

		out, err = e.withCDI(e.runArgs(nil, []string{"--device", "nvidia.com/gpu=all"})...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		sec := sections(out)
		gpus, all := nvidiaNodes(sec["dev"])
		if len(gpus) != 8 || !contains(all, "nvidiactl") {
			t.Errorf("podman run --device nvidia.com/gpu=all: GPU nodes %v (all nvidia nodes %v), want nvidia0 to nvidia7 and nvidiactl\n%s", gpus, all, out)
		}
		if len(sec["probe"]) < 2 || !strings.HasPrefix(sec["probe"][0], "cuda ") || !strings.HasPrefix(sec["probe"][1], "nvml ") {
			t.Errorf("podman run --device nvidia.com/gpu=all: the probe did not load the driver: %q", sec["probe"])
		}
		var listed int
		for _, line := range sec["smi"] {
			if strings.HasPrefix(line, "GPU ") {
				listed++
			}
		}
		if listed != 8 {
			t.Errorf("podman run --device nvidia.com/gpu=all: nvidia-smi -L lists %d GPUs, want 8: %q", listed, sec["smi"])
		}

		// A device the spec does not have: podman refuses it, naming it.
		out, err = e.withCDI(e.runArgs(nil, []string{"--device", "nvidia.com/gpu=9"})...)
		if err == nil || strings.Contains(out, "== dev") {
			t.Fatalf("podman run --device nvidia.com/gpu=9 (of 8) ran the container:\n%s", out)
		}
		if !strings.Contains(out, "nvidia.com/gpu=9") {
			t.Errorf("podman's error does not name nvidia.com/gpu=9:\n%s", out)
		}
	})

	t.Run("CDIImageEnv", func(t *testing.T) { podmanCDIImageEnv(t, e) })

	t.Run("HooksDir", func(t *testing.T) {
		// The hook file as NVIDIA's oci-nvidia-hook.json names it, with the
		// executable nvidia-container-toolkit being Gantry; runc runs
		// hooks with the hook's env alone, so GANTRY_CONFIG goes there.
		hooksDir := filepath.Join(t.TempDir(), "hooks.d")
		bin := filepath.Join(t.TempDir(), "bin")
		for _, d := range []string{hooksDir, bin} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		toolkit := filepath.Join(bin, "nvidia-container-toolkit")
		if err := os.Symlink(f.runtime, toolkit); err != nil {
			t.Fatal(err)
		}
		hook := map[string]any{
			"version": "1.0.0",
			"hook": map[string]any{
				"path": toolkit,
				"args": []string{"nvidia-container-toolkit", "prestart"},
				"env":  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GANTRY_CONFIG=" + f.config},
			},
			"when":   map[string]any{"always": true, "commands": []string{".*"}},
			"stages": []string{"prestart"},
		}
		b, _ := json.MarshalIndent(hook, "", "  ")
		if err := os.WriteFile(filepath.Join(hooksDir, "oci-nvidia-hook.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		global := []string{"--hooks-dir", hooksDir}
		out, err := e.run(global, "-e", "NVIDIA_VISIBLE_DEVICES=1")
		if err != nil {
			t.Fatalf("%v\n%s\n%s", err, out, f.runtimeLogTail())
		}
		report(t, f, "podman --hooks-dir DIR run -e NVIDIA_VISIBLE_DEVICES=1", checkOnlyGPU1(f, out), out)

		out, err = e.run(global)
		if err != nil {
			t.Fatalf("%v\n%s\n%s", err, out, f.runtimeLogTail())
		}
		report(t, f, "podman --hooks-dir DIR run (no GPU asked for)", checkNoGPU(out), out)

		out, err = e.run(global, "-e", "NVIDIA_VISIBLE_DEVICES=9")
		if err == nil || strings.Contains(out, "== dev") {
			t.Fatalf("podman --hooks-dir DIR run -e NVIDIA_VISIBLE_DEVICES=9 (of 8) ran the container:\n%s", out)
		}
		if !strings.Contains(out, "9") || !strings.Contains(strings.ToLower(out), "gpu") {
			t.Errorf("the error does not name the missing GPU 9:\n%s", out)
		}
		t.Logf("podman reports: %s", strings.TrimSpace(out))
	})

	t.Run("Runtime", func(t *testing.T) {
		// gantry-runtime over the runc podman itself would run.
		lowLevel, err := e.podman("info", "--format", "{{.Host.OCIRuntime.Path}}")
		lowLevel = strings.TrimSpace(lowLevel)
		if err != nil || !filepath.IsAbs(lowLevel) {
			t.Fatalf("podman info: its OCI runtime: %q %v", lowLevel, err)
		}
		base, err := os.ReadFile(f.config)
		if err != nil {
			t.Fatal(err)
		}
		cfg := strings.Replace(string(base), "[runtime]\n", fmt.Sprintf("[runtime]\n  low-level = %q\n", lowLevel), 1)
		if cfg == string(base) {
			t.Fatalf("the fixture's configuration has no [runtime] table:\n%s", base)
		}
		config := filepath.Join(t.TempDir(), "gantry.toml")
		if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		// podman, conmon (through conmon_env_vars) and so the runtime read
		// GANTRY_CONFIG from the environment.
		saved := e.env
		t.Cleanup(func() { e.env = saved })
		e.env = append(slices.Clone(saved), "GANTRY_CONFIG="+config)
		conf := filepath.Join(e.dir, "containers.conf")
		old, err := os.ReadFile(conf)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.WriteFile(conf, old, 0o644) })
		if err := os.WriteFile(conf, []byte(strings.ReplaceAll(string(old), "GANTRY_CONFIG="+f.config, "GANTRY_CONFIG="+config)), 0o644); err != nil {
			t.Fatal(err)
		}
		global := []string{"--runtime", f.runtime}
		if out, err := command(e.env, slices.Concat([]string{"podman"}, e.global, global, []string{"info", "--format", "{{.Host.OCIRuntime.Path}}"})...); err != nil || strings.TrimSpace(out) != f.runtime {
			t.Fatalf("podman --runtime %s info: OCI runtime %q (%v)", f.runtime, strings.TrimSpace(out), err)
		}
		t.Logf("gantry-runtime over %s", lowLevel)

		out, err := e.run(global, "-e", "NVIDIA_VISIBLE_DEVICES=1")
		if err != nil {
			t.Fatalf("%v\n%s\n%s", err, out, f.runtimeLogTail())
		}
		report(t, f, "podman --runtime gantry-runtime run -e NVIDIA_VISIBLE_DEVICES=1", checkOnlyGPU1(f, out), out)

		out, err = e.run(global)
		if err != nil {
			t.Fatalf("%v\n%s\n%s", err, out, f.runtimeLogTail())
		}
		report(t, f, "podman --runtime gantry-runtime run (no GPU asked for)", checkNoGPU(out), out)

		out, err = e.run(global, "-e", "NVIDIA_VISIBLE_DEVICES=9")
		if err == nil || strings.Contains(out, "== dev") {
			t.Fatalf("podman --runtime gantry-runtime run -e NVIDIA_VISIBLE_DEVICES=9 (of 8) ran the container:\n%s", out)
		}
		if !strings.Contains(out, "9") || !strings.Contains(strings.ToLower(out), "gpu") {
			t.Errorf("the error does not name the missing GPU 9:\n%s", out)
		}
		t.Logf("podman reports: %s", strings.TrimSpace(out))
		if ps, err := e.podman("ps", "-aq"); err != nil || strings.TrimSpace(ps) != "" {
			t.Errorf("containers left after the failed run: %q %v", ps, err)
		}
	})
}

// escapeScript is what the image-environment containers run: whether the
// image's evil.so left its mark in the root, the SONAME link and the cache
// entry the CDI hooks make, and the probe, run without the image's loader
// variables (busybox is static, so they do not touch sh itself).
const escapeScript = `exec 2>&1
echo '== mark'; test -e /evil-rootfs-mark && echo rootfs-mark
echo '== link'; readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1
echo '== cache'; grep -c libcuda.so.1 /etc/ld.so.cache
echo '== probe'; env -u LD_PRELOAD -u LD_LIBRARY_PATH -u GCONV_PATH probe
echo '== end'`

// podmanCDIImageEnv is the CDI hook escape (CVE-2025-23266 class) through
// podman --device: the image's environment names its own evil.so in
// LD_PRELOAD (by /proc/self/cwd, the image's root for a createContainer
// hook), LD_LIBRARY_PATH and GCONV_PATH into the image, and GANTRY_CONFIG at
// the image's configuration or /dev/zero. The spec's hooks, run by runc as
// root before pivot_root, must do their work and load nothing of it, both
// the static gantry-cdi-hook the spec names by default and the dynamically
// linked `gantry hook` of older specs (whose explicit env alone keeps the
// loader away). The host directory evil.so would write to stays unchanged.
func podmanCDIImageEnv(t *testing.T, e *podmanEngine) {
	f := e.f
	hostDir := filepath.Dir(f.evilMark)
	before := snapshotDir(t, hostDir)
	oldSpec := filepath.Join(t.TempDir(), "gantry.toml")
	base, err := os.ReadFile(f.config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(oldSpec, append(base, fmt.Sprintf("\n[cdi]\n  hook-path = %q\n", f.gantry)...), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, form := range []struct{ name, config, hook string }{
		{"gantry-cdi-hook", f.config, filepath.Join(f.binDir, "gantry-cdi-hook")},
		{"gantry hook", oldSpec, f.gantry},
	} {
		t.Run(form.name, func(t *testing.T) {
			spec := "/var/run/cdi/nvidia.yaml"
			if out, err := e.withCDI(f.gantry, "--config", form.config, "cdi", "generate", "--output", spec); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			b, err := os.ReadFile(filepath.Join(e.specDir, "nvidia.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), "path: "+form.hook) || !strings.Contains(string(b), "env:\n    - PATH=") {
				t.Fatalf("the spec's hooks do not run %s with an env:\n%s", form.hook, b)
			}
			for _, config := range []string{"/proc/self/cwd/etc/gantry-evil.toml", "/dev/zero"} {
				args := slices.Concat([]string{"podman"}, e.global,
					[]string{"run", "--rm", "--network", "none", "--cgroup-parent", e.cgroupParent, "--device", "nvidia.com/gpu=1",
						"-e", "LD_PRELOAD=/proc/self/cwd/evil.so",
						"-e", "LD_LIBRARY_PATH=/proc/self/cwd/evil-libs:/proc/self/cwd",
						"-e", "GCONV_PATH=/proc/self/cwd/evil-gconv",
						"-e", "GANTRY_CONFIG=" + config})
				if apparmorUnusable() {
					args = append(args, "--security-opt", "apparmor=unconfined")
				}
				out, err := e.withCDI(append(args, e.image, "sh", "-c", escapeScript)...)
				if _, markErr := os.Stat(f.evilMark); markErr == nil {
					os.Remove(f.evilMark)
					t.Fatalf("GANTRY_CONFIG=%s: the image's LD_PRELOAD library ran on the host (a CDI hook loaded it)\n%s", config, out)
				}
				if err != nil {
					t.Fatalf("GANTRY_CONFIG=%s: %v\n%s", config, err, out)
				}
				sec := sections(out)
				if len(sec["mark"]) > 0 {
					t.Errorf("GANTRY_CONFIG=%s: evil.so left its mark in the container's root: a hook loaded it\n%s", config, out)
				}
				if _, ok := sec["end"]; !ok || len(sec["link"]) != 1 || !strings.HasPrefix(sec["link"][0], "libcuda.so.") ||
					len(sec["cache"]) != 1 || sec["cache"][0] == "0" || len(sec["probe"]) < 2 || !strings.HasPrefix(sec["probe"][0], "cuda ") {
					t.Errorf("GANTRY_CONFIG=%s: the hooks' work is missing (want the libcuda.so.1 link, a cache entry, the probe loading libcuda):\n%s", config, out)
				}
			}
		})
	}
	if after := snapshotDir(t, hostDir); !maps.Equal(before, after) {
		t.Errorf("%s changed on the host:\nbefore %v\nafter  %v", hostDir, before, after)
	}
}

// snapshotDir maps each file under dir to its content or link target.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			m[p] = "-> " + l
		case d.Type().IsRegular():
			b, _ := os.ReadFile(p)
			m[p] = string(b)
		default:
			m[p] = d.Type().String()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}
