package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// gantry sim driver-root, without --gpus as a newcomer runs it, makes a
// root for the simulated GPUs it names (h100x8's), and the advice it
// prints is taken as printed: the command line, and the two lines for the
// configuration file. gantry info, the CDI spec and the root's own fake
// nvidia-smi then name the same GPU UUIDs as sim driver-root printed.
func TestSimDriverRootAdvice(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot build the fake driver root (make deps installs it)")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "driver")
	out, errOut, code := run("sim", "driver-root", root)
	if code != 0 {
		t.Fatalf("sim driver-root: exit %d: %s", code, errOut)
	}
	uuidRe := regexp.MustCompile(`GPU-[0-9a-f-]{36}`)
	want := uuidRe.FindAllString(out, -1)
	if len(want) != 8 {
		t.Fatalf("sim driver-root printed %d UUIDs, want h100x8's 8:\n%s", len(want), out)
	}
	// The fake nvidia-smi -L names the same GPUs (from the table it was
	// built with; -L lists only nodes it sees, so read the table).
	smi, err := os.ReadFile(filepath.Join(root, "usr/bin/nvidia-smi"))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range want {
		if !strings.Contains(string(smi), u) {
			t.Errorf("the root's nvidia-smi does not know %s", u)
		}
	}

	// The command line it advises.
	m := regexp.MustCompile(`To use it: gantry (.*)\n`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no command line advised:\n%s", out)
	}
	info, errOut, code := run(strings.Fields(m[1])...)
	if code != 0 {
		t.Fatalf("the advised gantry %s: exit %d: %s", m[1], code, errOut)
	}
	if got := uuidRe.FindAllString(info, -1); !slices.Equal(got, want) {
		t.Errorf("gantry %s names %v, sim driver-root %v", m[1], got, want)
	}

	// The configuration file lines it advises, as printed.
	var cfgLines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "  gpus = ") || strings.HasPrefix(l, "  driver-root = ") {
			cfgLines = append(cfgLines, strings.TrimSpace(l))
		}
	}
	if len(cfgLines) != 2 {
		t.Fatalf("advised configuration %q, want gpus and driver-root:\n%s", cfgLines, out)
	}
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(strings.Join(cfgLines, "\n")+"\n"+cacheTOML), 0o644); err != nil {
		t.Fatal(err)
	}
	info, errOut, code = run("--config", cfg, "info")
	if code != 0 {
		t.Fatalf("gantry info with the advised configuration: exit %d: %s", code, errOut)
	}
	if got := uuidRe.FindAllString(info, -1); !slices.Equal(got, want) {
		t.Errorf("gantry info with the advised configuration names %v, sim driver-root %v", got, want)
	}
	spec := filepath.Join(dir, "cdi", "nvidia.yaml")
	if _, errOut, code := run("--config", cfg, "cdi", "generate", "--output", spec); code != 0 {
		t.Fatalf("cdi generate with the advised configuration: exit %d: %s", code, errOut)
	}
	b, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range want {
		if !strings.Contains(string(b), "name: "+u) {
			t.Errorf("the CDI spec has no device %s", u)
		}
	}
	// With the configuration naming it, sim driver-root advises nothing more.
	if out, errOut, code := run("--config", cfg, "sim", "driver-root", root); code != 0 || strings.Contains(out, "To use it") {
		t.Errorf("sim driver-root again with the configuration: exit %d, %s%s", code, out, errOut)
	}
	// A profile that does not exist is an error, not a root of made-up GPUs.
	if _, errOut, code := run("--gpus", "sim:h100x9", "sim", "driver-root", filepath.Join(dir, "other")); code == 0 || !strings.Contains(errOut, "h100x9") {
		t.Errorf("sim driver-root for sim:h100x9: exit %d, %s", code, errOut)
	}
}

// The advice an error gives when there is no driver (simulate GPUs) is
// taken by the commands that print it: nvidia-ctk, which has no --gpus
// flag, through the configuration file; gantry through its flags too.
func TestSimulateAdviceAccepted(t *testing.T) {
	root := fakeRoot(t)
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	noDriver := filepath.Join(dir, "nodriver.toml")
	if err := os.WriteFile(noDriver, []byte("driver-root = \""+empty+"\"\n"+cacheTOML), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GANTRY_CONFIG", noDriver)
	var out, errb strings.Builder
	if code := NVIDIACTKMain([]string{"cdi", "generate", "--output", filepath.Join(dir, "a.yaml")}, &out, &errb); code == 0 || !strings.Contains(errb.String(), gpu.SimulateAdvice) {
		t.Fatalf("nvidia-ctk cdi generate without a driver: exit %d, %q; want the advice %q", code, errb.String(), gpu.SimulateAdvice)
	}
	if _, errOut, code := run("info"); code == 0 || !strings.Contains(errOut, gpu.SimulateAdvice) {
		t.Fatalf("gantry info without a driver: exit %d, %q", code, errOut)
	}
	// The configuration as advised (gpus), with the fake driver's root.
	sim := filepath.Join(dir, "sim.toml")
	if err := os.WriteFile(sim, []byte("gpus = \"sim:h100x8\"\ndriver-root = \""+root+"\"\n"+cacheTOML), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GANTRY_CONFIG", sim)
	out.Reset()
	errb.Reset()
	if code := NVIDIACTKMain([]string{"cdi", "generate", "--output", filepath.Join(dir, "b.yaml")}, &out, &errb); code != 0 {
		t.Errorf("nvidia-ctk cdi generate with gpus = \"sim:h100x8\" in the configuration: exit %d, %s", code, errb.String())
	}
	// The flag, for gantry.
	t.Setenv("GANTRY_CONFIG", noDriver)
	if _, errOut, code := run("--gpus", "sim:h100x8", "--driver-root", root, "info"); code != 0 {
		t.Errorf("gantry --gpus sim:h100x8 info: exit %d, %s", code, errOut)
	}
}
