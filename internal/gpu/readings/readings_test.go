package readings

import (
	"bufio"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

// Every built-in profile reads back plausible, repeatable values: within the
// model's limits, busy GPUs with processes and idle ones without, and
// unknown (NaN) exactly where NVML has nothing on such a GPU.
func TestSimReadings(t *testing.T) {
	var idle, busy, withECC int
	for _, profile := range sim.Profiles() {
		sys, err := sim.Load(profile)
		if err != nil {
			t.Fatal(err)
		}
		r := NewSim(sys)
		for _, d := range sys.Devices {
			s, err := r.Read(d.UUID)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := r.Read(d.UUID)
			if !sameSample(s, again) {
				t.Errorf("%s GPU %d: two reads differ:\n%+v\n%+v", profile, d.Index, s, again)
			}
			name := profile + " GPU " + strconv.Itoa(d.Index)
			known := map[string]float64{
				"MemoryUsedBytes": s.MemoryUsedBytes, "MemoryTotalBytes": s.MemoryTotalBytes,
				"TemperatureCelsius": s.TemperatureCelsius, "PowerWatts": s.PowerWatts, "PowerLimitWatts": s.PowerLimitWatts,
				"SMClockMHz": s.SMClockMHz, "MemoryClockMHz": s.MemoryClockMHz, "MaxSMClockMHz": s.MaxSMClockMHz,
				"MaxMemoryClockMHz": s.MaxMemoryClockMHz, "BAR1UsedBytes": s.BAR1UsedBytes, "BAR1TotalBytes": s.BAR1TotalBytes,
				"PCIeRXBytesPerSecond": s.PCIeRXBytesPerSecond, "PCIeTXBytesPerSecond": s.PCIeTXBytesPerSecond,
			}
			perGPU := map[string]float64{
				"UtilizationPercent": s.UtilizationPercent, "MemoryUtilizationPercent": s.MemoryUtilizationPercent,
				"EncoderUtilizationPercent": s.EncoderUtilizationPercent, "DecoderUtilizationPercent": s.DecoderUtilizationPercent,
				"ECCErrorsDeviceMemory": s.ECCErrorsDeviceMemory,
			}
			// L1 and L2 counts as NVML has them: none on an H100 or later.
			if major, _, _ := strings.Cut(d.ComputeCapability, "."); len(major) == 1 && major < "9" {
				perGPU["ECCErrorsL1Cache"], perGPU["ECCErrorsL2Cache"] = s.ECCErrorsL1Cache, s.ECCErrorsL2Cache
			} else if !math.IsNaN(s.ECCErrorsL1Cache) || !math.IsNaN(s.ECCErrorsL2Cache) {
				t.Errorf("%s: L1/L2 ECC counts %v/%v, want unknown", name, s.ECCErrorsL1Cache, s.ECCErrorsL2Cache)
			}
			for k, v := range perGPU {
				if d.MIGEnabled && !math.IsNaN(v) {
					t.Errorf("%s (MIG enabled): %s = %v, want unknown", name, k, v)
				}
				if !d.MIGEnabled {
					known[k] = v
				}
			}
			for k, v := range known {
				if math.IsNaN(v) || v < 0 || v != math.Trunc(v) {
					t.Errorf("%s: %s = %v, want a whole number >= 0", name, k, v)
				}
			}
			if s.MemoryTotalBytes != float64(d.MemoryMiB<<20) || s.MemoryUsedBytes > s.MemoryTotalBytes ||
				s.PowerWatts >= s.PowerLimitWatts || s.SMClockMHz > s.MaxSMClockMHz || s.MemoryClockMHz > s.MaxMemoryClockMHz ||
				s.BAR1UsedBytes > s.BAR1TotalBytes || s.TemperatureCelsius < 20 || s.TemperatureCelsius > 90 {
				t.Errorf("%s: implausible %+v", name, s)
			}
			for _, v := range []float64{s.UtilizationPercent, s.MemoryUtilizationPercent, s.EncoderUtilizationPercent, s.DecoderUtilizationPercent} {
				if v > 100 {
					t.Errorf("%s: utilisation %v%%", name, v)
				}
			}
			var procMem float64
			pids := map[uint32]bool{}
			for _, p := range s.Processes {
				if p.PID == 0 || p.Name == "" || !(p.UsedMemoryBytes > 0) || pids[p.PID] {
					t.Errorf("%s: process %+v", name, p)
				}
				pids[p.PID] = true
				procMem += p.UsedMemoryBytes
			}
			if procMem >= s.MemoryUsedBytes {
				t.Errorf("%s: processes hold %v bytes, the GPU has %v in use", name, procMem, s.MemoryUsedBytes)
			}
			if len(s.Processes) == 0 {
				idle++
				if !d.MIGEnabled && (s.UtilizationPercent != 0 || s.EncoderUtilizationPercent != 0 || s.SMClockMHz >= s.MaxSMClockMHz/2) {
					t.Errorf("%s: no processes but busy: %+v", name, s)
				}
			} else {
				busy++
			}
			if s.ECCErrorsDeviceMemory > 0 {
				withECC++
			}
		}
		if _, err := r.Read("GPU-00000000-0000-0000-0000-000000000000"); err == nil {
			t.Errorf("%s: unknown UUID read without error", profile)
		}
	}
	// The profiles together must show both cases, so that the API tests on
	// them see both too.
	if idle == 0 || busy == 0 || withECC == 0 {
		t.Errorf("%d idle GPUs, %d busy, %d with ECC errors: the simulation should have some of each", idle, busy, withECC)
	}
}

func sameSample(a, b Sample) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	for i := range va.NumField() {
		if x, ok := va.Field(i).Interface().(float64); ok {
			y := vb.Field(i).Float()
			if x != y && !(math.IsNaN(x) && math.IsNaN(y)) {
				return false
			}
		}
	}
	if len(a.Processes) != len(b.Processes) {
		return false
	}
	for i, p := range a.Processes {
		q := b.Processes[i]
		if p.PID != q.PID || p.Name != q.Name || p.UsedMemoryBytes != q.UsedMemoryBytes && !(math.IsNaN(p.UsedMemoryBytes) && math.IsNaN(q.UsedMemoryBytes)) {
			return false
		}
	}
	return true
}

