//go:build linux

package engines

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
)

// debianContainerdConfig is Debian 12's packaged /etc/containerd/config.toml
// (containerd 1.6.20~ds1-1+deb12u3), the file issue 26 found configure
// breaking: it defines no runtime, so containerd 1.x loses its built-in
// runc as soon as a runtime is added.
const debianContainerdConfig = "../../internal/engineconfig/testdata/in/containerd-debian12.toml"

// containerd2 returns a containerd 2.x binary and its ctr, or "" with the
// reason: $GANTRY_CONTAINERD2 (a containerd binary, its ctr beside it),
// else bin/containerd2 (scripts/build-containerd2.sh), else bin/cluster
// (test/cluster/build.sh).
func containerd2() (bin, ctr, why string) {
	var cands []string
	if v := os.Getenv("GANTRY_CONTAINERD2"); v != "" {
		cands = append(cands, v)
	}
	cands = append(cands, "../../bin/containerd2/containerd", "../../bin/cluster/containerd")
	for _, c := range cands {
		abs, err := filepath.Abs(c)
		if err != nil {
			continue
		}
		if _, err := os.Stat(abs); err != nil {
			continue
		}
		out, err := exec.Command(abs, "--version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), " v2.") && !strings.Contains(string(out), " 2.") {
			continue
		}
		ctr = filepath.Join(filepath.Dir(abs), "ctr")
		if _, err := os.Stat(ctr); err != nil {
			ctr = "ctr"
		}
		return abs, ctr, ""
	}
	return "", "", "no containerd 2.x binary: scripts/build-containerd2.sh builds bin/containerd2 (or set GANTRY_CONTAINERD2)"
}

// privateContainerd rewrites a containerd configuration so that a daemon
// started on it keeps everything under dir (root, state, sockets, the opt
// and CNI directories, NRI) and opens no fixed port, changing nothing
// else: what configure reads is the file as packaged or generated.
func privateContainerd(cfg, dir string) string {
	cfg = strings.NewReplacer(
		"/var/lib/containerd", filepath.Join(dir, "root"),
		"/run/containerd", filepath.Join(dir, "state"),
		"/opt/containerd", filepath.Join(dir, "opt"),
		"/etc/cni/net.d", filepath.Join(dir, "cni", "conf"),
		"/opt/cni/bin", filepath.Join(dir, "cni", "bin"),
		"/var/run/nri", filepath.Join(dir, "nri"),
		"/etc/nri/conf.d", filepath.Join(dir, "nri", "conf.d"),
		"/opt/nri/plugins", filepath.Join(dir, "nri", "plugins"),
		"/etc/containerd/conf.d", filepath.Join(dir, "conf.d"), // 2.4's default imports the host's drop-ins
		`stream_server_port = "10010"`, `stream_server_port = "0"`,
		`stream_server_port = '10010'`, `stream_server_port = '0'`,
	).Replace(cfg)
	var top []string
	if !strings.Contains(cfg, "\nroot = ") {
		top = append(top, fmt.Sprintf("root = %q", filepath.Join(dir, "root")), fmt.Sprintf("state = %q", filepath.Join(dir, "state")))
	}
	if len(top) > 0 {
		lines := strings.SplitAfterN(cfg, "\n", 2)
		cfg = lines[0] + strings.Join(top, "\n") + "\n" + lines[1]
	}
	if !strings.Contains(cfg, "containerd.sock") {
		// Versions 2 and 3 (version 4 names the sockets in its server
		// plugins, replaced above).
		cfg += fmt.Sprintf("\n[grpc]\n  address = %q\n\n[ttrpc]\n  address = %q\n",
			filepath.Join(dir, "state", "containerd.sock"), filepath.Join(dir, "state", "containerd.sock.ttrpc"))
	}
	return cfg
}

// criOK returns the status of the CRI plugins in `ctr plugins ls` output:
// io.containerd.grpc.v1 cri, and on containerd 2.x io.containerd.cri.v1
// runtime as well.
func criStatus(plugins string) map[string]string {
	got := map[string]string{}
	for _, line := range strings.Split(plugins, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		id := f[0] + " " + f[1]
		if id == "io.containerd.grpc.v1 cri" || id == "io.containerd.cri.v1 runtime" {
			got[id] = f[len(f)-1]
		}
	}
	return got
}

