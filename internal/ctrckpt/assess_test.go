package ctrckpt

import (
	"strings"
	"testing"
)

// The findings from what /proc shows, each kind and its weight: an MPS
// client and a non-x86-64 host refuse; /dev/nvidia-uvm, several CUDA
// processes, NCCL and GPUs of several models warn.
func TestAssess(t *testing.T) {
	one := []procView{{PID: 10, Use: CUDAUse{PID: 10, MapsLibcuda: true}}}
	if fs := assess(one, []string{"H100"}, "amd64"); len(fs) != 0 {
		t.Errorf("one plain CUDA process: %v", fs)
	}
	mps := []procView{{PID: 10, MPSPipe: "/tmp/nvidia-mps"}}
	if fs := assess(mps, nil, "amd64"); len(fs) != 1 || !fs[0].Refuse || !strings.Contains(fs[0].What, "MPS client") || Refusals(fs) == "" {
		t.Errorf("MPS client: %v", fs)
	}
	if fs := assess(one, nil, "arm64"); len(fs) != 1 || !fs[0].Refuse || !strings.Contains(fs[0].What, "x86-64") {
		t.Errorf("arm64: %v", fs)
	}
	if fs := assess(nil, nil, "arm64"); len(fs) != 0 {
		t.Errorf("no CUDA process on arm64: %v", fs)
	}
	uvm := []procView{{PID: 10, UVM: true}}
	if fs := assess(uvm, nil, "amd64"); len(fs) != 1 || fs[0].Refuse || !strings.Contains(fs[0].What, "managed memory") {
		t.Errorf("uvm: %v", fs)
	}
	multi := []procView{{PID: 10, NCCL: true}, {PID: 11, NCCL: true}}
	if fs := assess(multi, nil, "amd64"); len(fs) != 1 || fs[0].Refuse || !strings.Contains(fs[0].What, "2 CUDA processes [10 11]") || !strings.Contains(fs[0].What, "map NCCL") {
		t.Errorf("two NCCL processes: %v", fs)
	}
	if fs := assess([]procView{{PID: 10, NCCL: true}}, nil, "amd64"); len(fs) != 1 || fs[0].Refuse || !strings.Contains(fs[0].What, "NVLS") {
		t.Errorf("one NCCL process: %v", fs)
	}
	if fs := assess(one, []string{"H100", "H100", "L4"}, "amd64"); len(fs) != 1 || fs[0].Refuse || !strings.Contains(fs[0].What, "2 models (H100, L4)") {
		t.Errorf("mixed models: %v", fs)
	}
	if Refusals(assess(multi, []string{"H100", "L4"}, "amd64")) != "" {
		t.Error("warnings refused")
	}
}
