//go:build cgo

package readings

import (
	"testing"

	gpunvml "github.com/gantry-gpu/gantry/internal/gpu/nvml"
)

// TestNVMLReader runs on a GPU host: every GPU reads back with the memory
// total discovery saw and plausible values; skipped without a driver.
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
		if !d.MIGEnabled && !(s.UtilizationPercent >= 0 && s.UtilizationPercent <= 100) {
			t.Errorf("GPU %d: utilisation %v", d.Index, s.UtilizationPercent)
		}
	}
	if _, err := r.Read("GPU-00000000-0000-0000-0000-000000000000"); err == nil {
		t.Error("unknown UUID read without error")
	}
}
