package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/doctor"
	"github.com/gantry-gpu/gantry/internal/engineconfig"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// fakeEngine is an engine defined here and nowhere else: its
// configuration is one "NAME=PROGRAM" line per runtime. Registering it is
// all it takes for runtime configure, nvidia-ctk runtime configure and
// gantry doctor to know it (issue 31: an engine is one Definition).
func fakeEngine(path string) engineconfig.Definition {
	parse := func(data []byte) (engineconfig.Registered, error) {
		var r engineconfig.Registered
		for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			if l == "" {
				continue
			}
			n, p, ok := strings.Cut(l, "=")
			if !ok {
				return r, fmt.Errorf("%w: line %q is not NAME=PROGRAM", engineconfig.ErrMalformed, l)
			}
			r.Runtimes = append(r.Runtimes, engineconfig.Runtime{Name: n, Program: p})
		}
		return r, nil
	}
	return engineconfig.Definition{
		Name:        "fakeng",
		Aliases:     []string{"fake-engine"},
		Title:       "FakeEngine",
		DefaultPath: path,
		Writes:      path + ": nvidia=PROGRAM",
		Program:     "fakengd",
		Restart:     "systemctl restart fakeng",
		Parse:       parse,
		Plan: func(current []byte, opts engineconfig.Options, names []string) (engineconfig.Planned, error) {
			reg, err := parse(current)
			if err != nil {
				return engineconfig.Planned{}, err
			}
			out := string(current)
			var p engineconfig.Planned
			for _, n := range names {
				if rt, ok := reg.Runtime(n); ok && rt.Program == opts.RuntimePath {
					continue
				}
				out += n + "=" + opts.RuntimePath + "\n"
				p.Changes = append(p.Changes, "runtime "+n+" runs "+opts.RuntimePath)
			}
			p.Updated = []byte(out)
			return p, nil
		},
	}
}

