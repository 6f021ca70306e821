package deviceplugin

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// BenchmarkAllocate is the kubelet's Allocate call over the plugin's unix
// socket (one container, two GPUs asked in reverse order, and all eight
// shuffled), and the answer alone in process, for each list strategy and
// for bench/device-plugin-footprint.sh's settings (every-feature:
// passDeviceSpecs with two of the four control devices present, envvar and
// cdi-annotations). Besides the mean it reports the median and 99th
// percentile of the calls (p50-ns, p99-ns), which the device plugin
// comparison with NVIDIA's uses; the requests are fixed, so runs compare.
func BenchmarkAllocate(b *testing.B) {
	devRoot := b.TempDir()
	if err := os.Mkdir(filepath.Join(devRoot, "dev"), 0o755); err != nil {
		b.Fatal(err)
	}
	for _, n := range []string{"nvidiactl", "nvidia-uvm"} {
		if err := os.WriteFile(filepath.Join(devRoot, "dev", n), nil, 0o666); err != nil {
			b.Fatal(err)
		}
	}
	for _, strategy := range []DeviceListStrategy{ListEnvVar, ListVolumeMounts, ListCDICRI, "every-feature"} {
		cfg := DefaultConfig()
		cfg.Flags.Plugin.DeviceListStrategy = StrategyList{strategy}
		if strategy == "every-feature" {
			cfg.Flags.Plugin.DeviceListStrategy = StrategyList{ListEnvVar, ListCDIAnnotations}
			cfg.Flags.Plugin.PassDeviceSpecs = true
			cfg.Flags.NvidiaDevRoot = devRoot
		}
		h := startHarness(b, "h100x8", cfg)
		h.kubelet.registration()
		c := h.kubelet.client("nvidia-gpu.sock")
		d := h.sys.Devices
		two := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{d[3].UUID, d[2].UUID}}}}
		eight := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{d[5].UUID, d[0].UUID, d[7].UUID, d[2].UUID, d[4].UUID, d[1].UUID, d[6].UUID, d[3].UUID}}}}
		for _, r := range []struct {
			name string
			req  *pluginapi.AllocateRequest
		}{{"2gpus", two}, {"8gpus", eight}} {
			b.Run("grpc/"+string(strategy)+"/"+r.name, func(b *testing.B) {
				ctx := context.Background()
				timedLoop(b, func() {
					if _, err := c.Allocate(ctx, r.req); err != nil {
						b.Fatal(err)
					}
				})
			})
			b.Run("inprocess/"+string(strategy)+"/"+r.name, func(b *testing.B) {
				s := h.plugin.servers[0]
				timedLoop(b, func() {
					if _, err := s.Allocate(context.Background(), r.req); err != nil {
						b.Fatal(err)
					}
				})
			})
		}
		h.stop()
	}
}

// timedLoop runs f in b's loop and reports the median and 99th percentile
// of its calls.
func timedLoop(b *testing.B, f func()) {
	times := make([]time.Duration, 0, 1024)
	for b.Loop() {
		start := time.Now()
		f()
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkPreferredAllocation is GetPreferredAllocation over the socket:
// 4 of 8 H100s (topology graph), and 3 of 32 replicas of the same GPUs.
func BenchmarkPreferredAllocation(b *testing.B) {
	h := startHarness(b, "h100x8", DefaultConfig())
	h.kubelet.registration()
	var all []string
	for _, d := range h.sys.Devices {
		all = append(all, d.UUID)
	}
	c := h.kubelet.client("nvidia-gpu.sock")
	req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: all, AllocationSize: 4}}}
	b.Run("gpus-4-of-8", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.GetPreferredAllocation(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	h.stop()

	cfg := DefaultConfig()
	cfg.Sharing.TimeSlicing = &ReplicatedResources{Resources: []ReplicatedResource{{Name: "gpu", Replicas: 4}}}
	h = startHarness(b, "h100x8", cfg)
	h.kubelet.registration()
	var reps []string
	for _, d := range h.kubelet.list("nvidia.com/gpu") {
		reps = append(reps, d.ID)
	}
	c = h.kubelet.client("nvidia-gpu.sock")
	req = &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: reps, AllocationSize: 3}}}
	b.Run("replicas-3-of-32", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.GetPreferredAllocation(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	h.stop()
}

// BenchmarkHealthEventToStream is the time from a fault injected into the
// simulated health source to the kubelet holding the updated device list
// (one op: a fault and the reset after it, two lists).
func BenchmarkHealthEventToStream(b *testing.B) {
	h := startHarness(b, "h100x8", DefaultConfig())
	h.kubelet.registration()
	h.kubelet.list("nvidia.com/gpu")
	u := h.sys.Devices[4].UUID
	for b.Loop() {
		h.inject("xid " + u + " 79")
		h.kubelet.list("nvidia.com/gpu")
		h.inject("reset " + u)
		h.kubelet.list("nvidia.com/gpu")
	}
	h.stop()
}

// BenchmarkResidentMemory reports the memory of a plugin serving 8 simulated
// H100s to a kubelet with health checks on, measured once the kubelet holds
// the device list: the Go heap the plugin and its fake kubelet added
// (heap-bytes), the Go runtime's total (go-sys-bytes) and the process's
// resident set (rss-bytes; the test binary and the fake kubelet included, so
// an upper bound for the plugin). The timed loop only re-reads the figures.
func BenchmarkResidentMemory(b *testing.B) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	h := startHarness(b, "h100x8", DefaultConfig())
	h.kubelet.registration()
	h.kubelet.list("nvidia.com/gpu")
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&after)
	}
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)), "heap-bytes")
	b.ReportMetric(float64(after.Sys), "go-sys-bytes")
	b.ReportMetric(float64(vmRSS()), "rss-bytes")
	h.stop()
}

// vmRSS is the resident set of this process from /proc/self/status, in bytes.
func vmRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb * 1024
		}
	}
	return -1
}
