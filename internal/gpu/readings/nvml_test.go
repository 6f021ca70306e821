//go:build cgo

package readings

import (
	"bufio"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	gpunvml "github.com/gantry-gpu/gantry/internal/gpu/nvml"
)

// TestNVMLReader runs on a GPU host: every GPU reads back with the memory
// total discovery saw and plausible values, and a CUDA process this test
// starts is listed with its PID, argv[0] and memory. Skipped without a driver.
//
// On a GPU host, from the repository root:
//
//	CGO_CFLAGS=-Wno-deprecated-declarations go test -c -o readings.test ./internal/gpu/readings
//	./readings.test -test.run 'NVML' -test.v
func TestNVMLReader(t *testing.T) {
	sys, err := gpunvml.Discover(gpunvml.Options{Light: true})
	if err != nil {
		t.Skipf("no NVIDIA driver here: %v", err)
	}
	r, closeNVML, err := NewNVML("")
	if err != nil {
		t.Fatal(err)
	}
	defer closeNVML()
	probe := startCUDAProbe(t)
	found := false
	for _, d := range sys.Devices {
		s, err := r.Read(d.UUID)
		if err != nil {
			t.Fatalf("GPU %d: %v", d.Index, err)
		}
		t.Logf("GPU %d %s: %+v", d.Index, d.Name, s)
		if uint64(s.MemoryTotalBytes)>>20 != d.MemoryMiB {
			t.Errorf("GPU %d: total %v bytes, discovery says %d MiB", d.Index, s.MemoryTotalBytes, d.MemoryMiB)
		}
		if !(s.TemperatureCelsius > 0 && s.TemperatureCelsius < 120) || !(s.PowerWatts > 0 && s.PowerWatts < 2000) ||
			s.MemoryUsedBytes > s.MemoryTotalBytes {
			t.Errorf("GPU %d: implausible sample %+v", d.Index, s)
		}
		// Data centre GPUs of the last generations report all of these.
		for name, v := range map[string]float64{
			"power limit": s.PowerLimitWatts, "SM clock": s.SMClockMHz, "memory clock": s.MemoryClockMHz,
			"max SM clock": s.MaxSMClockMHz, "max memory clock": s.MaxMemoryClockMHz,
			"BAR1 used": s.BAR1UsedBytes, "BAR1 total": s.BAR1TotalBytes,
			"PCIe RX": s.PCIeRXBytesPerSecond, "PCIe TX": s.PCIeTXBytesPerSecond,
		} {
			if math.IsNaN(v) || v < 0 {
				t.Errorf("GPU %d: %s %v", d.Index, name, v)
			}
		}
		if s.PowerLimitWatts < 50 || s.SMClockMHz > s.MaxSMClockMHz || s.MemoryClockMHz > s.MaxMemoryClockMHz ||
			s.BAR1UsedBytes > s.BAR1TotalBytes {
			t.Errorf("GPU %d: limits: %+v", d.Index, s)
		}
		for name, v := range map[string]float64{"utilisation": s.UtilizationPercent, "memory utilisation": s.MemoryUtilizationPercent,
			"encoder": s.EncoderUtilizationPercent, "decoder": s.DecoderUtilizationPercent} {
			if d.MIGEnabled && !math.IsNaN(v) || !d.MIGEnabled && !(v >= 0 && v <= 100) {
				t.Errorf("GPU %d (MIG %v): %s %v", d.Index, d.MIGEnabled, name, v)
			}
		}
		// ECC counts are whole numbers where known; which locations a GPU
		// counts varies, so unknown is allowed (and logged above).
		for _, v := range []float64{s.ECCErrorsL1Cache, s.ECCErrorsL2Cache, s.ECCErrorsDeviceMemory} {
			if !math.IsNaN(v) && (v < 0 || v != math.Trunc(v)) {
				t.Errorf("GPU %d: ECC count %v", d.Index, v)
			}
		}
		for _, p := range s.Processes {
			if probe == nil || p.PID != uint32(probe.Process.Pid) {
				continue
			}
			found = true
			if p.Name != probeArgv0 {
				t.Errorf("GPU %d: probe process named %q, want %q", d.Index, p.Name, probeArgv0)
			}
			if !(p.UsedMemoryBytes >= probeBytes) {
				t.Errorf("GPU %d: probe process holds %v bytes, it allocated %d", d.Index, p.UsedMemoryBytes, probeBytes)
			}
		}
	}
	if probe != nil && !found {
		t.Errorf("the CUDA probe (PID %d) is on no GPU's process list", probe.Process.Pid)
	}
	if _, err := r.Read("GPU-00000000-0000-0000-0000-000000000000"); err == nil {
		t.Error("unknown UUID read without error")
	}
}

const (
	probeArgv0 = "gantry-cuda-probe"
	probeBytes = 256 << 20
)

