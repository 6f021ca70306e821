package nvcli

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// run calls Main and returns its exit code, stdout and stderr.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

var (
	driverOnce sync.Once
	driverRes  *fakedriver.Result
	driverErr  error
	driverDir  string
)

// simHost points GANTRY_CONFIG at a simulated 8x H100 host whose driver root
// is a fake driver built once per test binary (with 32-bit libraries).
func simHost(t *testing.T) *fakedriver.Result {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("skipping: gcc not installed (the fake driver's libraries are built with it)")
	}
	driverOnce.Do(func() {
		driverDir, driverErr = os.MkdirTemp("", "nvcli-driver-")
		if driverErr != nil {
			return
		}
		// World-readable: the LXC test reads it from a user namespace.
		os.Chmod(driverDir, 0o755)
		driverRes, driverErr = fakedriver.Build(filepath.Join(driverDir, "root"), fakedriver.Options{
			Version:     "580.159.04",
			GPUs:        8,
			DeviceNodes: os.Geteuid() == 0,
			Compat32:    true,
		})
	})
	if driverErr != nil {
		t.Fatalf("building the fake driver: %v", driverErr)
	}
	cfg := filepath.Join(driverDir, "config.toml")
	// The default driver layout is the tree: its trees here, not on the host.
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("gpus = \"sim:h100x8\"\ndriver-root = %q\n[runtime]\ncache-dir = %q\ndriver-tree-dir = %q\n", driverRes.Root, filepath.Join(driverDir, "cache"), filepath.Join(driverDir, "trees"))), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GANTRY_CONFIG", cfg)
	return driverRes
}

func TestMain(m *testing.M) {
	code := m.Run()
	if driverDir != "" {
		os.RemoveAll(driverDir)
	}
	os.Exit(code)
}

// The first lines and the first device block, exactly: the layout NVIDIA's
// CLI prints (labels padded to 15 columns, lower-case bus location).
const wantInfoHead = `NVRM version:   580.159.04
CUDA version:   13.0

Device Index:   0
Device Minor:   0
Model:          NVIDIA H100 80GB HBM3
Brand:          nvidia
GPU UUID:       GPU-4f91bcb3-3e48-9102-8e22-ab4a3e0c4bce
Bus Location:   00000000:1b:00.0
Architecture:   9.0

Device Index:   1
`

func TestInfo(t *testing.T) {
	simHost(t)
	code, out, errs := run(t, "info")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.HasPrefix(out, wantInfoHead) {
		t.Fatalf("info output:\n%s\nwant it to start with:\n%s", out, wantInfoHead)
	}
	if n := strings.Count(out, "Device Index:"); n != 8 {
		t.Errorf("%d devices listed, want 8", n)
	}
	if !strings.Contains(out, "\nDevice Index:   7\nDevice Minor:   7\n") {
		t.Errorf("last device missing:\n%s", out)
	}

	code, out, _ = run(t, "info", "--csv")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) != 12 {
		t.Fatalf("csv: exit %d, %d lines:\n%s", code, len(lines), out)
	}
	want := []string{
		"NVRM version,CUDA version",
		"580.159.04,13.0",
		"",
		"Device Index,Device Minor,Model,Brand,GPU UUID,Bus Location,Architecture",
		"0,0,NVIDIA H100 80GB HBM3,nvidia,GPU-4f91bcb3-3e48-9102-8e22-ab4a3e0c4bce,00000000:1b:00.0,9.0",
	}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("csv line %d: %q, want %q", i, lines[i], w)
		}
	}
}

