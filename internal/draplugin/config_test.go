package draplugin

import (
	"context"
	"os"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestOpaqueConfig: NVIDIA's GpuConfig in a claim is read; what Gantry does
// passes, what it does not do fails the claim with the setting named.
func TestOpaqueConfig(t *testing.T) {
	e := newEnv(t, "h100x8")
	for i, tc := range []struct {
		name, driver, params, wantErr string
	}{
		{"no sharing", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig"}`, ""},
		{"time-slicing default", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Default"}}}`, ""},
		{"time-slicing bare", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"}}`, ""},
		{"other driver", "other.example.com", `{"anything":1}`, ""},
		{"long interval", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`, `time-slice interval "Long"`},
		{"mps", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50}}}`, "MPS is not supported"},
		{"unknown strategy", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"Spatial"}}`, `strategy "Spatial"`},
		{"typo", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharng":{}}`, `unknown field "sharng"`},
		{"version", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1","kind":"GpuConfig"}`, `apiVersion "resource.nvidia.com/v1"`},
		{"vfio", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"VfioDeviceConfig"}`, `kind "VfioDeviceConfig"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.claim("cfg-"+strings.ReplaceAll(tc.name, " ", "-"), "gpu-"+string(rune('0'+i%8)))
			c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
				Source:              resourceapi.AllocationConfigSourceClaim,
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: tc.driver, Parameters: runtime.RawExtension{Raw: []byte(tc.params)}}},
			}}
			c, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			r := e.prepare(c).Claims[string(c.UID)]
			if tc.wantErr == "" {
				if r == nil || r.Error != "" || len(r.Devices) != 1 {
					t.Fatalf("prepare: %+v", r)
				}
				e.unprepare(c)
				return
			}
			if r == nil || !strings.Contains(r.Error, tc.wantErr) || !strings.Contains(r.Error, c.Name) {
				t.Errorf("prepare: %+v, want an error naming the claim and containing %q", r, tc.wantErr)
			}
			if _, err := os.Stat(e.drv.SpecPath(c.UID)); err == nil {
				t.Error("a spec was written for a refused configuration")
			}
		})
	}
}
