package engineconfig

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// needContainerd returns the containerd on PATH, or skips.
func needContainerd(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("containerd")
	if err != nil {
		t.Skip("containerd not installed (apt-get install containerd; scripts/deps.sh --test does): the engine check is not exercised")
	}
	return bin
}

// containerdMajor is the major version of the containerd binary.
func containerdMajor(t *testing.T, bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "v") {
			f = f[1:]
		}
		if len(f) > 1 && f[0] >= '0' && f[0] <= '9' && f[1] == '.' {
			return f[:1]
		}
	}
	t.Fatalf("no version in %q", out)
	return ""
}

// TestEngineCheckContainerd: containerd's own `config dump` reads what
// configure planned, and what containerd would not load is refused.
func TestEngineCheckContainerd(t *testing.T) {
	bin := needContainerd(t)
	opts, names, err := gantryOpts.normalize(Containerd)
	if err != nil {
		t.Fatal(err)
	}
	main := filepath.Join(t.TempDir(), "config.toml")
	debian := readInput(t, "containerd-debian12.toml")
	// What configure wrote before it kept the default runtime: nvidia and
	// gantry, no runc. containerd 1.x loads it with no runc, and its CRI
	// plugin then fails; 2.x keeps its built-in runc.
	broken := append(append([]byte{}, debian...), []byte(`
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
BinaryName = "/usr/bin/gantry-runtime"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gantry]
runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gantry.options]
BinaryName = "/usr/bin/gantry-runtime"
`)...)
	_, err = checkContainerd(bin, main, map[string][]byte{main: broken}, opts, names)
	if containerdMajor(t, bin) == "1" {
		if !errors.Is(err, ErrEngineRejects) || !strings.Contains(err.Error(), `default runtime "runc"`) || !strings.Contains(err.Error(), "is unchanged") {
			t.Errorf("containerd 1.x: a file without runc: err = %v", err)
		}
	} else if err != nil {
		t.Errorf("containerd 2.x keeps its built-in runc: err = %v", err)
	}

	fixed, _, err := Plan(Containerd, debian, gantryOpts)
	if err != nil {
		t.Fatal(err)
	}
	line, err := checkContainerd(bin, main, map[string][]byte{main: fixed}, opts, names)
	if err != nil || !strings.Contains(line, "checked by "+bin) || !strings.Contains(line, "default runc") {
		t.Errorf("configured Debian file: %q, %v", line, err)
	}

	// Something only containerd judges: a value of the wrong type.
	_, err = checkContainerd(bin, main, map[string][]byte{main: append([]byte("oom_score = \"high\"\n"), fixed...)}, opts, names)
	if !errors.Is(err, ErrEngineRejects) || !strings.Contains(err.Error(), "config dump") {
		t.Errorf("a file containerd cannot load: err = %v", err)
	}

	if containerdMajor(t, bin) == "1" {
		v3, _, err := Plan(Containerd, []byte("version = 3\n"), gantryOpts)
		if err != nil {
			t.Fatal(err)
		}
		_, err = checkContainerd(bin, main, map[string][]byte{main: v3}, opts, names)
		if !errors.Is(err, ErrEngineRejects) || !strings.Contains(err.Error(), "version 3") {
			t.Errorf("containerd 1.x and a version-3 file: err = %v", err)
		}
	}
}

