package draplugin

import (
	"slices"
	"strconv"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
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