// criConfig asks a containerd's CRI service for its configuration
// (verbose Status) and reads it with Gantry's reader.
func criConfig(sock string) (engineconfig.Registered, error) {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return engineconfig.Registered{}, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := runtimeapi.NewRuntimeServiceClient(conn).Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return engineconfig.Registered{}, err
	}
	return engineconfig.ParseContainerdStatus([]byte(st.GetInfo()["config"]))
}

// TestConfigureContainerd: `gantry runtime configure --runtime containerd`
// on the files containerd ships with (Debian 12's packaged config.toml,
// `containerd config default`), in place, as a drop-in and from
// `containerd config dump`, then a real containerd started on the result:
// its CRI plugin loads (`ctr plugins ls` says ok), its default runtime is
// still runc, and the CRI service reports nvidia and gantry running
// Gantry's runtime. containerd 1.6 is Debian's (scripts/deps.sh --test);
// containerd 2.x (version 3 files) runs where a 2.x binary was built
// (scripts/build-containerd2.sh). The first case starts containerd 1.6 on
// what configure wrote before the fix, and must see the CRI plugin fail:
// the check can fail.
//
// The set-as-default cases (gantry's --set-as-default and nvidia-ctk's, in
// place and as a drop-in, on every config version) want the CRI service's
// default runtime to be nvidia, runc still defined beside it; on Debian's
// file a pod that names no runtime handler (a pod without
// runtimeClassName, as NVIDIA's static DaemonSets are) gets its GPU.
func TestConfigureContainerd(t *testing.T) {
	f := need(t)
	if why := containerdSkip(); why != "" {
		t.Skip(why)
	}
	hostDirsCleanup(t)
	debian, err := os.ReadFile(debianContainerdConfig)
	if err != nil {
		t.Fatal(err)
	}
	type tc struct {
		name   string
		bin    string // containerd
		ctr    string
		config []byte
		args   []string // more configure arguments
		broken bool     // configure is not run: the file as configure wrote it before the fix
		pod    bool     // a GPU pod runs through the runtime nvidia afterwards
		merges bool     // broken, on containerd 2.x: its go-toml v2 keeps the built-in runc
		def    bool     // --set-as-default: the default runtime must be nvidia
		ctk    bool     // run as nvidia-ctk runtime configure (NVIDIA's flags; registers nvidia only)
	}
	ctk := filepath.Join(t.TempDir(), "nvidia-ctk")
	if err := os.Symlink(f.gantry, ctk); err != nil {
		t.Fatal(err)
	}
	beforeTheFix := append(append([]byte{}, debian...), []byte(`
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
BinaryName = "RUNTIME"
`)...)
	defaultOf := func(bin string) []byte {
		out, err := exec.Command(bin, "config", "default").Output()
		if err != nil {
			t.Fatalf("%s config default: %v", bin, err)
		}
		return out
	}
	ctd1, _ := exec.LookPath("containerd")
	cases := []tc{
		{name: "1.x/before-the-fix", bin: ctd1, ctr: "ctr", config: beforeTheFix, broken: true},
		{name: "1.x/debian12", bin: ctd1, ctr: "ctr", config: debian, pod: true},
		{name: "1.x/debian12-drop-in", bin: ctd1, ctr: "ctr", config: debian, args: []string{"--drop-in", "DIR/conf.d/99-nvidia.toml"}},
		{name: "1.x/debian12-command", bin: ctd1, ctr: "ctr", config: debian, args: []string{"--config-source", "command"}},
		{name: "1.x/default", bin: ctd1, ctr: "ctr", config: defaultOf(ctd1)},
		{name: "1.x/debian12-set-as-default", bin: ctd1, ctr: "ctr", config: debian, def: true, pod: true},
		{name: "1.x/debian12-drop-in-set-as-default", bin: ctd1, ctr: "ctr", config: debian, def: true, args: []string{"--drop-in", "DIR/conf.d/99-nvidia.toml"}},
		{name: "1.x/default-set-as-default", bin: ctd1, ctr: "ctr", config: defaultOf(ctd1), def: true},
		{name: "1.x/nvidia-ctk-set-as-default", bin: ctd1, ctr: "ctr", config: debian, def: true, ctk: true},
	}
	if bin2, ctr2, why := containerd2(); why == "" {
		// containerd 2.4's own default is version 4 (its server settings
		// moved into plugins; the CRI plugins are version 3's).
		def := defaultOf(bin2)
		v3 := []byte("version = 3\n")
		cases = append(cases,
			tc{name: "2.x/before-the-fix", bin: bin2, ctr: ctr2, config: beforeTheFix, broken: true, merges: true},
			tc{name: "2.x/debian12-v2", bin: bin2, ctr: ctr2, config: debian},
			tc{name: "2.x/debian12-v2-drop-in", bin: bin2, ctr: ctr2, config: debian, args: []string{"--drop-in", "DIR/conf.d/99-nvidia.toml"}},
			tc{name: "2.x/v3", bin: bin2, ctr: ctr2, config: v3},
			tc{name: "2.x/v3-drop-in", bin: bin2, ctr: ctr2, config: v3, args: []string{"--drop-in", "DIR/conf.d/99-nvidia.toml"}},
			tc{name: "2.x/default", bin: bin2, ctr: ctr2, config: def},
			tc{name: "2.x/default-drop-in", bin: bin2, ctr: ctr2, config: def, args: []string{"--drop-in", "DIR/conf.d/99-nvidia.toml"}},
			tc{name: "2.x/default-command", bin: bin2, ctr: ctr2, config: def, args: []string{"--config-source", "command"}},
			tc{name: "2.x/debian12-v2-set-as-default", bin: bin2, ctr: ctr2, config: debian, def: true},
			tc{name: "2.x/v3-set-as-default", bin: bin2, ctr: ctr2, config: v3, def: true},
			tc{name: "2.x/v3-drop-in-set-as-default", bin: bin2, ctr: ctr2, config: v3, def: true, args: []string{"--drop-in", "DIR/conf.d/99-nvidia.toml"}},
			tc{name: "2.x/default-set-as-default", bin: bin2, ctr: ctr2, config: def, def: true},
			tc{name: "2.x/nvidia-ctk-set-as-default", bin: bin2, ctr: ctr2, config: def, def: true, ctk: true},
		)
	} else {
		t.Logf("containerd 2.x cases not run: %s", why)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, d := range []string{"cni/conf", "cni/bin", "nri/conf.d", "nri/plugins"} {
				if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			config := filepath.Join(dir, "config.toml")
			cfg := strings.ReplaceAll(privateContainerd(string(c.config), dir), "RUNTIME", f.nvRuntime)
			if c.pod {
				cfg = podReady(t, f, cfg)
			}
			if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
				t.Fatal(err)
			}
			env := f.daemonEnv()
			if !c.broken {
				args := []string{f.gantry, "runtime", "configure", "--runtime", "containerd", "--config-file", config,
					"--runtime-path", f.nvRuntime, "--executable-path", c.bin}
				if c.ctk {
					// NVIDIA's default: a drop-in beside the file, imported by it.
					args = []string{ctk, "runtime", "configure", "--runtime=containerd", "--config=" + config,
						"--drop-in-config=" + filepath.Join(dir, "conf.d", "99-nvidia.toml"),
						"--nvidia-runtime-path=" + f.nvRuntime, "--executable-path=" + c.bin}
				}
				if c.def {
					args = append(args, "--set-as-default")
				}
				for _, a := range c.args {
					args = append(args, strings.ReplaceAll(a, "DIR", dir))
				}
				out, err := command(env, args...)
				if err != nil {
					t.Fatalf("configure: %v\n%s", err, out)
				}
				var said []string // the change lines, not the diff
				for _, l := range strings.Split(out, "\n") {
					if l != "" && !strings.ContainsAny(l[:1], "+- @") {
						said = append(said, l)
					}
				}
				t.Logf("configure:\n%s", strings.Join(said, "\n"))
				if !strings.Contains(out, "checked by "+c.bin) {
					t.Errorf("configure does not say containerd checked the result:\n%s", out)
				}
				if b, err := os.ReadFile(config + engineconfig.BackupSuffix); c.args == nil && !c.ctk && (err != nil || string(b) != cfg) {
					t.Errorf("the old file is not kept as %s%s: %v", config, engineconfig.BackupSuffix, err)
				}
			}
			sock := filepath.Join(dir, "state", "containerd.sock")
			if err := os.MkdirAll(filepath.Join(dir, "containerd"), 0o755); err != nil {
				t.Fatal(err)
			}
			d := startDaemon(t, "containerd", filepath.Join(dir, "containerd", "containerd.log"), dir, env, c.bin, "--config", config)
			d.waitReady(t, func() error {
				_, err := command(env, c.ctr, "--address", sock, "version")
				return err
			})
			plugins, err := command(env, c.ctr, "--address", sock, "plugins", "ls")
			if err != nil {
				t.Fatalf("%v\n%s", err, plugins)
			}
			status := criStatus(plugins)
			log := tail(d.log, 200000)
			if c.broken && c.merges {
				// The fact behind the fix: 2.x merges the file's runtimes
				// into its built-in ones, so runc survives there.
				reg, err := criConfig(sock)
				if _, ok := reg.Runtime("runc"); err != nil || !ok || status["io.containerd.grpc.v1 cri"] != "ok" {
					t.Errorf("containerd 2.x on a file without runc: CRI %v, runtimes %+v, %v", status, reg.Runtimes, err)
				}
				return
			}
			if c.broken {
				if status["io.containerd.grpc.v1 cri"] == "ok" || !strings.Contains(log, "no corresponding runtime configured") {
					t.Errorf("containerd 1.x loaded its CRI plugin without a runc entry (status %v): this test's check cannot fail\n%s", status, tail(d.log, 3000))
				}
				return
			}
			for id, s := range status {
				if s != "ok" {
					t.Errorf("plugin %s is %s after configure:\n%s\ncontainerd log:\n%s\nconfig:\n%s", id, s, plugins, tail(d.log, 4000), tail(config, 4000))
				}
			}
			if _, ok := status["io.containerd.grpc.v1 cri"]; !ok {
				t.Fatalf("no CRI plugin in ctr plugins ls:\n%s", plugins)
			}
			if strings.Contains(log, "no corresponding runtime") {
				t.Errorf("containerd log: %s", tail(d.log, 3000))
			}
			reg, err := criConfig(sock)
			if err != nil {
				t.Fatalf("CRI status: %v\n%s", err, tail(d.log, 3000))
			}
			wantDefault, names, handler := "runc", []string{"nvidia", "gantry"}, "nvidia"
			if c.def {
				// The pod names no handler: containerd's default runs it.
				wantDefault, handler = "nvidia", ""
			}
			if c.ctk {
				names = []string{"nvidia"}
			}
			if def := reg.DefaultRuntime; def != wantDefault {
				t.Errorf("default runtime after configure = %q, want %s (runtimes %+v)", def, wantDefault, reg.Runtimes)
			}
			if rt, ok := reg.Runtime("runc"); !ok || rt.Program != "runc" {
				t.Errorf("runc = %+v, %v, want the runc binary", rt, ok)
			}
			for _, n := range names {
				if rt, ok := reg.Runtime(n); !ok || rt.Program != f.nvRuntime {
					t.Errorf("%s = %+v, %v, want %s (runtimes %+v)", n, rt, ok, f.nvRuntime, reg.Runtimes)
				}
			}
			b, _ := json.Marshal(reg)
			t.Logf("CRI: %s; plugins %v", b, status)
			if c.pod {
				gpuPod(t, f, dir, sock, c.ctr, handler, env)
			}
		})
	}
}

