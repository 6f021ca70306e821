package doctor

import (
	"errors"
	"testing"
)

func TestPersistenceCheck(t *testing.T) {
	for _, tc := range []struct {
		name     string
		modes    []gpuPersistence
		status   Status
		evidence string
	}{
		{"all on", []gpuPersistence{{Index: 0, Enabled: true}, {Index: 1, Enabled: true}}, Pass,
			"enabled on all 2 GPUs"},
		{"one off", []gpuPersistence{{Index: 0, Enabled: true}, {Index: 1}}, Pass,
			"persistence mode off on GPU 1 (containers start slower; nvidia-smi -pm 1 or nvidia-persistenced)"},
		{"several off", []gpuPersistence{{Index: 0}, {Index: 1, Enabled: true}, {Index: 2}}, Pass,
			"persistence mode off on GPUs 0, 2 (containers start slower; nvidia-smi -pm 1 or nvidia-persistenced)"},
		{"unreadable", []gpuPersistence{{Index: 0, Enabled: true}, {Index: 1, Err: errors.New("Not Supported")}}, Pass,
			"mode unreadable on GPU 1 (Not Supported)"},
		{"off and unreadable", []gpuPersistence{{Index: 0}, {Index: 1, Err: errors.New("GPU is lost")}}, Pass,
			"persistence mode off on GPU 0 (containers start slower; nvidia-smi -pm 1 or nvidia-persistenced); mode unreadable on GPU 1 (GPU is lost)"},
		{"no GPUs", nil, Skip, "not read: NVML lists no GPUs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := persistenceCheck(tc.modes)
			if c.Name != CheckPersistence || c.Status != tc.status || !c.OK {
				t.Errorf("got %+v, want %s and ok (persistence mode never fails)", c, tc.status)
			}
			if c.Evidence != tc.evidence {
				t.Errorf("evidence %q, want %q", c.Evidence, tc.evidence)
			}
		})
	}
}
