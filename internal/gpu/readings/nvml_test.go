//go:build cgo

package readings

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gantry-gpu/gantry/internal/gpu"
	gpunvml "github.com/gantry-gpu/gantry/internal/gpu/nvml"
	"github.com/gantry-gpu/gantry/internal/smitest"
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
	sys, r := openNVML(t)
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
	if _, line := startReady(t, cmd); line != "ready" {
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
	s := readDevice(d, "/proc", false)
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

// readProperties and readPeer: a function the loaded library lacks is not
// called (go-nvml's mock panics when a method without a function is
// called, as a real missing symbol would crash), one NVML does not support
// leaves its value unknown, and each NVML answer maps to ours.
func TestReadPropertiesAndPeer(t *testing.T) {
	ns := nvml.ERROR_NOT_SUPPORTED
	none := func(string) bool { return false }
	all := func(string) bool { return true }
	old := &mock.Device{ // an old driver: no cores or bus width calls, no ECC
		GetMaxPcieLinkGenerationFunc: func() (int, nvml.Return) { return 3, nvml.SUCCESS },
		GetMaxPcieLinkWidthFunc:      func() (int, nvml.Return) { return 16, nvml.SUCCESS },
		GetEccModeFunc:               func() (nvml.EnableState, nvml.EnableState, nvml.Return) { return 0, 0, ns },
	}
	if p := readProperties(old, none); p != (Properties{PCIeMaxGeneration: 3, PCIeMaxWidth: 16}) {
		t.Errorf("old driver: %+v", p)
	}
	cur := &mock.Device{
		GetNumGpuCoresFunc:           func() (int, nvml.Return) { return 16896, nvml.SUCCESS },
		GetMaxPcieLinkGenerationFunc: func() (int, nvml.Return) { return 0, ns },
		GetMaxPcieLinkWidthFunc:      func() (int, nvml.Return) { return 16, nvml.SUCCESS },
		GetMemoryBusWidthFunc:        func() (uint32, nvml.Return) { return 6144, nvml.SUCCESS },
		GetEccModeFunc: func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
			return nvml.FEATURE_DISABLED, nvml.FEATURE_ENABLED, nvml.SUCCESS // off until the next reset
		},
	}
	p := readProperties(cur, all)
	if p.ECCEnabled == nil || *p.ECCEnabled {
		t.Errorf("ECC %v, want the current mode, disabled", p.ECCEnabled)
	}
	p.ECCEnabled = nil
	if p != (Properties{Cores: 16896, PCIeMaxWidth: 16, MemoryBusWidthBits: 6144}) {
		t.Errorf("current driver: %+v", p)
	}

	for _, tc := range []struct {
		level     nvml.GpuTopologyLevel
		levelRet  nvml.Return
		status    nvml.GpuP2PStatus
		statusRet nvml.Return
		path      PCIePath
		p2p       string
	}{
		{nvml.TOPOLOGY_INTERNAL, nvml.SUCCESS, nvml.P2P_STATUS_OK, nvml.SUCCESS, PCIePathSameBoard, "true"},
		{nvml.TOPOLOGY_SINGLE, nvml.SUCCESS, nvml.P2P_STATUS_OK, nvml.SUCCESS, PCIePathSingleSwitch, "true"},
		{nvml.TOPOLOGY_MULTIPLE, nvml.SUCCESS, nvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED, nvml.SUCCESS, PCIePathMultipleSwitches, "false"},
		{nvml.TOPOLOGY_HOSTBRIDGE, nvml.SUCCESS, nvml.P2P_STATUS_DISABLED_BY_REGKEY, nvml.SUCCESS, PCIePathHostBridge, "false"},
		{nvml.TOPOLOGY_NODE, nvml.SUCCESS, nvml.P2P_STATUS_UNKNOWN, nvml.SUCCESS, PCIePathSameNUMANode, "unknown"},
		{nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS, 0, ns, PCIePathCrossNUMANode, "unknown"},
		{0, ns, nvml.P2P_STATUS_OK, nvml.SUCCESS, PCIePathUnknown, "true"},
	} {
		a := &mock.Device{
			GetTopologyCommonAncestorFunc: func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return tc.level, tc.levelRet },
			GetP2PStatusFunc: func(_ nvml.Device, i nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
				if i != nvml.P2P_CAPS_INDEX_READ {
					t.Errorf("P2P status asked for caps index %d, want reads", i)
				}
				return tc.status, tc.statusRet
			},
		}
		p := readPeer(a, &mock.Device{}, all)
		p2p := "unknown"
		if p.P2P != nil {
			p2p = strconv.FormatBool(*p.P2P)
		}
		if p.Path != tc.path || p2p != tc.p2p {
			t.Errorf("level %d (%v), status %d (%v): %+v (P2P %s), want %d and %s", tc.level, tc.levelRet, tc.status, tc.statusRet, p, p2p, tc.path, tc.p2p)
		}
	}
	// Without nvmlDeviceGetP2PStatus in the library, peer access is unknown.
	a := &mock.Device{GetTopologyCommonAncestorFunc: func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS }}
	if p := readPeer(a, &mock.Device{}, none); p.P2P != nil || p.Path != PCIePathCrossNUMANode {
		t.Errorf("old driver: %+v", p)
	}
}

