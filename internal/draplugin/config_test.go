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

// opaque is a configuration of driver from source for requests (none: all).
func opaque(source resourceapi.AllocationConfigSource, driver, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source: source, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}}},
	}
}

// configure stores cfgs as the allocated claim's configuration.
func (e *testEnv) configure(c *resourceapi.ResourceClaim, cfgs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	e.t.Helper()
	c.Status.Allocation.Devices.Config = cfgs
	c, err := e.client.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(context.Background(), c, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

const gpuConfig = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig"`

// TestOpaqueConfig: NVIDIA's GpuConfig in a claim is read; what Gantry does
// passes, what is wrong fails the claim with the setting named and the fix.
func TestOpaqueConfig(t *testing.T) {
	f := newFakeSMI(t)
	e := newEnvSetup(t, "h100x8", func(e *testEnv, _ string) { e.smi = f.path })
	for i, tc := range []struct {
		name, driver, params, wantErr string
	}{
		{"no sharing", DefaultDriverName, gpuConfig + `}`, ""},
		{"time-slicing default", DefaultDriverName, gpuConfig + `,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Default"}}}`, ""},
		{"time-slicing bare", DefaultDriverName, gpuConfig + `,"sharing":{"strategy":"TimeSlicing"}}`, ""},
		{"other driver", "other.example.com", `{"anything":1}`, ""},
		{"long interval", DefaultDriverName, gpuConfig + `,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`, ""},
		{"bad interval", DefaultDriverName, gpuConfig + `,"sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Forever"}}}`, `time-slice interval "Forever": use Default, Short, Medium or Long`},
		{"mps with time-slicing config", DefaultDriverName, gpuConfig + `,"sharing":{"strategy":"MPS","timeSlicingConfig":{"interval":"Long"}}}`, "timeSlicingConfig is set with strategy MPS"},
		{"time-slicing with mps config", DefaultDriverName, gpuConfig + `,"sharing":{"strategy":"TimeSlicing","mpsConfig":{}}}`, "mpsConfig is set with strategy TimeSlicing"},
		{"thread percentage", DefaultDriverName, gpuConfig + `,"sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":150}}}`, "defaultActiveThreadPercentage 150: use 0 to 100"},
		{"tiny memory limit", DefaultDriverName, gpuConfig + `,"sharing":{"strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":"100Ki"}}}`, "defaultPinnedDeviceMemoryLimit 100Ki: less than 1Mi"},
		{"per-device key", DefaultDriverName, gpuConfig + `,"sharing":{"strategy":"MPS","mpsConfig":{"defaultPerDevicePinnedMemoryLimit":{"3":"1Gi"}}}}`, `key "3" is neither the UUID`},
		{"memory not a quantity", DefaultDriverName, gpuConfig + `,"sharing":{"strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":"lots"}}}`, "quantities must match"},
		{"mig time-slice", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`, "a MIG device has no time-slice"},
		{"unknown strategy", DefaultDriverName, gpuConfig + `,"sharing":{"strategy":"Spatial"}}`, `strategy "Spatial"`},
		{"typo", DefaultDriverName, gpuConfig + `,"sharng":{}}`, `unknown field "sharng"`},
		{"version", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1","kind":"GpuConfig"}`, `apiVersion "resource.nvidia.com/v1"`},
		{"vfio", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"VfioDeviceConfig"}`, `kind "VfioDeviceConfig"`},
		{"mig config naming a GPU request", DefaultDriverName, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS"}}`, `names request "gpua", whose device gpu-`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.claim("cfg-"+strings.ReplaceAll(tc.name, " ", "-"), "gpu-"+string(rune('0'+i%8)))
			var reqs []string
			if strings.HasPrefix(tc.name, "mig config naming") {
				reqs = []string{"gpua"}
			}
			c = e.configure(c, opaque(resourceapi.AllocationConfigSourceClaim, tc.driver, tc.params, reqs...))
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
	// Nothing was applied for the refused ones; the long interval was set
	// and given back.
	if got := f.calls(); strings.Count(got, "--set-timeslice 3") != 1 || strings.Count(got, "--set-timeslice 0") != 5 {
		t.Errorf("nvidia-smi calls:\n%s", got)
	}
}