// TestApplyDebianContainerd: Apply on Debian 12's packaged config.toml
// writes a file that containerd's own config dump reads with runc as the
// default runtime, says what checked it, and keeps the old file.
func TestApplyDebianContainerd(t *testing.T) {
	bin := needContainerd(t)
	path := filepath.Join(t.TempDir(), "config.toml")
	debian := readInput(t, "containerd-debian12.toml")
	if err := os.WriteFile(path, debian, 0o644); err != nil {
		t.Fatal(err)
	}
	_, changes, err := Apply(Containerd, path, gantryOpts, false)
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(changes, "\n")
	if !strings.Contains(joined, "checked by "+bin) || !strings.Contains(joined, "kept the old file as "+path+BackupSuffix) {
		t.Errorf("changes do not say what checked the file and where the old one is:\n%s", joined)
	}
	dump, err := exec.Command(bin, "--config", path, "config", "dump").Output()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(Containerd, dump)
	if err != nil {
		t.Fatal(err)
	}
	if rt, ok := got.Runtime("runc"); !ok || rt.Program != "runc" || (got.DefaultRuntime != "runc" && got.DefaultRuntime != "") {
		t.Errorf("containerd's view after configure: default %q, runtimes %+v", got.DefaultRuntime, got.Runtimes)
	}
	if b, _ := os.ReadFile(path + BackupSuffix); !bytes.Equal(b, debian) {
		t.Error("the backup is not the packaged file")
	}

	// --config-source=command starts from containerd's own dump.
	path2 := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path2, debian, 0o644); err != nil {
		t.Fatal(err)
	}
	cmdOpts := gantryOpts
	cmdOpts.Source = SourceCommand
	_, changes, err = Apply(Containerd, path2, cmdOpts, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(changes[0], "config dump") {
		t.Errorf("first change %q does not name the source", changes[0])
	}
	reg, _, err := ReadContainerd(path2)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := reg.Runtime("runc"); !ok {
		t.Errorf("command source: no runc in %+v", reg.Runtimes)
	}
	if rt, ok := reg.Runtime("nvidia"); !ok || rt.Program != "/usr/bin/gantry-runtime" {
		t.Errorf("command source: nvidia = %+v", rt)
	}
	// A second run with either source changes nothing.
	for _, o := range []Options{gantryOpts, cmdOpts} {
		if _, ch, err := Apply(Containerd, path2, o, false); err != nil || len(ch) != 0 {
			t.Errorf("second run (%s): %q %v", o.Source, ch, err)
		}
	}
}

// TestApplyRefusesWhatContainerdRejects: a file containerd cannot load is
// not replaced.
func TestApplyRefusesWhatContainerdRejects(t *testing.T) {
	needContainerd(t)
	path := filepath.Join(t.TempDir(), "config.toml")
	in := []byte("version = 2\noom_score = \"high\"\n")
	if err := os.WriteFile(path, in, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Apply(Containerd, path, gantryOpts, false); !errors.Is(err, ErrEngineRejects) || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v", err)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, in) {
		t.Error("the file changed")
	}
	if _, err := os.Stat(path + BackupSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Error("a refused run left a backup")
	}
	// Without the engine's check, Gantry's reader alone accepts it.
	o := gantryOpts
	o.SkipEngineCheck = true
	if _, ch, err := Apply(Containerd, path, o, true); err != nil || !strings.Contains(strings.Join(ch, "\n"), "not checked by containerd itself") {
		t.Errorf("skipped check: %q %v", ch, err)
	}
}

// TestStrictDocker: where dockerd has no --validate (20.10), the result is
// read as dockerd's loader judges runtimes; what it would refuse is
// refused before anything is written.
func TestStrictDocker(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{`{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}`, ""},
		{`{"runtimes": {"kata": {"runtimeType": "io.containerd.kata.v2"}}, "default-runtime": "kata"}`, ""},
		{`{"default-runtime": "runc"}`, ""},
		{``, ""},
		{`{"runtimes": {"runc": {"path": "/usr/bin/runc"}}}`, "reserves the name runc"},
		{`{"runtimes": {"nvidia": {}}}`, "runtimes.nvidia has no path"},
		{`{"runtimes": {"nvidia": {"path": "x", "runtimeArgs": "--debug"}}}`, "runtimes.nvidia"},
		{`{"runtimes": {"nvidia": {"path": "x"}}, "default-runtime": "gpu"}`, `default-runtime "gpu"`},
		{`{"runtimes": [}`, "invalid JSON"},
	} {
		err := strictDocker([]byte(tc.in))
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: err = %v, want %q", tc.in, err, tc.want)
		}
	}
	// Apply says which check ran.
	bin, err := exec.LookPath("dockerd")
	if err != nil {
		t.Log("dockerd not installed: the dockerd line is not checked")
		return
	}
	_, changes, err := Apply(Docker, filepath.Join(t.TempDir(), "daemon.json"), gantryOpts, true)
	if err != nil || !strings.Contains(strings.Join(changes, "\n"), bin) {
		t.Errorf("Apply with %s on PATH: %q, %v", bin, changes, err)
	}
}

// TestApplyCRIDisabled: a file that turns the CRI plugin off (as Docker
// CE's does, in version 1, which configure asks to migrate first);
// containerd 1.x then leaves the plugin's settings out of its dump. The
// file is configured (for a later enable) and said to be loaded, not
// refused for runtimes the dump cannot show.
func TestApplyCRIDisabled(t *testing.T) {
	bin := needContainerd(t)
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, changes, err := Apply(Containerd, path, gantryOpts, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(changes, "\n"), "checked by "+bin) || !strings.Contains(strings.Join(changes, "\n"), "CRI plugin is disabled") {
		t.Errorf("changes: %q", changes)
	}
}