// TestNVMLProperties runs on a GPU host: each GPU's properties and each
// pair's peer facts agree with two sources that share no code with ours,
// the CUDA driver API (what nvidia-docker 1.0 read these facts from) and
// nvidia-smi. In particular the maximum memory clock NVML gives, in MHz, is
// CUDA's memoryClockRate in kHz / 1000, and the bus widths agree, so that
// /gpu/info's memory bandwidth, computed with the original's formula from
// NVML's values, is the number the original computed from CUDA's.
// Skipped without a driver. The command is in TestNVMLReader's comment.
func TestNVMLProperties(t *testing.T) {
	sys, r := openNVML(t)
	info := r.(interface {
		Properties(string) (Properties, error)
		Peer(string, string) (Peer, error)
	})
	cuda := cudaAttributes(t)
	smi := smiQuery(t, "pci.bus_id,pcie.link.gen.max,pcie.link.width.max,ecc.mode.current")
	for _, d := range sys.Devices {
		p, err := info.Properties(d.UUID)
		if err != nil {
			t.Fatalf("GPU %d: %v", d.Index, err)
		}
		s, err := r.Read(d.UUID)
		if err != nil {
			t.Fatal(err)
		}
		ecc := "unknown"
		if p.ECCEnabled != nil {
			ecc = strconv.FormatBool(*p.ECCEnabled)
		}
		t.Logf("GPU %d %s: cores %d, PCIe gen %d x%d, memory bus %d bits, max memory clock %v MHz, ECC %s",
			d.Index, d.Name, p.Cores, p.PCIeMaxGeneration, p.PCIeMaxWidth, p.MemoryBusWidthBits, s.MaxMemoryClockMHz, ecc)
		// Data centre GPUs of the last generations report all of these.
		if p.Cores <= 0 || p.PCIeMaxGeneration < 1 || p.PCIeMaxWidth < 1 || p.MemoryBusWidthBits <= 0 || p.ECCEnabled == nil {
			t.Errorf("GPU %d: a property is unknown: %+v", d.Index, p)
		}
		if c, ok := cuda[busKey(t, d.PCIBusID)]; !ok {
			t.Logf("GPU %d: the CUDA driver API does not list it (MIG enabled?): not compared", d.Index)
		} else {
			t.Logf("GPU %d: CUDA says %d SMs, memory clock %d kHz, bus %d bits, ECC %d, L2 %d bytes", d.Index, c.sms, c.memKHz, c.busBits, c.ecc, c.l2)
			if c.busBits != p.MemoryBusWidthBits {
				t.Errorf("GPU %d: memory bus %d bits, CUDA says %d", d.Index, p.MemoryBusWidthBits, c.busBits)
			}
			if c.memKHz < 0 {
				t.Logf("GPU %d: this CUDA driver does not give the memory clock: not compared", d.Index)
			} else if float64(c.memKHz/1000) != s.MaxMemoryClockMHz {
				t.Errorf("GPU %d: max memory clock %v MHz, CUDA's memoryClockRate %d kHz", d.Index, s.MaxMemoryClockMHz, c.memKHz)
			}
			if p.ECCEnabled != nil && *p.ECCEnabled != (c.ecc == 1) {
				t.Errorf("GPU %d: ECC %v, CUDA says %d", d.Index, *p.ECCEnabled, c.ecc)
			}
			if c.sms <= 0 || p.Cores%c.sms != 0 || !slices.Contains([]int{64, 128, 192}, p.Cores/c.sms) {
				t.Errorf("GPU %d: %d cores on %d SMs", d.Index, p.Cores, c.sms)
			}
		}
		if row, ok := smi[busKey(t, d.PCIBusID)]; ok {
			if row[1] != strconv.Itoa(p.PCIeMaxGeneration) || row[2] != strconv.Itoa(p.PCIeMaxWidth) {
				t.Errorf("GPU %d: PCIe gen %d x%d, nvidia-smi says %s x%s", d.Index, p.PCIeMaxGeneration, p.PCIeMaxWidth, row[1], row[2])
			}
			if want := map[string]string{"Enabled": "true", "Disabled": "false"}[row[3]]; want != "" && want != ecc {
				t.Errorf("GPU %d: ECC %s, nvidia-smi says %s", d.Index, ecc, row[3])
			}
		}
	}
	if _, err := info.Properties("GPU-00000000-0000-0000-0000-000000000000"); err == nil {
		t.Error("unknown UUID without error")
	}

	if len(sys.Devices) < 2 {
		t.Logf("one GPU: no peers to check")
		return
	}
	paths := smitest.Matrix(t, "topo", "-m")
	access := smitest.Matrix(t, "topo", "-p2p", "r")
	pathOf := map[string]PCIePath{"PIX": PCIePathSingleSwitch, "PXB": PCIePathMultipleSwitches, "PHB": PCIePathHostBridge,
		"NODE": PCIePathSameNUMANode, "SYS": PCIePathCrossNUMANode}
	for i, a := range sys.Devices {
		for j, b := range sys.Devices {
			if i == j {
				continue
			}
			p, err := info.Peer(a.UUID, b.UUID)
			if err != nil {
				t.Fatalf("GPUs %d, %d: %v", i, j, err)
			}
			p2p := "unknown"
			if p.P2P != nil {
				p2p = strconv.FormatBool(*p.P2P)
			}
			t.Logf("GPUs %d, %d: PCIe path %d, peer reads %s; nvidia-smi topo: %s, p2p r: %s", i, j, p.Path, p2p, smitest.At(paths, i, j), smitest.At(access, i, j))
			if p.Path == PCIePathUnknown {
				t.Errorf("GPUs %d, %d: PCIe path unknown", i, j)
			}
			if want, ok := pathOf[smitest.At(paths, i, j)]; ok && p.Path != want {
				t.Errorf("GPUs %d, %d: PCIe path %d, nvidia-smi topo -m says %s", i, j, p.Path, smitest.At(paths, i, j))
			}
			switch smitest.At(access, i, j) {
			case "OK":
				if p2p != "true" {
					t.Errorf("GPUs %d, %d: peer reads %s, nvidia-smi says OK", i, j, p2p)
				}
			case "NS", "CNS", "GNS", "TNS":
				if p2p != "false" {
					t.Errorf("GPUs %d, %d: peer reads %s, nvidia-smi says %s", i, j, p2p, smitest.At(access, i, j))
				}
			}
		}
	}
}