// ProcessName against real processes: a shell with an argv[0] of its own,
// the same shell as a zombie (its cmdline is empty, its comm stays), and a
// PID that no process has.
func TestProcessName(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	cmd := exec.Command(sh, "-c", "echo ready; read x")
	cmd.Args[0] = "gantry-test-argv0"
	// "ready" comes once the shell runs, so its exec is complete and its
	// cmdline final.
	stdin, line := startReady(t, cmd)
	if line != "ready" {
		t.Fatalf("the shell said %q", line)
	}
	pid := uint32(cmd.Process.Pid)
	if got := ProcessName("/proc", pid); got != "gantry-test-argv0" {
		t.Errorf("running: %q, want its argv[0] gantry-test-argv0", got)
	}
	stdin.Close() // the shell's read ends, and it exits
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, int(pid), &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(int(pid)), "comm"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ProcessName("/proc", pid), strings.TrimSpace(string(comm)); got != want || want == "" {
		t.Errorf("zombie: %q, want its comm %q", got, want)
	}
	if got := ProcessName("/proc", math.MaxUint32); got != "" {
		t.Errorf("no such PID: %q", got)
	}
	if got := ProcessName(t.TempDir(), uint32(os.Getpid())); got != "" {
		t.Errorf("under an empty proc: %q", got)
	}
}

