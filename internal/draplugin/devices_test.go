package draplugin

import (
	"bytes"
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

// published waits for the ResourceSlices the helper's controller writes to
// the (fake) API server.
func published(t *testing.T, e *testEnv) []resourceapi.ResourceSlice {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		list, err := e.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) > 0 {
			return list.Items
		}
		if time.Now().After(deadline) {
			t.Fatal("no ResourceSlice published within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// apiProblems are the API server's rules for a slice's devices that the fake
// API server does not enforce (resource.k8s.io/v1 validation).
func apiProblems(s resourceapi.ResourceSlice) []string {
	var out []string
	if len(s.Spec.Devices) > resourceapi.ResourceSliceMaxDevices {
		out = append(out, "too many devices")
	}
	semverRe := regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)
	for _, d := range s.Spec.Devices {
		if errs := validation.IsDNS1123Label(d.Name); len(errs) > 0 {
			out = append(out, d.Name+": "+strings.Join(errs, "; "))
		}
		if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
			out = append(out, d.Name+": too many attributes and capacities")
		}
		for name, a := range d.Attributes {
			id := string(name)
			if domain, short, ok := strings.Cut(id, "/"); ok {
				if errs := validation.IsDNS1123Subdomain(domain); len(errs) > 0 {
					out = append(out, d.Name+": attribute domain "+domain)
				}
				id = short
			}
			if !regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9]*$`).MatchString(id) || len(id) > 32 {
				out = append(out, d.Name+": attribute name "+string(name))
			}
			set := 0
			for _, v := range []bool{a.StringValue != nil, a.IntValue != nil, a.BoolValue != nil, a.VersionValue != nil} {
				if v {
					set++
				}
			}
			if set != 1 {
				out = append(out, d.Name+": attribute "+string(name)+" has no single value")
			}
			if a.VersionValue != nil && !semverRe.MatchString(*a.VersionValue) {
				out = append(out, d.Name+": version "+*a.VersionValue)
			}
			if a.StringValue != nil && len(*a.StringValue) > 64 {
				out = append(out, d.Name+": string too long")
			}
		}
	}
	return out
}

func attr(d resourceapi.Device, name string) string {
	a, ok := d.Attributes[resourceapi.QualifiedName(name)]
	switch {
	case !ok:
		return "<none>"
	case a.StringValue != nil:
		return *a.StringValue
	case a.VersionValue != nil:
		return *a.VersionValue
	case a.IntValue != nil:
		return strconv.FormatInt(*a.IntValue, 10)
	}
	return "<?>"
}

func TestResourceSlicesH100x8(t *testing.T) {
	e := newEnv(t, "h100x8")
	slicesOut := published(t, e)
	if len(slicesOut) != 1 {
		t.Fatalf("%d slices, want 1", len(slicesOut))
	}
	s := slicesOut[0]
	if s.Spec.Driver != DefaultDriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != testNode || s.Spec.Pool.Name != testNode {
		t.Errorf("slice spec driver %s node %v pool %s", s.Spec.Driver, s.Spec.NodeName, s.Spec.Pool.Name)
	}
	for _, p := range apiProblems(s) {
		t.Error(p)
	}
	if len(s.Spec.Devices) != 8 {
		t.Fatalf("%d devices, want 8", len(s.Spec.Devices))
	}
	for i, d := range s.Spec.Devices {
		g := e.sys.Devices[i]
		want := map[string]string{
			"type": "gpu", "uuid": g.UUID, "productName": "NVIDIA H100 80GB HBM3", "brand": "nvidia",
			"architecture": "Hopper", "cudaComputeCapability": "9.0.0",
			"driverVersion": mustSemver(t, e.sys.DriverVersion), "cudaDriverVersion": mustSemver(t, e.sys.CUDADriverVersion),
			"pcieBusID": strings.ToLower(g.PCIBusID[4:]), "resource.kubernetes.io/pciBusID": strings.ToLower(g.PCIBusID[4:]),
		}
		if d.Name != "gpu-"+itoa(g.Minor) {
			t.Errorf("device %d named %s", i, d.Name)
		}
		for k, v := range want {
			if got := attr(d, k); got != v {
				t.Errorf("%s %s = %q, want %q", d.Name, k, got, v)
			}
		}
		if idx := d.Attributes["index"].IntValue; idx == nil || *idx != int64(g.Index) {
			t.Errorf("%s index %v", d.Name, idx)
		}
		if n := d.Attributes["resource.kubernetes.io/numaNode"].IntValue; n == nil || *n != int64(g.NUMANode) {
			t.Errorf("%s numaNode %v, want %d", d.Name, n, g.NUMANode)
		}
		if m := d.Capacity["memory"].Value; m.Value() != int64(g.MemoryMiB)<<20 {
			t.Errorf("%s memory %s, want %d MiB", d.Name, m.String(), g.MemoryMiB)
		}
	}
}

func TestResourceSlicesMIG(t *testing.T) {
	e := newEnv(t, "a100x2-mig")
	s := published(t, e)[0]
	for _, p := range apiProblems(s) {
		t.Error(p)
	}
	var names []string
	for _, d := range s.Spec.Devices {
		names = append(names, d.Name)
		if attr(d, "type") != TypeMIG {
			t.Errorf("%s type %s: a GPU in MIG mode is offered only as its MIG devices", d.Name, attr(d, "type"))
		}
	}
	want := []string{"gpu-0-mig-3g20gb-2-0", "gpu-0-mig-2g10gb-3-0", "gpu-0-mig-1g5gb-9-0"}
	for gi := 7; gi <= 13; gi++ {
		want = append(want, "gpu-1-mig-1g5gb-"+itoa(gi)+"-0")
	}
	if !slices.Equal(names, want) {
		t.Fatalf("devices %v, want %v", names, want)
	}
	for _, d := range s.Spec.Devices {
		var parent gpu.Device
		var mig gpu.MIGDevice
		for _, g := range e.sys.Devices {
			for _, m := range g.MIGDevices {
				if attr(d, "uuid") == m.UUID {
					parent, mig = g, m
				}
			}
		}
		if mig.UUID == "" {
			t.Fatalf("%s: uuid %s is no MIG device of the host", d.Name, attr(d, "uuid"))
		}
		if attr(d, "parentUUID") != parent.UUID || attr(d, "profile") != mig.Profile || attr(d, "productName") != parent.Name {
			t.Errorf("%s: parentUUID %s profile %s productName %s", d.Name, attr(d, "parentUUID"), attr(d, "profile"), attr(d, "productName"))
		}
		if m := d.Capacity["memory"].Value; mig.MemoryMiB == 0 || m.Value() != int64(mig.MemoryMiB)<<20 {
			t.Errorf("%s memory %s, want %d MiB", d.Name, m.String(), mig.MemoryMiB)
		}
	}
}

func mustSemver(t *testing.T, v string) string {
	t.Helper()
	s, err := semver(v)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSemver(t *testing.T) {
	for in, want := range map[string]string{
		"9.0": "9.0.0", "12.4": "12.4.0", "550.54.15": "550.54.15", "580.159.04": "580.159.4", "575": "575.0.0",
		"": "", "12.x": "", "1.2.3.4": "", "-1.0": "",
	} {
		got, err := semver(in)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("semver(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestPCIAddress(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:18:00.0": "0000:18:00.0", "00000000:2A:00.0": "0000:2a:00.0", "0001:c1:00.1": "0001:c1:00.1",
		"00010000:18:00.0": "", "18:00.0": "", "0000:18:00.9": "",
	} {
		got, err := pciAddress(in)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("pciAddress(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestDevicesRejectsBadData(t *testing.T) {
	sys, err := sim.Load("h100x1")
	if err != nil {
		t.Fatal(err)
	}
	sys.Devices[0].ComputeCapability = "9.x"
	if _, err := Devices(sys); err == nil || !strings.Contains(err.Error(), sys.Devices[0].UUID) {
		t.Errorf("bad compute capability: %v, want an error naming the GPU", err)
	}
	sys.Devices[0].ComputeCapability, sys.Devices[0].NUMANode = "9.0", -1
	devs, err := Devices(sys)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := devs[0].Slice.Attributes["resource.kubernetes.io/numaNode"]; ok {
		t.Error("numaNode published for a GPU without NUMA affinity")
	}
}

func TestDryRun(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"--gpus", "sim:a100x2-mig", "--node-name", "n1", "--dry-run"}, func(string) string { return "" }, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	docs := strings.Split(strings.TrimPrefix(out.String(), "---\n"), "---\n")
	if len(docs) != 1 {
		t.Fatalf("%d documents", len(docs))
	}
	var s resourceapi.ResourceSlice
	if err := sigsyaml.UnmarshalStrict([]byte(docs[0]), &s); err != nil {
		t.Fatal(err)
	}
	if s.Kind != "ResourceSlice" || s.APIVersion != "resource.k8s.io/v1" || len(s.Spec.Devices) != 10 || *s.Spec.NodeName != "n1" {
		t.Errorf("dry run printed %s %s with %d devices", s.APIVersion, s.Kind, len(s.Spec.Devices))
	}
	for args, want := range map[string]string{
		"--gpus sim:nosuch --dry-run": "nosuch",
		"extra":                       "unexpected argument",
		"--bogus":                     "flag provided but not defined",
	} {
		errOut.Reset()
		if code := run(context.Background(), strings.Fields(args), func(string) string { return "" }, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), want) {
			t.Errorf("%s: exit %d, stderr %q, want %q", args, code, errOut.String(), want)
		}
	}
}

// TestOnly: --devices keeps the named GPUs (a GPU in MIG mode with its MIG
// devices), refuses IDs the host lacks, and a claim for a device left out
// is not prepared.
func TestOnly(t *testing.T) {
	mig, err := sim.Load("a100x2-mig")
	if err != nil {
		t.Fatal(err)
	}
	h100, err := sim.Load("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	names := func(sys *gpu.System, ids string) ([]string, error) {
		devs, err := Devices(sys)
		if err != nil {
			t.Fatal(err)
		}
		devs, err = Only(sys, devs, ids)
		var out []string
		for _, d := range devs {
			out = append(out, d.Slice.Name)
		}
		return out, err
	}
	for _, tc := range []struct {
		sys  *gpu.System
		ids  string
		want []string
	}{
		{h100, "4,5", []string{"gpu-4", "gpu-5"}},
		{h100, h100.Devices[7].UUID + ", 00000000:" + strings.TrimPrefix(h100.Devices[0].PCIBusID, "00000000:"), []string{"gpu-0", "gpu-7"}},
		{mig, "0", []string{"gpu-0-mig-3g20gb-2-0", "gpu-0-mig-2g10gb-3-0", "gpu-0-mig-1g5gb-9-0"}},
		{mig, "1:0," + mig.Devices[0].MIGDevices[2].UUID, []string{"gpu-0-mig-1g5gb-9-0", "gpu-1-mig-1g5gb-7-0"}},
	} {
		got, err := names(tc.sys, tc.ids)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("--devices %q: %v, %v; want %v", tc.ids, got, err, tc.want)
		}
	}
	if all, _ := names(h100, ""); len(all) != 8 {
		t.Errorf("no --devices: %d devices, want all 8", len(all))
	}
	if _, err := names(h100, "8"); err == nil || !strings.Contains(err.Error(), `--devices "8"`) {
		t.Errorf("--devices 8 on 8 GPUs: %v, want an error naming the flag", err)
	}

	e := newEnv(t, "h100x8")
	e.stop()
	o := e.options()
	o.Devices = "4,5"
	drv, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	c := e.claim("elsewhere", "gpu-1")
	res, err := drv.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err == nil || !strings.Contains(res[c.UID].Err.Error(), `"gpu-1" is not a device this plugin publishes`) {
		t.Errorf("claim for a GPU outside --devices: %v %v", err, res[c.UID].Err)
	}
}