// busKey is a PCI address in one form, for matching the forms of NVML, CUDA
// and nvidia-smi.
func busKey(t *testing.T, s string) string {
	a, err := gpu.ParsePCIAddress(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("bus id %q: %v", s, err)
	}
	return a.String()
}

type cudaDevice struct{ sms, memKHz, busBits, ecc, l2 int }

// cudaAttrC prints, for each CUDA device, its PCI bus id and the device
// attributes CUDA's cudaDeviceProp is made of: multiprocessor count (16),
// memory clock in kHz (36), memory bus width (37), ECC enabled (32) and L2
// size (38); -1 for one the driver does not give. It needs no CUDA toolkit
// and makes no context.
const cudaAttrC = `#include <dlfcn.h>
#include <stdio.h>
typedef int (*fn_init)(unsigned);
typedef int (*fn_count)(int *);
typedef int (*fn_get)(int *, int);
typedef int (*fn_attr)(int *, int, int);
typedef int (*fn_bus)(char *, int, int);
int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
	fn_init init = (fn_init)dlsym(h, "cuInit");
	fn_count count = (fn_count)dlsym(h, "cuDeviceGetCount");
	fn_get get = (fn_get)dlsym(h, "cuDeviceGet");
	fn_attr attr = (fn_attr)dlsym(h, "cuDeviceGetAttribute");
	fn_bus bus = (fn_bus)dlsym(h, "cuDeviceGetPCIBusId");
	if (!init || !count || !get || !attr || !bus) { printf("dlsym failed\n"); return 1; }
	int n, r;
	if ((r = init(0)) || (r = count(&n))) { printf("CUDA error %d\n", r); return 1; }
	int ids[] = {16, 36, 37, 32, 38};
	for (int i = 0; i < n; i++) {
		int dev; char id[32];
		if (get(&dev, i) || bus(id, sizeof id, dev)) continue;
		printf("%s", id);
		for (int k = 0; k < 5; k++) { int v; printf(" %d", attr(&v, ids[k], dev) ? -1 : v); }
		printf("\n");
	}
	return 0;
}
`