// probeC makes a CUDA context on device 0 through the driver API (dlopen,
// so no CUDA toolkit is needed), allocates probeBytes, says "ready" and
// holds them until stdin closes.
const probeC = `#include <dlfcn.h>
#include <stdio.h>
typedef int (*fn_init)(unsigned);
typedef int (*fn_get)(int *, int);
typedef int (*fn_retain)(void **, int);
typedef int (*fn_set)(void *);
typedef int (*fn_alloc)(unsigned long long *, size_t);
int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
	fn_init init = (fn_init)dlsym(h, "cuInit");
	fn_get get = (fn_get)dlsym(h, "cuDeviceGet");
	fn_retain retain = (fn_retain)dlsym(h, "cuDevicePrimaryCtxRetain");
	fn_set set = (fn_set)dlsym(h, "cuCtxSetCurrent");
	fn_alloc alloc = (fn_alloc)dlsym(h, "cuMemAlloc_v2");
	if (!init || !get || !retain || !set || !alloc) { printf("dlsym failed\n"); return 1; }
	int dev, r; void *ctx; unsigned long long p;
	if ((r = init(0)) || (r = get(&dev, 0)) || (r = retain(&ctx, dev)) || (r = set(ctx)) || (r = alloc(&p, SIZE))) {
		printf("CUDA error %d\n", r); return 1;
	}
	printf("ready\n"); fflush(stdout);
	getchar();
	return 0;
}
`

// startCUDAProbe starts the probe; nil (with the reason logged) when it
// cannot be built or cannot get a context (no gcc, MIG-enabled device 0).
func startCUDAProbe(t *testing.T) *exec.Cmd {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Log("no gcc: the process list is not checked against a known process")
		return nil
	}
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "probe.c"), filepath.Join(dir, "probe")
	if err := os.WriteFile(src, []byte(probeC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-DSIZE=268435456", "-o", bin, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("building the CUDA probe: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Args[0] = probeArgv0
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
	if strings.TrimSpace(line) != "ready" {
		t.Logf("the CUDA probe did not start (%q): the process list is not checked against a known process", line)
		return nil
	}
	return cmd
}

// readDevice turns each value NVML does not support into NaN on its own,
// keeps the others, and never fails the GPU as a whole. Which values a real
// GPU lacks depends on the part, so this one case is driven through
// go-nvml's mock of its Device interface.
func TestReadDeviceNotSupported(t *testing.T) {
	ns := nvml.ERROR_NOT_SUPPORTED
	d := &mock.Device{
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, ns },
		GetEncoderUtilizationFunc: func() (uint32, uint32, nvml.Return) {
			return 0, 0, ns
		},
		GetDecoderUtilizationFunc: func() (uint32, uint32, nvml.Return) { return 12, 167000, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 80 << 30, Used: 1 << 30}, nvml.SUCCESS
		},
		GetTemperatureFunc:          func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST },
		GetPowerUsageFunc:           func() (uint32, nvml.Return) { return 123456, nvml.SUCCESS },
		GetPowerManagementLimitFunc: func() (uint32, nvml.Return) { return 0, ns },
		GetClockInfoFunc: func(c nvml.ClockType) (uint32, nvml.Return) {
			return map[nvml.ClockType]uint32{nvml.CLOCK_SM: 1755}[c], nvml.SUCCESS
		},
		GetMaxClockInfoFunc:   func(nvml.ClockType) (uint32, nvml.Return) { return 0, ns },
		GetBAR1MemoryInfoFunc: func() (nvml.BAR1Memory, nvml.Return) { return nvml.BAR1Memory{}, ns },
		GetPcieThroughputFunc: func(c nvml.PcieUtilCounter) (uint32, nvml.Return) {
			if c == nvml.PCIE_UTIL_TX_BYTES {
				return 0, ns
			}
			return 4321, nvml.SUCCESS
		},
		GetMemoryErrorCounterFunc: func(_ nvml.MemoryErrorType, _ nvml.EccCounterType, l nvml.MemoryLocation) (uint64, nvml.Return) {
			if l == nvml.MEMORY_LOCATION_DEVICE_MEMORY {
				return 0, nvml.SUCCESS
			}
			return 0, ns
		},
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return []nvml.ProcessInfo{{Pid: uint32(os.Getpid()), UsedGpuMemory: 512 << 20}, {Pid: math.MaxUint32, UsedGpuMemory: math.MaxUint64}}, nvml.SUCCESS
		},
		GetGraphicsRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return []nvml.ProcessInfo{{Pid: uint32(os.Getpid()), UsedGpuMemory: 512 << 20}}, nvml.SUCCESS
		},
	}
	s := readDevice(d, "/proc")
	nan := math.NaN()
	want := Unknown()
	want.DecoderUtilizationPercent = 12
	want.MemoryTotalBytes, want.MemoryUsedBytes = 80<<30, 1<<30
	want.PowerWatts = 123.456
	want.SMClockMHz, want.MemoryClockMHz = 1755, 0 // a reported 0 stays 0
	want.PCIeRXBytesPerSecond = 4321000
	want.ECCErrorsDeviceMemory = 0
	self, _ := os.ReadFile("/proc/self/cmdline")
	argv0, _, _ := strings.Cut(string(self), "\x00")
	want.Processes = []Process{{PID: uint32(os.Getpid()), Name: argv0, UsedMemoryBytes: 512 << 20}, {PID: math.MaxUint32, Name: "", UsedMemoryBytes: nan}}
	if !sameSample(s, want) {
		t.Errorf("got  %+v\nwant %+v", s, want)
	}
}
