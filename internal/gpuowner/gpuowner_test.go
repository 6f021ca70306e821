package gpuowner

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var (
	g0 = GPU{UUID: "GPU-0000", Index: "0"}
	g1 = GPU{UUID: "GPU-1111", Index: "1"}
	g2 = GPU{UUID: "GPU-2222", Index: "2"}
	g3 = GPU{UUID: "GPU-3333", Index: "3"}
)

// The second plugin to start with an overlapping GPU is refused, naming the
// GPUs, the other plugin and both plugins' settings; disjoint GPUs start;
// the first keeps its record.
func TestRegisterRefusesOverlap(t *testing.T) {
	dir := t.TempDir()
	dra, err := Register(dir, Record{Owner: DRAPlugin, GPUs: []GPU{g2, g3}, Select: "--devices (GANTRY_DRA_DEVICES)"})
	if err != nil {
		t.Fatal(err)
	}
	defer dra.Release()
	_, err = Register(dir, Record{Owner: DevicePlugin, GPUs: []GPU{g0, g1, g2, g3}, Select: "gantry.devices (GANTRY_DEVICES, --devices)"})
	var ce *ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) {
		t.Fatalf("overlap: got %v, want a ConflictError", err)
	}
	for _, want := range []string{"GPU-2222 (index 2), GPU-3333 (index 3)", "gantry-dra-plugin (pid ", filepath.Join(dir, "gantry-dra-plugin.json"),
		"gantry-device-plugin will not offer them", "(gantry-device-plugin: gantry.devices (GANTRY_DEVICES, --devices); gantry-dra-plugin: --devices (GANTRY_DRA_DEVICES))"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, DevicePlugin+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused plugin left a record: %v", err)
	}
	dp, err := Register(dir, Record{Owner: DevicePlugin, GPUs: []GPU{g0, g1}})
	if err != nil {
		t.Fatalf("disjoint GPUs refused: %v", err)
	}
	live, err := Live(dir)
	if err != nil || len(live) != 2 {
		t.Fatalf("live owners: %v, %v; want both", live, err)
	}
	if err := dp.Release(); err != nil {
		t.Fatal(err)
	}
	if live, _ := Live(dir); len(live) != 1 || live[0].Owner != DRAPlugin {
		t.Errorf("after release: %+v, want the DRA plugin only", live)
	}
}

// A record whose writer ended without releasing it (killed) is stale: its
// lock went with the process, and it does not block anyone.
func TestStaleRecordIgnored(t *testing.T) {
	if os.Getenv("GPUOWNER_HELPER_DIR") != "" {
		if _, err := Register(os.Getenv("GPUOWNER_HELPER_DIR"), Record{Owner: DRAPlugin, GPUs: []GPU{g1}}); err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString("registered\n")
		time.Sleep(time.Hour)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestStaleRecordIgnored$")
	cmd.Env = append(os.Environ(), "GPUOWNER_HELPER_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := out.Read(buf)
	if !strings.Contains(string(buf[:n]), "registered") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper: %q", buf[:n])
	}
	// Live in another process: refused.
	if _, err := Register(dir, Record{Owner: DevicePlugin, GPUs: []GPU{g1}}); !errors.Is(err, ErrConflict) {
		t.Errorf("while the other process runs: %v, want a conflict", err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := os.Stat(filepath.Join(dir, DRAPlugin+".json")); err != nil {
		t.Fatalf("the killed process's record should still be there: %v", err)
	}
	reg, err := Register(dir, Record{Owner: DevicePlugin, GPUs: []GPU{g1}})
	if err != nil {
		t.Fatalf("a killed owner's record blocked: %v", err)
	}
	reg.Release()
	// And the same owner may start again over its own stale record.
	reg, err = Register(dir, Record{Owner: DRAPlugin, GPUs: []GPU{g1}})
	if err != nil {
		t.Fatalf("restart over its own stale record: %v", err)
	}
	reg.Release()
}

// Two live instances of one owner are refused even with disjoint GPUs, and
// owners found elsewhere (extra) count like live records.
func TestSameOwnerAndExtra(t *testing.T) {
	dir := t.TempDir()
	a, err := Register(dir, Record{Owner: DevicePlugin, GPUs: []GPU{g0}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	if _, err := Register(dir, Record{Owner: DevicePlugin, GPUs: []GPU{g1}}); err == nil || !strings.Contains(err.Error(), "another gantry-device-plugin already runs") {
		t.Errorf("second instance: %v", err)
	}
	ext := Record{Owner: "the device plugin of resource nvidia.com/gpu", GPUs: []GPU{g3}, Where: "registered with the kubelet"}
	if _, err := Register(dir, Record{Owner: DRAPlugin, GPUs: []GPU{g2, g3}}, ext); !errors.Is(err, ErrConflict) ||
		!strings.Contains(err.Error(), "GPU GPU-3333 (index 3) already offered by the device plugin of resource nvidia.com/gpu (registered with the kubelet)") {
		t.Errorf("extra owner: %v", err)
	}
}

func TestOverlapMIG(t *testing.T) {
	whole := GPU{UUID: "GPU-a"}
	m1 := GPU{UUID: "GPU-a", MIG: "MIG-1"}
	m2 := GPU{UUID: "GPU-a", MIG: "MIG-2"}
	for _, c := range []struct {
		a, b []GPU
		n    int
	}{
		{[]GPU{whole}, []GPU{m1}, 1},
		{[]GPU{m1}, []GPU{whole}, 1},
		{[]GPU{m1}, []GPU{m2}, 0},
		{[]GPU{m1}, []GPU{m1}, 1},
		{[]GPU{whole}, []GPU{{UUID: "GPU-b"}}, 0},
	} {
		if got := Overlap(c.a, c.b); len(got) != c.n {
			t.Errorf("Overlap(%v, %v) = %v, want %d", c.a, c.b, got, c.n)
		}
	}
}
