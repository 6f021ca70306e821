package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

var (
	ctkOnce sync.Once
	ctkBin  string
	ctkErr  error
)

// nvidiaCTK builds cmd/gantry once and returns a symlink to it named
// nvidia-ctk, as make install NVIDIA_NAMES=1 makes it.
func nvidiaCTK(t *testing.T) string {
	t.Helper()
	ctkOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gantry-nvctk-")
		if err != nil {
			ctkErr = err
			return
		}
		bin := filepath.Join(dir, "gantry")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/gantry-gpu/gantry/cmd/gantry").CombinedOutput(); err != nil {
			ctkErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		ctkBin = filepath.Join(dir, "nvidia-ctk")
		ctkErr = os.Symlink("gantry", ctkBin)
	})
	if ctkErr != nil {
		t.Fatal(ctkErr)
	}
	return ctkBin
}

// runCTK runs the built binary as nvidia-ctk with the package's GANTRY_CONFIG.
func runCTK(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(nvidiaCTK(t), args...)
	cmd.Env = append(os.Environ(), "GANTRY_CONFIG="+testConfig)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func ctk(args ...string) (string, string, int) {
	var o, e bytes.Buffer
	code := NVIDIACTKMain(args, &o, &e)
	return o.String(), e.String(), code
}

// NVIDIA's install-guide lines against real engine files, through the
// binary run as nvidia-ctk: --config names the engine's file (a daemon.json
// is not mistaken for Gantry's TOML configuration), everything already in
// the file is kept, and exactly NVIDIA's runtime name is registered.
func TestNVCTKRuntimeConfigure(t *testing.T) {
	dir := t.TempDir()
	daemon := filepath.Join(dir, "daemon.json")
	writeFileT(t, daemon, `{"log-driver": "json-file", "runtimes": {"kata": {"path": "/usr/bin/kata-runtime"}}}`)
	_, errOut, code := runCTK(t, "runtime", "configure", "--runtime=docker", "--config="+daemon, "--set-as-default")
	if code != 0 {
		t.Fatalf("docker: exit %d: %s", code, errOut)
	}
	var d struct {
		LogDriver      string `json:"log-driver"`
		DefaultRuntime string `json:"default-runtime"`
		Runtimes       map[string]struct{ Path string }
	}
	b, _ := os.ReadFile(daemon)
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("daemon.json: %v\n%s", err, b)
	}
	if d.LogDriver != "json-file" || d.DefaultRuntime != "nvidia" || d.Runtimes["nvidia"].Path != "nvidia-container-runtime" || d.Runtimes["kata"].Path == "" || len(d.Runtimes) != 2 {
		t.Errorf("daemon.json after configure: %s", b)
	}
	// NVIDIA's form under NVIDIA's name: a name on dockerd's PATH and an
	// empty args list, exactly as nvidia-ctk writes it.
	if !strings.Contains(string(b), "\"nvidia\": {\n            \"path\": \"nvidia-container-runtime\",\n            \"args\": []\n        }") {
		t.Errorf("daemon.json: nvidia is not in NVIDIA's form:\n%s", b)
	}
	if _, err := os.Stat(daemon + ".gantry-backup"); err != nil {
		t.Errorf("no backup of daemon.json: %v", err)
	}

	ctd := filepath.Join(dir, "config.toml")
	writeFileT(t, ctd, `version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
`)
	before, _ := os.ReadFile(ctd)
	out, errOut, code := runCTK(t, "runtime", "configure", "--runtime=containerd", "--config", ctd, "--dry-run", "--nvidia-runtime-name=gpu")
	if after, _ := os.ReadFile(ctd); code != 0 || !bytes.Equal(before, after) || !strings.Contains(out, "runtimes.gpu") {
		t.Fatalf("containerd --dry-run: exit %d, file changed %v, out %s %s", code, !bytes.Equal(before, after), out, errOut)
	}
	if _, errOut, code = runCTK(t, "runtime", "configure", "--runtime=containerd", "--config", ctd, "--nvidia-runtime-name=gpu", "--drop-in-config="); code != 0 {
		t.Fatalf("containerd: exit %d: %s", code, errOut)
	}
	if b, _ := os.ReadFile(ctd); !strings.Contains(string(b), `runtimes.gpu]`) || !strings.Contains(string(b), "SystemdCgroup = true") || strings.Contains(string(b), "runtimes.nvidia]") {
		t.Errorf("containerd config.toml:\n%s", b)
	}

	// NVIDIA's default for containerd: the runtime in a drop-in that
	// config.toml imports; config.toml keeps its own runtimes.
	ctd2 := filepath.Join(dir, "ctd2", "config.toml")
	ctdDropIn := filepath.Join(dir, "ctd2", "conf.d", "99-nvidia.toml")
	// Version 2, which the containerd on PATH (1.6 on Debian 12, when
	// installed) reads back; version 3 is the engine tests' (containerd 2.x).
	writeFileT(t, ctd2, "version = 2\n")
	for i := 0; i < 2; i++ {
		out, errOut, code := runCTK(t, "runtime", "configure", "--runtime=containerd", "--config="+ctd2, "--drop-in-config="+ctdDropIn, "--cdi.enabled")
		if code != 0 {
			t.Fatalf("containerd drop-in: exit %d: %s", code, errOut)
		}
		if i == 1 && !strings.Contains(out, "nothing to change") {
			t.Errorf("second run changed something: %s %s", out, errOut)
		}
	}
	if b, _ := os.ReadFile(ctd2); string(b) != "version = 2\nimports = [\""+filepath.Join(dir, "ctd2", "conf.d")+"/*.toml\"]\n" {
		t.Errorf("containerd config.toml with a drop-in:\n%s", b)
	}
	if b, _ := os.ReadFile(ctdDropIn); !strings.Contains(string(b), `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]`) || !strings.Contains(string(b), `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]`) || !strings.Contains(string(b), "enable_cdi = true") || strings.Contains(string(b), "runtimes.gantry") {
		t.Errorf("containerd drop-in:\n%s", b)
	}

	dropIn := filepath.Join(dir, "crio.conf.d", "99-nvidia.toml")
	if _, errOut, code = runCTK(t, "runtime", "configure", "--runtime=crio", "--drop-in-config="+dropIn, "--config-source=command,file"); code != 0 {
		t.Fatalf("crio: exit %d: %s", code, errOut)
	}
	if b, _ := os.ReadFile(dropIn); !strings.Contains(string(b), "[crio.runtime.runtimes.nvidia]") {
		t.Errorf("crio drop-in:\n%s", b)
	}

	// Flags Gantry cannot honour: one line naming the flag and the way
	// out, exit 2, the file untouched.
	before, _ = os.ReadFile(daemon)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cdi.enabled=yes"}, "want true or false"},
		{[]string{"--config-mode=oci-hook"}, "--config-mode=config"},
		{[]string{"--config-source=dump"}, "config source \"dump\""},
		{[]string{"--drop-in-config=/etc/docker/x.json"}, "docker has no drop-in files"},
		{[]string{"--no-such-flag"}, "unknown flag --no-such-flag"},
		{[]string{"stray"}, `unexpected argument "stray"`},
		{[]string{"--runtime=podman"}, "podman"},
	} {
		args := append([]string{"runtime", "configure", "--config=" + daemon}, tc.args...)
		out, errOut, code := runCTK(t, args...)
		if code == 0 || out != "" || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want one line with %q", tc.args, code, out, errOut, tc.want)
		}
	}
	if after, _ := os.ReadFile(daemon); !bytes.Equal(before, after) {
		t.Errorf("a refused command changed daemon.json")
	}
	// --cdi.enabled turns Docker's CDI feature on.
	if _, errOut, code := runCTK(t, "runtime", "configure", "--runtime=docker", "--config="+daemon, "--cdi.enabled"); code != 0 {
		t.Fatalf("--cdi.enabled: exit %d: %s", code, errOut)
	}
	var withCDI struct{ Features map[string]bool }
	if b, _ := os.ReadFile(daemon); json.Unmarshal(b, &withCDI) != nil || !withCDI.Features["cdi"] {
		t.Errorf("daemon.json after --cdi.enabled: %s", b)
	}
	// --help teaches: examples and what each flag maps to.
	out, _, code = runCTK(t, "runtime", "configure", "--help")
	if code != 0 || !strings.Contains(out, "--runtime=docker") || !strings.Contains(out, "not supported:") {
		t.Errorf("runtime configure --help: exit %d\n%s", code, out)
	}
}

