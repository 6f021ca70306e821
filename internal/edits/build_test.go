package edits

import (
	"errors"
	"slices"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/request"
)

func TestBuild(t *testing.T) {
	devRoot := makeDevRoot(t)
	compute := []driver.Capability{driver.Utility, driver.Compute}
	tests := []struct {
		name      string
		req       *request.Request
		wantNil   bool
		wantNodes []string
		wantErr   error
	}{
		{name: "nil request", req: nil, wantNil: true},
		{name: "void", req: &request.Request{Devices: request.Selection{Mode: request.Void}, Capabilities: compute}, wantNil: true},
		{
			name:      "none: driver files, no GPU",
			req:       &request.Request{Devices: request.Selection{Mode: request.None}, Capabilities: compute},
			wantNodes: []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"},
		},
		{
			name:      "one gpu, utility only",
			req:       &request.Request{Source: request.SourceEnv, Devices: list("0"), Capabilities: []driver.Capability{driver.Utility}},
			wantNodes: []string{"/dev/nvidia0", "/dev/nvidiactl"},
		},
		{
			name: "mig device",
			req:  &request.Request{Devices: list("1:1"), Capabilities: compute},
			wantNodes: []string{"/dev/nvidia-caps/nvidia-cap156", "/dev/nvidia-caps/nvidia-cap157",
				"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1", "/dev/nvidiactl"},
		},
		{
			name: "mig config and monitor capabilities",
			req: &request.Request{Devices: list("0"), Capabilities: compute,
				MIGConfig: request.Selection{Mode: request.All}, MIGMonitor: list("0")},
			wantNodes: []string{"/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2",
				"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"},
		},
		{
			name:    "unknown device",
			req:     &request.Request{Source: request.SourceEnv, Devices: list("0", "7"), Capabilities: compute},
			wantErr: ErrUnknownDevice,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := Build(testSystem(), testInventory(), tt.req, Options{DevRoot: devRoot})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if e != nil {
					t.Errorf("edits returned with an error: %+v", e)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantNil {
				if e != nil {
					t.Fatalf("edits %+v, want nil", e)
				}
				return
			}
			if got := nodePaths(e); !slices.Equal(got, tt.wantNodes) {
				t.Errorf("nodes:\n got %v\nwant %v", got, tt.wantNodes)
			}
			// The container's own NVIDIA_VISIBLE_DEVICES stays (as NVIDIA's
			// runtime leaves it): Build sets none.
			for _, v := range e.Env {
				if strings.HasPrefix(v, "NVIDIA_VISIBLE_DEVICES=") {
					t.Errorf("env %v sets %s", e.Env, v)
				}
			}
			// The result must apply cleanly to a spec, twice.
			spec := &ocispecs.Spec{}
			if err := e.ApplyToSpec(spec); err != nil {
				t.Fatal(err)
			}
			n := len(spec.Linux.Devices)
			if err := e.ApplyToSpec(spec); err != nil || len(spec.Linux.Devices) != n {
				t.Errorf("second apply: %v, %d devices (was %d)", err, len(spec.Linux.Devices), n)
			}
		})
	}
}

func TestBuildUnknownDeviceNamesTheSource(t *testing.T) {
	req := &request.Request{Source: request.SourceEnv, Devices: list("7")}
	_, err := Build(testSystem(), testInventory(), req, Options{})
	if err == nil || !strings.HasPrefix(err.Error(), "device request from NVIDIA_VISIBLE_DEVICES: ") {
		t.Fatalf("err = %v", err)
	}
}

func TestBuildRequirementBlocksEdits(t *testing.T) {
	// The dev root has no nodes: if Build looked at devices before checking
	// requirements, the error would be about a missing node instead.
	devRoot := t.TempDir()
	tests := []struct {
		name string
		sel  request.Selection
	}{
		{"gpu", list("0")},
		{"mig", list("1:0")},
		{"none", request.Selection{Mode: request.None}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := &request.Request{
				Devices:      tt.sel,
				Capabilities: []driver.Capability{driver.Compute},
				Requirements: []request.Requirement{{Var: "NVIDIA_REQUIRE_CUDA", Expr: "cuda>=99.0"}},
			}
			e, err := Build(testSystem(), testInventory(), req, Options{DevRoot: devRoot})
			if err == nil || e != nil {
				t.Fatalf("Build = %+v, %v; want an error and no edits", e, err)
			}
			if !errors.Is(err, request.ErrUnsatisfied) || !strings.Contains(err.Error(), "NVIDIA_REQUIRE_CUDA") {
				t.Errorf("err = %v", err)
			}
		})
	}
}

func TestBuildRequirementPerGPU(t *testing.T) {
	devRoot := makeDevRoot(t)
	tests := []struct {
		expr   string
		sel    request.Selection
		wantOK bool
	}{
		{"cuda>=12.0", list("0"), true},
		{"cuda>=12.5", list("0"), false},
		{"driver>=550", list("0"), true},
		{"arch>=9.0", list("0"), true},
		{"arch>=9.0", list("1:0"), false}, // a MIG device is judged by its A100 parent
		{"arch>=9.0", request.Selection{Mode: request.All}, false},
		{"arch>=9.0", request.Selection{Mode: request.None}, true}, // no GPU: arch holds
		{"brand=tesla arch>=8.0", list("1:1"), true},
		{"brand=tesla", list("0"), false},
	}
	for _, tt := range tests {
		t.Run(tt.expr+"/"+strings.Join(tt.sel.IDs, ","), func(t *testing.T) {
			req := &request.Request{
				Devices:      tt.sel,
				Capabilities: []driver.Capability{driver.Compute},
				Requirements: []request.Requirement{{Var: "NVIDIA_REQUIRE_X", Expr: tt.expr}},
			}
			e, err := Build(testSystem(), testInventory(), req, Options{DevRoot: devRoot})
			if tt.wantOK {
				if err != nil || e == nil {
					t.Fatalf("Build = %+v, %v", e, err)
				}
				return
			}
			if !errors.Is(err, request.ErrUnsatisfied) || e != nil {
				t.Fatalf("Build = %+v, %v; want ErrUnsatisfied and no edits", e, err)
			}
		})
	}
}
