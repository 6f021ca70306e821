package inject

import (
	"reflect"
	"slices"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/request"
)

// sampleEdits sets every field of edits.Edits to something valid. A new
// field left zero here fails TestEveryEditIsClassified.
var sampleEdits = edits.Edits{
	Env:         []string{"NVIDIA_DRIVER_CAPABILITIES=utility"},
	DeviceNodes: []edits.DeviceNode{{Path: "/dev/nvidia0", HostPath: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0, Permissions: "rwm"}},
	Mounts:      []edits.Mount{{HostPath: "/usr/bin/nvidia-smi", ContainerPath: "/usr/bin/nvidia-smi", Options: edits.ReadOnlyOptions}},
	Symlinks:    []edits.Symlink{{Target: "libcuda.so.580.159.04", Link: "/usr/lib/x86_64-linux-gnu/libcuda.so.1"}},
	LibraryDirs: []string{"/usr/lib/x86_64-linux-gnu"},
}

// Every kind of edit reaches the container one way or the other: the root
// filesystem (NeedsRootfs then says so, and every front end calls
// FinishRootfs), or config.json and the mount namespace (ApplyToSpec then
// changes the spec). A field added to edits.Edits and classified nowhere
// fails here instead of being skipped silently by the front ends.
func TestEveryEditIsClassified(t *testing.T) {
	typ := reflect.TypeOf(edits.Edits{})
	sample := reflect.ValueOf(sampleEdits)
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		if !f.IsExported() {
			continue
		}
		inRootfs, inSpec := slices.Contains(rootfsFields, f.Name), slices.Contains(specFields, f.Name)
		if !inRootfs && !inSpec {
			t.Errorf("edits.Edits.%s is in neither rootfsFields nor specFields: say how it reaches the container (and extend NeedsRootfs/ApplyEdits or edits.ApplyToSpec)", f.Name)
			continue
		}
		if sample.Field(i).IsZero() {
			t.Errorf("sampleEdits.%s is not set", f.Name)
			continue
		}
		var only edits.Edits
		reflect.ValueOf(&only).Elem().Field(i).Set(sample.Field(i))
		if got := NeedsRootfs(&only); got != inRootfs {
			t.Errorf("NeedsRootfs with only %s set: %v, want %v", f.Name, got, inRootfs)
		}
		if inSpec {
			empty := func() *ocispecs.Spec { return &ocispecs.Spec{Process: &ocispecs.Process{}, Linux: &ocispecs.Linux{}} }
			spec := empty()
			if err := only.ApplyToSpec(spec); err != nil {
				t.Fatalf("%s: %v", f.Name, err)
			}
			if reflect.DeepEqual(spec, empty()) {
				t.Errorf("edits.Edits.%s is in specFields but ApplyToSpec leaves the spec as it was", f.Name)
			}
		}
	}
	if NeedsRootfs(nil) || NeedsRootfs(&edits.Edits{}) {
		t.Error("NeedsRootfs of no edits: true")
	}
}

// CDI names of the configured kind become device IDs (all wins, lists
// merge), the others are left for the CDI registry.
func TestOwnCDINames(t *testing.T) {
	for _, tc := range []struct {
		name        string
		devices     request.Selection
		cdi         []string
		wantDevices request.Selection
		wantOthers  []string
	}{
		{"ids", request.Selection{Mode: request.Void}, []string{"nvidia.com/gpu=1", "vendor.com/x=a"}, request.Selection{Mode: request.List, IDs: []string{"1"}}, []string{"vendor.com/x=a"}},
		{"merged with env", request.Selection{Mode: request.List, IDs: []string{"0"}}, []string{"nvidia.com/gpu=1"}, request.Selection{Mode: request.List, IDs: []string{"0", "1"}}, nil},
		{"all wins", request.Selection{Mode: request.List, IDs: []string{"0"}}, []string{"nvidia.com/gpu=all"}, request.Selection{Mode: request.All}, nil},
		{"others only", request.Selection{Mode: request.None}, []string{"vendor.com/x=a"}, request.Selection{Mode: request.None}, []string{"vendor.com/x=a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &request.Request{Devices: tc.devices, CDIDevices: tc.cdi}
			others, err := ownCDINames(req, "nvidia.com/gpu")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(req.Devices, tc.wantDevices) || !slices.Equal(others, tc.wantOthers) || !slices.Equal(req.CDIDevices, tc.wantOthers) {
				t.Errorf("devices %+v, others %q, CDIDevices %q; want %+v and %q", req.Devices, others, req.CDIDevices, tc.wantDevices, tc.wantOthers)
			}
		})
	}
}