// TestRegisteredEngine: an engine registered in a test (fakeEngine) is in
// runtime configure's names and help, configure writes it, nvidia-ctk
// runtime configure names it, and gantry doctor lists and runs a check of
// it (PASS, FAIL with the engine's configure command, SKIP when it is not
// installed) — with no file of the CLI or doctor naming it.
func TestRegisteredEngine(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "fakeng.conf")
	if err := engineconfig.Register(fakeEngine(conf)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { engineconfig.Unregister("fakeng") })
	if err := engineconfig.Register(fakeEngine(conf)); err == nil {
		t.Error("a second engine named fakeng was registered")
	}

	// The CLI's names and help.
	out, errOut, code := run("runtime", "configure", "--help")
	help := out + errOut
	for _, want := range []string{
		"Register Gantry's runtime with Docker, containerd, CRI-O or FakeEngine",
		"  fakeng      " + conf + ": nvidia=PROGRAM",
		"docker, containerd, crio or fakeng (required)",
		"systemctl restart docker / containerd / crio / fakeng",
		"dockerd, containerd, crio or fakengd",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("runtime configure --help lacks %q:\n%s", want, help)
		}
	}
	out, errOut, _ = run("--help")
	if !strings.Contains(out+errOut, "Docker, containerd, CRI-O or FakeEngine") {
		t.Errorf("gantry --help's summary of runtime configure lacks the engine:\n%s", out+errOut)
	}
	var o, e bytes.Buffer
	NVIDIACTKMain([]string{"runtime", "configure", "--help"}, &o, &e)
	if s := o.String() + e.String(); !strings.Contains(s, "docker, containerd, crio or fakeng (gantry runtime configure)") || !strings.Contains(s, "docker, containerd, crio or fakeng (default docker)") {
		t.Errorf("nvidia-ctk runtime configure --help does not name the engine:\n%s", s)
	}
	if _, errOut, code := run("runtime", "configure", "--runtime", "nosuch"); code != 2 || !strings.Contains(errOut, "docker, containerd, crio, fakeng") {
		t.Errorf("an unknown engine: exit %d, want 2 naming the engines:\n%s", code, errOut)
	}

	// configure writes the engine's file (by an alias too), through its
	// Plan, read back by its Parse.
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	rt := filepath.Join(bin, "gantry-runtime")
	if err := os.WriteFile(rt, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = run("runtime", "configure", "--runtime", "fake-engine", "--runtime-path", rt)
	if code != 0 {
		t.Fatalf("runtime configure --runtime fake-engine: exit %d\n%s%s", code, out, errOut)
	}
	got, _ := os.ReadFile(conf)
	if want := "nvidia=" + rt + "\ngantry=" + rt + "\n"; string(got) != want {
		t.Fatalf("configure wrote %q, want %q", got, want)
	}
	if !strings.Contains(out, "+nvidia="+rt) || !strings.Contains(errOut, "not checked by fakengd itself") {
		t.Errorf("configure's diff or check line:\n%s%s", out, errOut)
	}

	// doctor --help lists its check, after CRI-O's.
	out, errOut, _ = run("doctor", "--help")
	help = out + errOut
	if i, j := strings.Index(help, "cri-o config"), strings.Index(help, "fakeng config"); j < 0 || j < i || !strings.Contains(help, "FakeEngine's configuration registers a GPU runtime") {
		t.Errorf("doctor --help does not list the engine's check after cri-o's:\n%s", help)
	}
	if !strings.Contains(doctor.Troubleshooting(), "## fakeng config") {
		t.Error("the troubleshooting page does not document the engine's check")
	}

	// doctor runs it: on a healthy simulated host it passes.
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot build the fake driver root (make deps installs it)")
	}
	root := filepath.Join(dir, "driver")
	res, err := fakedriver.Build(root, fakedriver.Options{GPUs: 1, DeviceNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.RealDeviceNodes {
		t.Skip("not root: the fake driver's device nodes are regular files")
	}
	if err := os.WriteFile(filepath.Join(root, "proc/devices"), []byte("Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte("[cdi]\nspec-dirs = [\""+filepath.Join(dir, "cdi")+"\"]\n[runtime]\ncache-dir = \""+filepath.Join(dir, "cache")+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostArgs := hermeticDoctor(t, filepath.Join(dir, "host"))
	doctorRun := func() doctor.Check {
		t.Helper()
		out, errOut, _ := run(append([]string{"--config", cfg, "--gpus", "sim:h100x8", "--driver-root", root, "doctor", "--json",
			"--proc", filepath.Join(dir, "proc"), "--docker-config", filepath.Join(dir, "none.json"),
			"--docker-socket", filepath.Join(dir, "no-docker.sock"), "--containerd-config", filepath.Join(dir, "none.toml"),
			"--crio-dropins", filepath.Join(dir, "none.d")}, hostArgs...)...)
		var checks []doctor.Check
		if err := json.Unmarshal([]byte(out), &checks); err != nil {
			t.Fatalf("doctor --json: %v\n%s%s", err, out, errOut)
		}
		i := slices.IndexFunc(checks, func(c doctor.Check) bool { return c.Name == "fakeng config" })
		if i < 0 {
			t.Fatalf("doctor ran no check of the engine:\n%s", out)
		}
		return checks[i]
	}
	if c := doctorRun(); c.Status != doctor.Pass || !strings.Contains(c.Evidence, conf+`: runtime "nvidia" -> `+rt) {
		t.Errorf("configured engine: %+v, want PASS naming the file and runtime", c)
	}
	// The runtime's program gone: FAIL, with the engine's configure command.
	if err := os.WriteFile(conf, []byte("nvidia=/nonexistent/gantry-runtime\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c := doctorRun(); c.Status != doctor.Fail || !strings.Contains(c.Fix, "gantry runtime configure --runtime fakeng, then systemctl restart fakeng") {
		t.Errorf("runtime program missing: %+v, want FAIL with the engine's configure command", c)
	}
	if err := os.WriteFile(conf, []byte("not a line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c := doctorRun(); c.Status != doctor.Fail || !strings.Contains(c.Evidence, "not NAME=PROGRAM") {
		t.Errorf("malformed configuration: %+v, want FAIL quoting the engine's parser", c)
	}
	// Not installed: no configuration, no program on PATH.
	if err := os.Remove(conf); err != nil {
		t.Fatal(err)
	}
	if c := doctorRun(); c.Status != doctor.Skip || !strings.Contains(c.Evidence, "FakeEngine is not installed") {
		t.Errorf("engine not installed: %+v, want SKIP", c)
	}
}
