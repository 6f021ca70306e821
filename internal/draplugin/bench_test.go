package draplugin

import (
	"context"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkPrepare is the kubelet's NodePrepareResources for a one-GPU
// claim through the plugin's unix socket: the helper's claim lookup (fake
// API server), the CDI spec and the checkpoint, both written with fsync.
// It reports the median (p50-µs) and p99 of the calls besides the mean;
// unprepare runs outside the timer.
func BenchmarkPrepare(b *testing.B) {
	e := newEnv(b, "h100x8")
	claims := make([]*resourceapi.ResourceClaim, 0, 64)
	for i := range cap(claims) {
		claims = append(claims, e.claim("bench-"+strconv.Itoa(i), "gpu-"+strconv.Itoa(i%8)))
	}
	var took []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		c := claims[i%len(claims)]
		start := time.Now()
		cdiIDs(b, e.prepare(c), c)
		took = append(took, time.Since(start))
		b.StopTimer()
		e.unprepare(c)
		b.StartTimer()
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkFootprint serves h100x8 with 64 claims prepared (eight per GPU
// through admin access, so the checkpoint holds them all) and reports the
// Go heap in use and the test process's resident set (VmRSS: the plugin
// plus the test's fake API server) after a GC.
func BenchmarkFootprint(b *testing.B) {
	e := newEnv(b, "h100x8")
	for i := range 64 {
		c := e.claim("fp-"+strconv.Itoa(i), "gpu-"+strconv.Itoa(i%8))
		c.Status.Allocation.Devices.Results[0].AdminAccess = new(true)
		c, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		cdiIDs(b, e.prepare(c), c)
	}
	for b.Loop() {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(kb)/1024, "rss-MiB")
		}
	}
}