// cudaAttributes runs cudaAttrC; by PCI bus id (busKey). It fails the test
// where the driver has a GPU but CUDA cannot be asked.
func cudaAttributes(t *testing.T) map[string]cudaDevice {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Log("no gcc: properties are not compared with the CUDA driver API")
		return nil
	}
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "attr.c"), filepath.Join(dir, "attr")
	if err := os.WriteFile(src, []byte(cudaAttrC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-o", bin, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("building the CUDA attribute probe: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("the CUDA attribute probe: %v\n%s", err, out)
	}
	devs := map[string]cudaDevice{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var id string
		var c cudaDevice
		if _, err := fmt.Sscan(line, &id, &c.sms, &c.memKHz, &c.busBits, &c.ecc, &c.l2); err != nil {
			t.Fatalf("CUDA attribute probe line %q: %v", line, err)
		}
		devs[busKey(t, id)] = c
	}
	return devs
}

// smiQuery runs nvidia-smi --query-gpu with fields, the first of which must
// be pci.bus_id; the rows by bus id (busKey). Nil without nvidia-smi.
func smiQuery(t *testing.T, fields string) map[string][]string {
	out, err := exec.Command("nvidia-smi", "--query-gpu="+fields, "--format=csv,noheader,nounits").Output()
	if err != nil {
		t.Logf("nvidia-smi --query-gpu: %v: not compared with nvidia-smi", err)
		return nil
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, ",")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		rows[busKey(t, f[0])] = f
	}
	return rows
}

// Memory in use is the second version's figure (without the driver's
// reserved memory, as nvidia-smi shows it) where the library has it, and
// the first version's otherwise or when the second fails.
func TestReadDeviceMemoryVersions(t *testing.T) {
	ns := nvml.ERROR_NOT_SUPPORTED
	v2ret := nvml.SUCCESS
	d := &mock.Device{
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 144 << 30, Used: 615 << 20}, nvml.SUCCESS
		},
		GetMemoryInfo_v2Func: func() (nvml.Memory_v2, nvml.Return) {
			return nvml.Memory_v2{Total: 144 << 30, Reserved: 615 << 20, Used: 0}, v2ret
		},
		GetUtilizationRatesFunc:         func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, ns },
		GetEncoderUtilizationFunc:       func() (uint32, uint32, nvml.Return) { return 0, 0, ns },
		GetDecoderUtilizationFunc:       func() (uint32, uint32, nvml.Return) { return 0, 0, ns },
		GetTemperatureFunc:              func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, ns },
		GetPowerUsageFunc:               func() (uint32, nvml.Return) { return 0, ns },
		GetPowerManagementLimitFunc:     func() (uint32, nvml.Return) { return 0, ns },
		GetClockInfoFunc:                func(nvml.ClockType) (uint32, nvml.Return) { return 0, ns },
		GetMaxClockInfoFunc:             func(nvml.ClockType) (uint32, nvml.Return) { return 0, ns },
		GetBAR1MemoryInfoFunc:           func() (nvml.BAR1Memory, nvml.Return) { return nvml.BAR1Memory{}, ns },
		GetPcieThroughputFunc:           func(nvml.PcieUtilCounter) (uint32, nvml.Return) { return 0, ns },
		GetComputeRunningProcessesFunc:  func() ([]nvml.ProcessInfo, nvml.Return) { return nil, ns },
		GetGraphicsRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, ns },
		GetMemoryErrorCounterFunc: func(nvml.MemoryErrorType, nvml.EccCounterType, nvml.MemoryLocation) (uint64, nvml.Return) {
			return 0, ns
		},
	}
	if s := readDevice(d, "/proc", true); s.MemoryUsedBytes != 0 || s.MemoryTotalBytes != 144<<30 {
		t.Errorf("with v2: used %v total %v, want 0 and 144 GiB", s.MemoryUsedBytes, s.MemoryTotalBytes)
	}
	if s := readDevice(d, "/proc", false); s.MemoryUsedBytes != 615<<20 {
		t.Errorf("without v2: used %v, want 615 MiB", s.MemoryUsedBytes)
	}
	v2ret = nvml.ERROR_FUNCTION_NOT_FOUND
	if s := readDevice(d, "/proc", true); s.MemoryUsedBytes != 615<<20 {
		t.Errorf("v2 failing: used %v, want the first version's 615 MiB", s.MemoryUsedBytes)
	}
}

// openNVML discovers the host's GPUs and opens the NVML reader, closed when
// the test ends; the test is skipped where there is no driver.
func openNVML(t *testing.T) (*gpu.System, Reader) {
	t.Helper()
	sys, err := gpunvml.Discover(gpunvml.Options{Light: true})
	if err != nil {
		t.Skipf("no NVIDIA driver here: %v", err)
	}
	r, closeNVML, err := NewNVML("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeNVML)
	return sys, r
}