// TestConfigureDockerNVIDIAForm: `nvidia-ctk runtime configure
// --runtime=docker` writes NVIDIA's entry, {"path":
// "nvidia-container-runtime", "args": []}, a real dockerd starts on it and
// finds the runtime on its PATH, and a GPU container runs through it.
// Under Gantry's own name the path is gantry-runtime's (TestDocker).
func TestConfigureDockerNVIDIAForm(t *testing.T) {
	f := need(t)
	ctk := filepath.Join(t.TempDir(), "nvidia-ctk")
	if err := os.Symlink(f.gantry, ctk); err != nil {
		t.Fatal(err)
	}
	var configured string
	e := startDockerWith(t, need(t).daemonEnv(), func(env []string, daemonJSON string) (string, error) {
		out, err := command(env, ctk, "runtime", "configure", "--runtime=docker", "--config="+daemonJSON)
		b, _ := os.ReadFile(daemonJSON)
		configured = string(b)
		return out, err
	})
	var doc struct {
		Runtimes map[string]map[string]any `json:"runtimes"`
	}
	if err := json.Unmarshal([]byte(configured), &doc); err != nil {
		t.Fatal(err)
	}
	if nv := doc.Runtimes["nvidia"]; fmt.Sprint(nv) != "map[args:[] path:nvidia-container-runtime]" || len(doc.Runtimes) != 1 {
		t.Errorf("nvidia-ctk's daemon.json runtimes = %v, want only nvidia: {path: nvidia-container-runtime, args: []}\n%s", doc.Runtimes, configured)
	}
	out, err := e.docker("info", "--format", "{{json .Runtimes}}")
	if err != nil || !strings.Contains(out, `"nvidia":{"path":"nvidia-container-runtime"`) {
		t.Errorf("docker info runtimes: %v\n%s", err, out)
	}
	out, err = e.run("--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=1")
	if err != nil {
		t.Fatalf("%v\n%s\n%s\ndockerd log:\n%s", err, out, f.runtimeLogTail(), tail(e.d.log, 3000))
	}
	report(t, f, "docker run --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=1 (nvidia-ctk's daemon.json)", checkOnlyGPU1(f, out), out)
}