// migDevRoot is a copy of the fake driver root's dev/ with the GPU and
// compute instance capability nodes of the simulated profile's MIG devices
// added (the fake driver makes config and monitor only).
func migDevRoot(t *testing.T, root, profile string) string {
	t.Helper()
	sys, err := sim.Load(profile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-a", filepath.Join(root, "dev"), dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	for _, d := range sys.Devices {
		for _, m := range d.MIGDevices {
			for _, minor := range []int{m.GICapMinor, m.CICapMinor} {
				p := filepath.Join(dir, "dev", "nvidia-caps", fmt.Sprintf("nvidia-cap%d", minor))
				if err := unix.Mknod(p, unix.S_IFCHR|0o444, int(unix.Mkdev(fakedriver.CapsMajor, uint32(minor)))); err != nil && !os.IsExist(err) {
					writeFileT(t, p, "")
				}
			}
		}
	}
	return dir
}

func writeFileT(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// cdi generate with NVIDIA's flags on a fake driver root and simulated
// GPUs (Gantry's configuration names them: nvidia-ctk has no such flag).
func TestNVCTKCDIGenerate(t *testing.T) {
	root := fakeRoot(t)
	cfg := filepath.Join(t.TempDir(), "gantry.toml")
	writeFileT(t, cfg, "gpus = \"sim:h100x8\"\n"+cacheTOML)
	t.Setenv("GANTRY_CONFIG", cfg)
	spec := filepath.Join(t.TempDir(), "cdi", "nvidia.yaml")
	_, errOut, code := ctk("cdi", "generate", "--output="+spec, "--driver-root="+root, "--nvidia-cdi-hook-path=/usr/bin/nvidia-cdi-hook",
		"--vendor=example.com", "--device-id=0,3", "--no-all-device", "--device-name-strategy=index", "--device-name-strategy=uuid", "--mode=auto")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	b, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Kind           string
		Devices        []struct{ Name string }
		ContainerEdits struct{ Hooks []struct{ Path string } }
	}
	if err := yaml.Unmarshal(b, &parsed); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range parsed.Devices {
		names = append(names, d.Name)
	}
	if parsed.Kind != "example.com/gpu" || len(names) != 4 || names[0] != "0" || !strings.Contains(strings.Join(names, ","), "3") || strings.Contains(strings.Join(names, ","), "all") {
		t.Errorf("kind %q devices %v; want example.com/gpu with 0, 3 and their UUIDs, no all", parsed.Kind, names)
	}
	if len(parsed.ContainerEdits.Hooks) == 0 || parsed.ContainerEdits.Hooks[0].Path != "/usr/bin/nvidia-cdi-hook" {
		t.Errorf("hooks %+v; want /usr/bin/nvidia-cdi-hook", parsed.ContainerEdits.Hooks)
	}
	out, errOut, code := ctk("cdi", "list", "--spec-dir", filepath.Dir(spec))
	if code != 0 || out != "example.com/gpu=0\nexample.com/gpu=3\n"+"example.com/gpu="+names[2]+"\n"+"example.com/gpu="+names[3]+"\n" && !strings.Contains(out, "example.com/gpu=3\n") {
		t.Errorf("cdi list: exit %d\n%s%s", code, out, errOut)
	}
	// No spec: nothing listed, exit 0 (as NVIDIA's), the fix on stderr;
	// gantry cdi list keeps calling it an error.
	empty := t.TempDir()
	if out, errOut, code := ctk("cdi", "list", "--spec-dir", empty); code != 0 || out != "" || !strings.Contains(errOut, "Found 0 CDI devices") || !strings.Contains(errOut, "gantry cdi generate") {
		t.Errorf("cdi list of an empty directory: exit %d, stdout %q, stderr %q; want exit 0, nothing listed, the fix on stderr", code, out, errOut)
	}
	if _, errOut, code := run("cdi", "list", "--spec-dirs", empty); code != 1 || !strings.Contains(errOut, "no CDI devices") {
		t.Errorf("gantry cdi list of an empty directory: exit %d, stderr %q; want exit 1", code, errOut)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mode=csv"}, "--mode=nvml"},
		{[]string{"--device-name-strategy=type-index"}, "index or uuid"},
		{[]string{"--device-id=99"}, `"99" is not the index or UUID`},
		{[]string{"--library-search-path=opt/lib"}, "absolute"},
		{[]string{"--csv.file=/etc/x.csv"}, "CSV mode"},
		{[]string{"--feature-flags=x"}, "--feature-flags is not supported"},
		{[]string{"--nvidia-cdi-hook-path=nvidia-cdi-hook"}, "absolute"},
	} {
		out, errOut, code := ctk(append([]string{"cdi", "generate", "--driver-root=" + root}, tc.args...)...)
		if code == 0 || out != "" || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %.80q, stderr %q; want one line with %q", tc.args, code, out, errOut, tc.want)
		}
	}
	// --library-search-path: a driver whose libraries are in a directory
	// neither the ld.so.cache nor the standard ones name.
	libRoot := filepath.Join(t.TempDir(), "driver")
	res, err := fakedriver.Build(libRoot, fakedriver.Options{Version: "580.159.04", GPUs: 8, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(libRoot, "etc/ld.so.cache"))
	if err := os.MkdirAll(filepath.Join(libRoot, "opt/nvidia"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(libRoot, res.LibDir), filepath.Join(libRoot, "opt/nvidia/lib")); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := ctk("cdi", "generate", "--driver-root="+libRoot); code == 0 || !strings.Contains(errOut, "libcuda") {
		t.Errorf("without --library-search-path: exit %d: %s", code, errOut)
	}
	out, errOut, code = ctk("cdi", "generate", "--driver-root="+libRoot, "--library-search-path=/opt/nvidia/lib")
	if code != 0 || !strings.Contains(out, filepath.Join(libRoot, "opt/nvidia/lib/libcuda.so.580.159.04")) {
		t.Errorf("--library-search-path: exit %d: %s\n%.2000s", code, errOut, out)
	}

	// MIG devices by GPU:INSTANCE and by MIG UUID (the simulated
	// a100x2-mig host: 1:4 is MIG-7df544de-...): only those, each under both
	// names, their GI and CI capability nodes in them, and "all" of the two.
	writeFileT(t, cfg, "gpus = \"sim:a100x2-mig\"\n"+cacheTOML)
	devRoot := migDevRoot(t, root, "a100x2-mig")
	migSpec := filepath.Join(t.TempDir(), "mig.yaml")
	if _, errOut, code := ctk("cdi", "generate", "--output="+migSpec, "--driver-root="+root, "--dev-root="+devRoot, "--device-id=0:1", "--device-id=MIG-7df544de-b326-18c0-d267-45d8cc2f45d4"); code != 0 {
		t.Fatalf("cdi generate --device-id MIG: exit %d: %s", code, errOut)
	}
	var mig struct {
		Devices []struct {
			Name           string
			ContainerEdits struct{ DeviceNodes []struct{ Path string } }
		}
	}
	b, _ = os.ReadFile(migSpec)
	if err := yaml.Unmarshal(b, &mig); err != nil {
		t.Fatal(err)
	}
	var migNames []string
	nodes := map[string][]string{}
	for _, d := range mig.Devices {
		migNames = append(migNames, d.Name)
		for _, n := range d.ContainerEdits.DeviceNodes {
			nodes[d.Name] = append(nodes[d.Name], n.Path)
		}
	}
	if strings.Join(migNames, " ") != "0:1 MIG-deafb517-a690-35c8-2793-a704c2459bf0 1:4 MIG-7df544de-b326-18c0-d267-45d8cc2f45d4 all" {
		t.Errorf("MIG spec devices %v", migNames)
	}
	if n := nodes["0:1"]; len(n) < 3 || !strings.Contains(strings.Join(n, " "), "/dev/nvidia-caps/nvidia-cap") || !slices.Contains(n, "/dev/nvidia0") || slices.Contains(n, "/dev/nvidia1") {
		t.Errorf("0:1's nodes %v: want /dev/nvidia0 and its GI and CI caps", n)
	}
	for _, bad := range []string{"0:9", "MIG-00000000-0000-0000-0000-000000000000"} {
		if _, errOut, code := ctk("cdi", "generate", "--driver-root="+root, "--dev-root="+devRoot, "--device-id="+bad); code != 2 || !strings.Contains(errOut, "not a MIG device") {
			t.Errorf("--device-id=%s: exit %d: %s", bad, code, errOut)
		}
	}
	writeFileT(t, cfg, "gpus = \"sim:h100x8\"\n"+cacheTOML)

	// cdi transform root: a spec of the fake driver root moved to /, on
	// the host side; then its container side moved back under /x.
	full := filepath.Join(t.TempDir(), "full.json")
	if _, errOut, code := ctk("cdi", "generate", "--output="+full, "--driver-root="+root); code != 0 {
		t.Fatalf("cdi generate: exit %d: %s", code, errOut)
	}
	if b, _ := os.ReadFile(full); !strings.Contains(string(b), root+"/") {
		t.Fatalf("the spec names no path under %s: the transform would prove nothing", root)
	}
	moved := filepath.Join(t.TempDir(), "moved.yaml")
	if _, errOut, code := ctk("cdi", "transform", "root", "--from="+root, "--to=/", "--input="+full, "--output="+moved); code != 0 {
		t.Fatalf("cdi transform root: exit %d: %s", code, errOut)
	}
	var ms struct {
		ContainerEdits struct {
			Mounts      []struct{ HostPath, ContainerPath string }
			DeviceNodes []struct{ Path, HostPath string }
		}
	}
	mb, _ := os.ReadFile(moved)
	if err := yaml.Unmarshal(mb, &ms); err != nil || len(ms.ContainerEdits.Mounts) == 0 {
		t.Fatalf("transformed spec: %v\n%s", err, mb)
	}
	if strings.Contains(string(mb), root) {
		t.Errorf("the transformed spec still names %s", root)
	}
	for _, m := range ms.ContainerEdits.Mounts {
		if m.HostPath != m.ContainerPath && !strings.HasPrefix(m.ContainerPath, "/usr/local/nvidia") && !strings.HasPrefix(m.HostPath, "/usr/local/nvidia") {
			t.Errorf("mount %s -> %s: host and container paths differ after moving the root to /", m.HostPath, m.ContainerPath)
		}
	}
	out, errOut, code = ctk("cdi", "transform", "root", "--from=/usr", "--to=/x/usr", "--relative-to=container", "--input="+moved)
	if code != 0 || !strings.Contains(out, "containerPath: /x/usr/") || strings.Contains(out, "hostPath: /x/") {
		t.Errorf("--relative-to container: exit %d %s\n%.600s", code, errOut, out)
	}
	if _, errOut, code := ctk("cdi", "transform", "root", "--from=rel", "--to=/"); code != 2 || !strings.Contains(errOut, "absolute") {
		t.Errorf("relative --from: exit %d, %s", code, errOut)
	}
}

// config --set with NVIDIA's key names over Gantry's file.
func TestNVCTKConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "etc", "gantry", "config.toml")
	t.Setenv("GANTRY_CONFIG", cfg)
	_, errOut, code := ctk("config", "--in-place", "--set", "nvidia-container-cli.root=/run/nvidia/driver", "--set=nvidia-container-runtime.modes.cdi.spec-dirs=/etc/cdi:/opt/cdi")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	b, _ := os.ReadFile(cfg)
	if !strings.Contains(string(b), "driver-root = '/run/nvidia/driver'") || !strings.Contains(string(b), "spec-dirs = ['/etc/cdi', '/opt/cdi']") {
		t.Fatalf("config after --set:\n%s\nstderr %s", b, errOut)
	}
	// A value equal to Gantry's default still replaces the file's.
	if _, errOut, code := ctk("config", "--in-place", "--set", "nvidia-container-runtime.log-level=debug"); code != 0 {
		t.Fatalf("log-level=debug: exit %d: %s", code, errOut)
	}
	if _, errOut, code := ctk("config", "--in-place", "--set", "nvidia-container-runtime.log-level=warn"); code != 0 {
		t.Fatalf("log-level=warn: exit %d: %s", code, errOut)
	}
	if after, _ := os.ReadFile(cfg); !strings.Contains(string(after), "log-level = 'warn'") || !strings.Contains(string(after), "driver-root = '/run/nvidia/driver'") {
		t.Fatalf("after setting log-level back to the default:\n%s", after)
	}
	b, _ = os.ReadFile(cfg)
	// The install guide's CDI line: Gantry has one mode, so nothing changes.
	_, errOut, code = ctk("config", "--in-place", "--set", "nvidia-container-runtime.mode=cdi")
	if after, _ := os.ReadFile(cfg); code != 0 || !bytes.Equal(b, after) || !strings.Contains(errOut, "not needed by Gantry") {
		t.Errorf("mode=cdi: exit %d, changed %v, stderr %q", code, !bytes.Equal(b, after), errOut)
	}
	// NVIDIA's rootless line: a key alone sets true; false sets it back.
	if _, errOut, code := ctk("config", "--set", "nvidia-container-cli.no-cgroups", "--in-place"); code != 0 || !strings.Contains(errOut, "runtime.no-cgroups") {
		t.Fatalf("no-cgroups: exit %d: %s", code, errOut)
	}
	if c, _, err := config.Load(cfg); err != nil || !c.Runtime.NoCgroups {
		t.Errorf("after --set nvidia-container-cli.no-cgroups: %+v %v", c.Runtime, err)
	}
	if _, errOut, code := ctk("config", "--set", "nvidia-container-cli.no-cgroups=false", "--in-place"); code != 0 {
		t.Fatalf("no-cgroups=false: exit %d: %s", code, errOut)
	}
	if c, _, err := config.Load(cfg); err != nil || c.Runtime.NoCgroups {
		t.Errorf("after --set nvidia-container-cli.no-cgroups=false: %+v %v", c.Runtime, err)
	}
	b, _ = os.ReadFile(cfg)
	// Without --in-place the result goes to stdout; -c names the file.
	other := filepath.Join(t.TempDir(), "other.toml")
	out, errOut, code := ctk("config", "-c", other, "--set", "nvidia-container-runtime.log-level=debug")
	if code != 0 || !strings.Contains(out, "log-level = 'debug'") {
		t.Errorf("-c --set to stdout: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := os.Stat(other); err == nil {
		t.Error("without --in-place the file was written")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "no-such.key=1"}, "no-such.key"},
		{[]string{"--set", "nvidia-container-runtime.mode=csv"}, "not supported"},
		{[]string{"--set", "=x"}, "KEY[=VALUE]"},
		{[]string{"-c", "/etc/nvidia-container-runtime/config.toml", "--set", "nvidia-container-cli.root=/"}, "NVIDIA's file"},
		{[]string{"-c", os.DevNull, "--in-place", "--set", "nvidia-container-cli.root=/"}, "not a regular file"},
	} {
		_, errOut, code := ctk(append([]string{"config"}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want one line with %q", tc.args, code, errOut, tc.want)
		}
	}
	for _, name := range []string{"default", "create-default", "generate-default"} {
		out, _, code := ctk("config", name)
		if code != 0 || !strings.Contains(out, "driver-root") {
			t.Errorf("config %s: exit %d\n%s", name, code, out)
		}
	}
}