func TestBrandAndBus(t *testing.T) {
	for in, want := range map[string]string{"tesla": "Tesla", "geforce": "GeForce", "titan": "TITAN", "": "Unknown", "unknown": "Unknown", "nvidiartx": "nvidiartx"} {
		if got := brandName(in); got != want {
			t.Errorf("brandName(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{"00000000:1B:00.0": "00000000:1b:00.0", "0000:AF:1f.3": "00000000:af:1f.3", "junk": "junk"} {
		if got := busLocation(in); got != want {
			t.Errorf("busLocation(%q) = %q, want %q", in, got, want)
		}
	}
}

// lines runs `list args...` and returns its output lines.
func listLines(t *testing.T, args ...string) []string {
	t.Helper()
	code, out, errs := run(t, append([]string{"list"}, args...)...)
	if code != 0 {
		t.Fatalf("list %q: exit %d: %s", args, code, errs)
	}
	return strings.Split(strings.TrimSuffix(out, "\n"), "\n")
}

func index(lines []string, s string) int {
	for i, l := range lines {
		if l == s {
			return i
		}
	}
	return -1
}

func TestList(t *testing.T) {
	fd := simHost(t)
	root := fd.Root
	lib := root + "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"
	lib32 := root + "/usr/lib/i386-linux-gnu/libcuda.so.580.159.04"
	smi := root + "/usr/bin/nvidia-smi"
	sock := root + "/run/nvidia-persistenced/socket"
	ctl := root + "/dev/nvidiactl"
	gpu1 := root + "/dev/nvidia1"

	everything := listLines(t)
	for _, p := range []string{ctl, root + "/dev/nvidia0", root + "/dev/nvidia7", smi, lib, lib32, sock} {
		if index(everything, p) < 0 {
			t.Errorf("list without options lacks %s:\n%s", p, strings.Join(everything, "\n"))
		}
	}
	// NVIDIA's order: devices, binaries, libraries (64-bit, then 32-bit), IPCs, firmware.
	order := []string{ctl, gpu1, smi, lib, lib32, sock}
	for i := 1; i < len(order); i++ {
		if index(everything, order[i-1]) > index(everything, order[i]) {
			t.Errorf("%s listed after %s", order[i-1], order[i])
		}
	}
	var firmware int
	for _, l := range everything {
		if strings.Contains(l, "/firmware/nvidia/580.159.04/") {
			firmware++
		}
		if !strings.HasPrefix(l, root+"/") {
			t.Errorf("%s is not a host path under the driver root", l)
		}
	}
	if firmware == 0 {
		t.Error("no firmware listed")
	}

	for _, tc := range []struct {
		args      []string
		has, lack []string
	}{
		{args: []string{"--device=1"}, has: []string{ctl, gpu1}, lack: []string{root + "/dev/nvidia0", smi, lib}},
		{args: []string{"-d", "GPU-cea9af79-35b9-d567-2417-39059f1b40e7"}, has: []string{gpu1}, lack: []string{root + "/dev/nvidia0"}},
		{args: []string{"--binaries"}, has: []string{smi}, lack: []string{ctl, lib}},
		{args: []string{"--libraries"}, has: []string{lib}, lack: []string{lib32, smi}},
		{args: []string{"--libraries", "--compat32"}, has: []string{lib, lib32}},
		{args: []string{"--ipcs"}, has: []string{sock}, lack: []string{lib}},
		{args: []string{"--ipcs", "--no-persistenced"}, lack: []string{sock}},
	} {
		got := listLines(t, tc.args...)
		for _, p := range tc.has {
			if index(got, p) < 0 {
				t.Errorf("list %q lacks %s:\n%s", tc.args, p, strings.Join(got, "\n"))
			}
		}
		for _, p := range tc.lack {
			if index(got, p) >= 0 {
				t.Errorf("list %q has %s", tc.args, p)
			}
		}
	}
	if fw := listLines(t, "--firmwares"); len(fw) != firmware {
		t.Errorf("--firmwares lists %d files, the full list %d", len(fw), firmware)
	}
	if fd.RealDeviceNodes {
		got := listLines(t, "--mig-config=all", "--mig-monitor=all")
		if index(got, root+"/dev/nvidia-caps/nvidia-cap1") < 0 || index(got, root+"/dev/nvidia-caps/nvidia-cap2") < 0 {
			t.Errorf("MIG config/monitor nodes not listed: %q", got)
		}
	}
}

func TestMainErrors(t *testing.T) {
	simHost(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{args: nil, want: "missing command"},
		{args: []string{"--bogus", "info"}, want: "nvidia-container-cli: unknown option --bogus (see nvidia-container-cli --help)"},
		{args: []string{"frobnicate"}, want: `unknown command "frobnicate"`},
		{args: []string{"info", "--json"}, want: "nvidia-container-cli info: unknown option --json"},
		{args: []string{"list", "--device=42"}, want: `unknown GPU device "42"`},
		{args: []string{"configure", "--device=0", "--require=cuda>=99.0", "/nonexistent"}, want: `requirements not met on this host: --require "cuda>=99.0"`},
		{args: []string{"configure", "--device=8", "/nonexistent"}, want: `--device=8: unknown GPU device "8"`},
		{args: []string{"configure", "--frob", "/r"}, want: "nvidia-container-cli configure: unknown option --frob"},
		{args: []string{"--ldcache=/elsewhere/ld.so.cache", "list"}, want: "--ldcache=/elsewhere/ld.so.cache: Gantry reads the cache of the driver root"},
		{args: []string{"--debug=/nonexistent/dir/log", "info"}, want: "--debug=/nonexistent/dir/log"},
	} {
		code, out, errs := run(t, tc.args...)
		if code != 1 {
			t.Errorf("%q: exit %d, want 1 (stdout %q)", tc.args, code, out)
		}
		if !strings.Contains(errs, tc.want) {
			t.Errorf("%q: stderr %q, want %q", tc.args, errs, tc.want)
		}
		if strings.Count(errs, "\n") != 1 {
			t.Errorf("%q: stderr is not one line: %q", tc.args, errs)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	code, out, _ := run(t, "--help")
	if code != 0 || !strings.Contains(out, "configure") || !strings.Contains(out, "--load-kmods") {
		t.Errorf("--help: exit %d:\n%s", code, out)
	}
	code, out, _ = run(t, "configure", "--help")
	if code != 0 || !strings.Contains(out, "--no-cgroups") || !strings.Contains(out, "No ldconfig runs") {
		t.Errorf("configure --help: exit %d:\n%s", code, out)
	}
	code, out, _ = run(t, "--version")
	if code != 0 || !strings.HasPrefix(out, "cli-version: "+CLIVersion+"\n") {
		t.Errorf("--version: exit %d: %q", code, out)
	}
}

func TestDebugLog(t *testing.T) {
	simHost(t)
	log := filepath.Join(t.TempDir(), "nvidia.log")
	if code, _, errs := run(t, "--debug="+log, "info"); code != 0 {
		t.Fatal(errs)
	}
	b, err := os.ReadFile(log)
	if err != nil || !strings.Contains(string(b), "configuration") {
		t.Fatalf("debug log %q, %v", b, err)
	}
}