// podReady adds to a packaged containerd configuration's CRI section what a
// pod needs on a test host and nothing about runtimes: the sandbox image
// imported from a local archive, no AppArmor profile (the host may lack
// apparmor_parser), oom_score_adj no lower than containerd's own, and the
// native snapshotter where overlayfs does not work.
func podReady(t *testing.T, f *fixture, cfg string) string {
	const header = "[plugins.\"io.containerd.grpc.v1.cri\"]\n"
	i := strings.Index(cfg, header)
	if i < 0 {
		t.Fatalf("no CRI section to add the pod settings to:\n%s", cfg)
	}
	i += len(header)
	add := fmt.Sprintf("    sandbox_image = %q\n    disable_apparmor = true\n    restrict_oom_score_adj = true\n", pauseImage)
	cfg = cfg[:i] + add + cfg[i:]
	if !f.overlay {
		cfg += "\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"native\"\n"
	}
	return cfg
}

// gpuPod runs a pod through the CRI with the runtime handler given (""
// for containerd's default runtime: a pod without runtimeClassName) and
// NVIDIA_VISIBLE_DEVICES=1, and checks that its container sees GPU 1 only.
func gpuPod(t *testing.T, f *fixture, dir, sock, ctr, handler string, env []string) {
	t.Helper()
	snapshotter := "native"
	if f.overlay {
		snapshotter = "overlayfs"
	}
	pause := filepath.Join(dir, "pause-oci.tar")
	layer, err := os.ReadFile(f.rootfsTar)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeImageArchive(pause, layer, pauseImage, []string{"busybox", "sleep", "100000"}); err != nil {
		t.Fatal(err)
	}
	for _, archive := range []string{pause, f.ociArchive} {
		if out, err := command(env, ctr, "--address", sock, "--namespace", "k8s.io", "images", "import", "--snapshotter", snapshotter, archive); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e := &criEngine{f: f, dir: dir, sock: sock, state: filepath.Join(dir, "state"), env: env, rt: runtimeapi.NewRuntimeServiceClient(conn)}
	_, id := e.runPod(t, "ml", "configured", handler, map[string]string{"NVIDIA_VISIBLE_DEVICES": "1"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := e.rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh", "-c", gpuScript}, Timeout: 60})
	if err != nil || res.GetExitCode() != 0 {
		t.Fatalf("exec in the GPU pod: %v (exit %d)\n%s%s", err, res.GetExitCode(), res.GetStdout(), res.GetStderr())
	}
	out := string(res.GetStdout())
	what := "a pod with runtimeClassName nvidia (handler nvidia)"
	if handler == "" {
		what = "a pod without runtimeClassName (containerd's default runtime)"
	}
	report(t, f, what+" and NVIDIA_VISIBLE_DEVICES=1 on the configured Debian file", checkOnlyGPU1(f, out), out)
}