// The simulated GPUs of the built-in profiles have their models' data
// sheet values; a model the simulator does not know has none.
func TestSimProperties(t *testing.T) {
	want := map[string]Properties{ // cores, PCIe generation and lanes, memory bus bits
		"NVIDIA H100 80GB HBM3": {Cores: 16896, PCIeMaxGeneration: 5, PCIeMaxWidth: 16, MemoryBusWidthBits: 5120},
		"NVIDIA H200":           {Cores: 16896, PCIeMaxGeneration: 5, PCIeMaxWidth: 16, MemoryBusWidthBits: 6016},
		"NVIDIA A100-SXM4-40GB": {Cores: 6912, PCIeMaxGeneration: 4, PCIeMaxWidth: 16, MemoryBusWidthBits: 5120},
		"NVIDIA L40S":           {Cores: 18176, PCIeMaxGeneration: 4, PCIeMaxWidth: 16, MemoryBusWidthBits: 384},
	}
	for _, profile := range sim.Profiles() {
		sys, err := sim.Load(profile)
		if err != nil {
			t.Fatal(err)
		}
		r := NewSim(sys).(simReader)
		for _, d := range sys.Devices {
			p, err := r.Properties(d.UUID)
			if err != nil {
				t.Fatal(err)
			}
			w, ok := want[d.Name]
			if !ok {
				t.Fatalf("%s: the test knows no model %q", profile, d.Name)
			}
			if p.ECCEnabled == nil || !*p.ECCEnabled {
				t.Errorf("%s GPU %d: ECC %v, want enabled", profile, d.Index, p.ECCEnabled)
			}
			p.ECCEnabled = nil
			if p != w {
				t.Errorf("%s GPU %d: %+v, want %+v", profile, d.Index, p, w)
			}
		}
		if _, err := r.Properties("GPU-00000000-0000-0000-0000-000000000000"); err == nil {
			t.Errorf("%s: unknown UUID without error", profile)
		}
	}
	sys, err := sim.Parse([]byte(`{driverVersion: "535.104.05", cudaDriverVersion: "12.2", devices: [{name: "Tesla T4", memoryMiB: 15360, computeCapability: "7.5"}]}`), "t4")
	if err != nil {
		t.Fatal(err)
	}
	if p, err := NewSim(sys).(simReader).Properties(sys.Devices[0].UUID); err != nil || p != (Properties{}) {
		t.Errorf("unknown model: %+v %v, want all unknown", p, err)
	}
}

// Simulated peers meet where a real host of the profile's shape has them
// meet, the same seen from either side; MIG-enabled GPUs have no peer access.
func TestSimPeer(t *testing.T) {
	sys, err := sim.Load("l40sx8")
	if err != nil {
		t.Fatal(err)
	}
	r := NewSim(sys).(simReader)
	for i, a := range sys.Devices {
		for j, b := range sys.Devices {
			if i == j {
				if _, err := r.Peer(a.UUID, b.UUID); err == nil {
					t.Errorf("GPU %d with itself: no error", i)
				}
				continue
			}
			want := PCIePathCrossNUMANode // two sockets,
			if i/4 == j/4 {
				want = PCIePathSameNUMANode // two switches per socket,
			}
			if i/2 == j/2 {
				want = PCIePathSingleSwitch // two GPUs per switch
			}
			p, err := r.Peer(a.UUID, b.UUID)
			if err != nil || p.Path != want || p.P2P == nil || !*p.P2P {
				t.Errorf("GPUs %d, %d: %+v %v, want path %d with peer access", i, j, p, err, want)
			}
		}
	}
	mig, err := sim.Load("a100x2-mig")
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewSim(mig).(simReader).Peer(mig.Devices[0].UUID, mig.Devices[1].UUID)
	if err != nil || p.P2P == nil || *p.P2P || p.Path != PCIePathSingleSwitch {
		t.Errorf("MIG-enabled A100s: %+v %v, want no peer access behind one switch", p, err)
	}
	if _, err := r.Peer(sys.Devices[0].UUID, "GPU-00000000-0000-0000-0000-000000000000"); err == nil {
		t.Error("unknown peer without error")
	}
}

// startReady starts cmd with pipes for stdin and stdout and returns its
// stdin and the first line it prints (trimmed); closing stdin and waiting
// for cmd are left to the test's cleanup.
func startReady(t *testing.T, cmd *exec.Cmd) (io.WriteCloser, string) {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	return stdin, strings.TrimSpace(line)
}