// The device nodes and /dev/char links, made for real in a temporary dev
// root with the majors of a /proc/devices of the test's own.
func TestNVCTKSystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: mknod needs root")
	}
	tmp := t.TempDir()
	procDevices = filepath.Join(tmp, "devices")
	sysPCIDevices = filepath.Join(tmp, "pci")
	procDriver = filepath.Join(tmp, "proc-driver") // no MIG-capable driver, until below
	t.Cleanup(func() {
		procDevices, sysPCIDevices, procDriver = "/proc/devices", "/sys/bus/pci/devices", "/proc/driver"
	})
	writeFileT(t, procDevices, "Character devices:\n  1 mem\n195 nvidia-frontend\n236 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n  7 loop\n 510 nvidia-uvm-fake\n")
	for i, id := range []struct{ vendor, class string }{{"0x10de", "0x030200"}, {"0x10de", "0x030000"}, {"0x8086", "0x030000"}, {"0x10de", "0x040300"}} {
		d := filepath.Join(sysPCIDevices, fmt.Sprintf("0000:%02x:00.0", i+1))
		writeFileT(t, filepath.Join(d, "vendor"), id.vendor+"\n")
		writeFileT(t, filepath.Join(d, "class"), id.class+"\n")
	}
	root := filepath.Join(tmp, "root")
	if _, errOut, code := ctk("system", "create-device-nodes", "--control-devices", "--dev-root="+root); code != 0 {
		t.Fatalf("create-device-nodes: exit %d: %s", code, errOut)
	}
	want := map[string][2]uint32{"nvidiactl": {195, 255}, "nvidia-modeset": {195, 254}, "nvidia-uvm": {510, 0}, "nvidia-uvm-tools": {510, 1}}
	for name, mm := range want {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(root, "dev", name), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != mm[0] || unix.Minor(st.Rdev) != mm[1] || st.Mode&0o777 != 0o666 {
			t.Errorf("/dev/%s: mode %o rdev %d:%d, %v; want c %d:%d 0666", name, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), err, mm[0], mm[1])
		}
	}
	// Run again: nothing to do, nothing said.
	if _, errOut, code := ctk("system", "create-device-nodes", "--control-devices", "--dev-root="+root); code != 0 || errOut != "" {
		t.Errorf("second run: exit %d, %q", code, errOut)
	}
	// A GPU node and nodes the links leave out.
	for name, minor := range map[string]uint32{"nvidia0": 0, "nvidia-nvswitch0": 7} {
		if err := unix.Mknod(filepath.Join(root, "dev", name), unix.S_IFCHR|0o666, int(unix.Mkdev(195, minor))); err != nil {
			t.Fatal(err)
		}
	}
	writeFileT(t, filepath.Join(root, "dev", "nvidia9"), "a file, not a node")
	charDir := filepath.Join(tmp, "char")
	if _, errOut, code := ctk("system", "create-dev-char-symlinks", "--driver-root="+root, "--dev-char-path="+charDir); code != 0 {
		t.Fatalf("create-dev-char-symlinks: exit %d: %s", code, errOut)
	}
	links := func() map[string]string {
		m := map[string]string{}
		ents, _ := os.ReadDir(charDir)
		for _, e := range ents {
			m[e.Name()], _ = os.Readlink(filepath.Join(charDir, e.Name()))
		}
		return m
	}
	got := links()
	wantLinks := map[string]string{"195:0": "nvidia0", "195:255": "nvidiactl", "195:254": "nvidia-modeset", "510:0": "nvidia-uvm", "510:1": "nvidia-uvm-tools"}
	if len(got) != len(wantLinks) {
		t.Errorf("links %v; want %v", got, wantLinks)
	}
	for l, node := range wantLinks {
		if got[l] != filepath.Join(root, "dev", node) {
			t.Errorf("/dev/char/%s -> %q; want %s", l, got[l], filepath.Join(root, "dev", node))
		}
	}
	// --create-all: every GPU on the (fake) PCI bus, nodes or not.
	if _, errOut, code := ctk("system", "create-dev-char-symlinks", "--create-all", "--driver-root="+root, "--dev-char-path="+charDir); code != 0 {
		t.Fatalf("--create-all: exit %d: %s", code, errOut)
	}
	if got := links(); got["195:1"] != filepath.Join(root, "dev", "nvidia1") || got["195:2"] != "" || len(got) != 6 {
		t.Errorf("--create-all links %v; want 195:1 added for the second NVIDIA GPU only", got)
	}
	if _, errOut, code := ctk("system", "create-dev-char-symlinks", "--create-device-nodes"); code != 2 || !strings.Contains(errOut, "--create-all") {
		t.Errorf("--create-device-nodes without --create-all: exit %d, %q", code, errOut)
	}

	// A MIG-capable driver: mig-minors lists every capability it can grant
	// (here GPU 9's too, which the PCI bus does not have), the capabilities
	// directory the ones that exist now (GPU 0's instance 0 and its compute
	// instance 0), with the node modes.
	writeFileT(t, filepath.Join(procDriver, "nvidia-caps", "mig-minors"),
		"config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\ngpu0/gi1/access 12\ngpu1/gi0/access 120\ngpu1/gi0/ci0/access 121\ngpu9/gi0/access 999\nbogus 5\n")
	capsDir := filepath.Join(procDriver, "nvidia", "capabilities")
	writeFileT(t, filepath.Join(capsDir, "mig", "config"), "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
	writeFileT(t, filepath.Join(capsDir, "mig", "monitor"), "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
	writeFileT(t, filepath.Join(capsDir, "gpu0", "mig", "gi0", "access"), "DeviceFileMinor: 3\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
	writeFileT(t, filepath.Join(capsDir, "gpu0", "mig", "gi0", "ci0", "access"), "DeviceFileMinor: 4\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
	migRoot := filepath.Join(tmp, "mig-root") // a fresh dev root
	capNodes := func() map[string]string {
		m := map[string]string{}
		ents, _ := os.ReadDir(filepath.Join(migRoot, "dev", "nvidia-caps"))
		for _, e := range ents {
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(migRoot, "dev", "nvidia-caps", e.Name()), &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR {
				m[e.Name()] = fmt.Sprintf("%d:%d %o", unix.Major(st.Rdev), unix.Minor(st.Rdev), st.Mode&0o777)
			}
		}
		return m
	}
	if _, errOut, code := ctk("system", "create-device-nodes", "--control-devices", "--dev-root="+migRoot); code != 0 {
		t.Fatalf("create-device-nodes with MIG: exit %d: %s", code, errOut)
	}
	if got, want := capNodes(), map[string]string{"nvidia-cap1": "236:1 400", "nvidia-cap2": "236:2 444"}; !reflect.DeepEqual(got, want) {
		t.Errorf("--control-devices caps %v; want %v", got, want)
	}
	if _, errOut, code := ctk("system", "create-device-nodes", "--mig-devices", "--dev-root="+migRoot); code != 0 {
		t.Fatalf("--mig-devices: exit %d: %s", code, errOut)
	}
	if got, want := capNodes(), map[string]string{"nvidia-cap1": "236:1 400", "nvidia-cap2": "236:2 444", "nvidia-cap3": "236:3 444", "nvidia-cap4": "236:4 444"}; !reflect.DeepEqual(got, want) {
		t.Errorf("--mig-devices caps %v; want %v (the existing instances only)", got, want)
	}
	// DeviceFileMode 0 (root only) is the driver's choice too, not "unset".
	writeFileT(t, filepath.Join(capsDir, "mig", "monitor"), "DeviceFileMinor: 2\nDeviceFileMode: 0\nDeviceFileModify: 1\n")
	if _, errOut, code := ctk("system", "create-device-nodes", "--control-devices", "--dev-root="+migRoot); code != 0 {
		t.Fatalf("create-device-nodes, monitor mode 0: exit %d: %s", code, errOut)
	}
	if got := capNodes()["nvidia-cap2"]; got != "236:2 0" {
		t.Errorf("monitor node with DeviceFileMode 0: %s; want 236:2 0", got)
	}
	writeFileT(t, filepath.Join(capsDir, "mig", "monitor"), "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
	migChar := filepath.Join(tmp, "mig-char")
	if _, errOut, code := ctk("system", "create-dev-char-symlinks", "--create-all", "--driver-root="+migRoot, "--dev-char-path="+migChar); code != 0 {
		t.Fatalf("--create-all with MIG: exit %d: %s", code, errOut)
	}
	charDir = migChar
	got = links()
	for _, minor := range []int{1, 2, 3, 4, 12, 120, 121} {
		if l := fmt.Sprintf("236:%d", minor); got[l] != filepath.Join(migRoot, "dev", "nvidia-caps", fmt.Sprintf("nvidia-cap%d", minor)) {
			t.Errorf("/dev/char/%s -> %q", l, got[l])
		}
	}
	if got["236:999"] != "" || got["236:5"] != "" || len(got) != 6+7 {
		t.Errorf("--create-all links %v: want the control nodes, both GPUs and the 7 capabilities of GPUs 0 and 1", got)
	}
	writeFileT(t, procDevices, "Character devices:\n195 nvidia-frontend\n510 nvidia-uvm\n")
	if _, errOut, code := ctk("system", "create-device-nodes", "--control-devices", "--dev-root="+migRoot); code != 1 || !strings.Contains(errOut, "nvidia-caps major") {
		t.Errorf("mig-minors without the nvidia-caps major: exit %d, %q", code, errOut)
	}

	// Without the uvm major the error says how to load the module.
	writeFileT(t, procDevices, "Character devices:\n195 nvidia\n")
	if _, errOut, code := ctk("system", "create-device-nodes", "--control-devices", "--dev-root="+root); code != 1 || !strings.Contains(errOut, "--load-kernel-modules") {
		t.Errorf("no uvm major: exit %d, %q", code, errOut)
	}
}

// The CDI hooks answer under nvidia-ctk hook, as NVIDIA's do.
func TestNVCTKHookAndHelp(t *testing.T) {
	if _, errOut, code := runCTK(t, "hook", "noop"); code != 0 || errOut != "" {
		t.Errorf("hook noop: exit %d, %q", code, errOut)
	}
	if _, errOut, code := runCTK(t, "hook", "some-future-hook"); code != 0 || !strings.Contains(errOut, "unsupported CDI hook") {
		t.Errorf("hook some-future-hook: exit %d, %q", code, errOut)
	}
	out, _, code := runCTK(t, "--help")
	for _, w := range []string{"runtime configure", "cdi generate", "system create-dev-char-symlinks", "config"} {
		if code != 0 || !strings.Contains(out, w) {
			t.Errorf("--help lacks %q (exit %d)", w, code)
		}
	}
	if _, errOut, code := runCTK(t, "--config=/etc/nvidia-container-runtime/config.toml", "info"); code != 2 || !strings.Contains(errOut, "gantry config migrate") {
		t.Errorf("global --config: exit %d, %q", code, errOut)
	}
	if _, errOut, code := runCTK(t, "system"); code != 2 || !strings.Contains(errOut, "create-device-nodes") {
		t.Errorf("system alone: exit %d, %q", code, errOut)
	}
}

// gantry runtime configure --config DAEMON.JSON (NVIDIA's habit, where
// --config is Gantry's own file) fails naming the two ways that work, and
// leaves the engine's file alone.
func TestRuntimeConfigureConfigHint(t *testing.T) {
	daemon := filepath.Join(t.TempDir(), "daemon.json")
	writeFileT(t, daemon, `{"debug": true}`)
	_, errOut, code := run("runtime", "configure", "--runtime", "docker", "--config="+daemon)
	if code != 1 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "--config-file "+daemon) || !strings.Contains(errOut, "nvidia-ctk runtime configure --config="+daemon) {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	if b, _ := os.ReadFile(daemon); string(b) != `{"debug": true}` {
		t.Errorf("daemon.json changed: %s", b)
	}
}

// nvidia-ctk's mistyped commands get the closest one too.
func TestNVCTKDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cdi", "generat"}, `unknown subcommand "generat" (did you mean "nvidia-ctk cdi generate"?)`},
		{[]string{"runtim", "configure"}, `unknown command "runtim" (did you mean "runtime"?)`},
	} {
		var out, errb strings.Builder
		if code := NVIDIACTKMain(tc.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("nvidia-ctk %q: exit %d, stderr %q; want exit 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
