package shim

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/inject"
)

// testPlan is the plan of a request for GPUs devices (their nodes, the
// driver's files) on the fixture's simulated host, plus env edits.
func testPlan(t *testing.T, devices string, noCgroups bool) *inject.Plan {
	t.Helper()
	f := need(t)
	cfg := config.Default()
	cfg.GPUs = "sim:h100x8"
	cfg.DriverRoot = f.driver.Root
	cfg.Runtime.NoCgroups = noCgroups
	cfg.Runtime.DriverTreeDir = t.TempDir()
	cfg.Runtime.CacheDir = t.TempDir()
	rec := inject.NewRecord(inject.FrontEndRuntime, "", "")
	req, err := inject.ReadRequest(&ocispecs.Spec{Process: &ocispecs.Process{Env: []string{"NVIDIA_VISIBLE_DEVICES=" + devices}}}, cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := inject.Prepare(cfg, req, inject.Options{CDI: true}, rec)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Edits == nil || len(plan.Edits.Mounts) == 0 || len(plan.Edits.DeviceNodes) == 0 {
		t.Fatalf("plan without mounts or nodes: %+v", plan.Edits)
	}
	// Env edits too (this host's plan has none): one new key, one that
	// replaces the spec's.
	plan.Edits.Env = append(plan.Edits.Env, "GANTRY_TEST=1", "A=2")
	return plan
}

// specCases are config.json files patchSpec must edit exactly as the whole
// spec's round trip does: the engines' usual ones, and the corners (fields
// absent or null, a node, a mount and an allow rule already there, a
// non-root user, fields this build does not know, big numbers).
var specCases = map[string]string{
	"minimal": `{"ociVersion":"1.2.0","process":{"env":["PATH=/bin","NVIDIA_VISIBLE_DEVICES=all"],"cwd":"/","user":{"uid":0,"gid":0}},"root":{"path":"rootfs"},"linux":{"namespaces":[{"type":"mount"}]}}`,
	"runc spec": `{
	"ociVersion": "1.0.2-dev",
	"process": {"terminal": false, "user": {"uid": 0, "gid": 0}, "args": ["sh"],
		"env": ["PATH=/usr/bin:/bin", "TERM=xterm", "NVIDIA_VISIBLE_DEVICES=all"], "cwd": "/",
		"capabilities": {"bounding": ["CAP_KILL"], "effective": ["CAP_KILL"], "permitted": ["CAP_KILL"]},
		"rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}], "noNewPrivileges": true},
	"root": {"path": "rootfs", "readonly": true},
	"hostname": "runc",
	"mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
		{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}],
	"linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]},
		"namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
		"maskedPaths": ["/proc/kcore"], "readonlyPaths": ["/proc/sys"]}
}`,
	"already there": `{"process":{"env":["NVIDIA_DRIVER_CAPABILITIES=all","PATH=/bin"]},"root":{"path":"r"},
	"mounts":[{"destination":"/usr/bin/nvidia-smi","type":"bind","source":"/elsewhere","options":["rbind"]},{"destination":"/tmp","type":"tmpfs","source":"tmpfs"}],
	"linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":1,"minor":1},{"path":"/dev/fuse","type":"c","major":10,"minor":229}],
		"resources":{"devices":[{"allow":false,"access":"rwm"},{"allow":true,"type":"c","major":195,"minor":255,"access":"rwm"}]}},
	"annotations":{"a":"b"}}`,
	"non-root user": `{"process":{"env":[],"user":{"uid":1000,"gid":1001,"additionalGids":[5]}},"root":{"path":"r"},"linux":{"resources":{"memory":{"limit":9007199254740993}}}}`,
	"absent":        `{"root":{"path":"r"}}`,
	"empty arrays": `{"mounts":[ ],"linux":{"devices":[],"resources":{"devices":[
	]}},"root":{"path":"r"},"process":{"env":[]}}`,
	"nulls":        `{"process":null,"mounts":null,"linux":{"devices":null,"resources":null},"annotations":null,"root":{"path":"r"}}`,
	"no resources": `{"process":{"env":["A=1"]},"root":{"path":"r"},"linux":{"namespaces":[{"type":"mount"}]}}`,
	"unknown fields": `{"ociVersion":"1.9.0","x-top":{"n":12345678901234567890,"f":1.50},
	"process":{"env":["A=1"],"x-proc":[1,2]},"root":{"path":"r"},
	"mounts":[{"destination":"/data","type":"bind","source":"/srv","x-mount":"kept"}],
	"linux":{"x-linux":true,"devices":[{"path":"/dev/fuse","type":"c","major":10,"minor":229,"x-dev":1}],
		"resources":{"x-res":"r","devices":[{"allow":false,"access":"rwm","x-rule":2}]}}}`,
}

// patchSpec gives the spec the whole round trip (fullSpec) gives, for every
// case and kind of plan; what it leaves alone is byte for byte the engine's
// (fields this build does not know, even inside a mount or a device entry,
// and numbers that do not fit a float64).
func TestPatchSpecMatchesFullSpec(t *testing.T) {
	plans := map[string]*inject.Plan{
		"all":        testPlan(t, "all", false),
		"one":        testPlan(t, "1", false),
		"no-cgroups": testPlan(t, "all", true),
	}
	for name, doc := range specCases {
		for pname, plan := range plans {
			t.Run(name+"/"+pname, func(t *testing.T) {
				top, err := decodeObject([]byte(doc))
				if err != nil {
					t.Fatal(err)
				}
				patched, err := patchSpec(top, plan)
				if err != nil {
					t.Fatalf("patchSpec: %v", err)
				}
				full, err := fullSpec([]byte(doc), plan)
				if err != nil {
					t.Fatalf("fullSpec: %v", err)
				}
				var a, b ocispecs.Spec
				if err := json.Unmarshal(patched, &a); err != nil {
					t.Fatalf("patched spec: %v\n%s", err, patched)
				}
				if err := json.Unmarshal(full, &b); err != nil {
					t.Fatal(err)
				}
				// Compared encoded, where an empty list and none are the
				// same (the round trip drops a "devices": [] the patch keeps).
				ja, _ := json.Marshal(&a)
				jb, _ := json.Marshal(&b)
				if string(ja) != string(jb) {
					t.Errorf("patched spec differs from the round trip:\npatched %s\nfull    %s", patched, full)
				}
				// Untyped, numbers as written: apart from the fields the
				// edits own, the patched spec is the engine's.
				if ga, gb := stripEdited(generic(t, patched)), stripEdited(generic(t, []byte(doc))); !reflect.DeepEqual(ga, gb) {
					t.Errorf("patched spec changed fields the edits do not own:\npatched %v\nengine's %v", ga, gb)
				}
				if name == "unknown fields" {
					for _, keep := range []string{`"x-top":{"n":12345678901234567890,"f":1.50}`, `"x-proc":[1,2]`, `"x-mount":"kept"`, `"x-linux":true`, `"x-dev":1`, `"x-res":"r"`, `"x-rule":2`, `"ociVersion":"1.9.0"`} {
						if !strings.Contains(string(patched), keep) {
							t.Errorf("patched spec lost %s:\n%s", keep, patched)
						}
					}
				}
				if name == "non-root user" && !strings.Contains(string(patched), "9007199254740993") {
					t.Errorf("patched spec changed a big number:\n%s", patched)
				}
			})
		}
	}
}

// stripEdited removes from an untyped spec the fields edits write:
// annotations, mounts, process.env, linux.devices,
// linux.resources.devices, and the objects left empty (or null: the edits
// may fill them) by that.
func stripEdited(v any) any {
	top, _ := v.(map[string]any)
	delete(top, "annotations")
	delete(top, "mounts")
	for _, k := range []string{"process", "linux"} {
		if o, ok := top[k].(map[string]any); ok {
			delete(o, "env")
			delete(o, "devices")
			if r, ok := o["resources"].(map[string]any); ok {
				delete(r, "devices")
				if len(r) == 0 {
					delete(o, "resources")
				}
			} else if o["resources"] == nil {
				delete(o, "resources")
			}
			if len(o) == 0 {
				delete(top, k)
			}
		} else if top[k] == nil {
			delete(top, k)
		}
	}
	return top
}

func generic(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Where the patch cannot tell which field a runtime would read (a name in
// two spellings: encoding/json matches names regardless of case) or the
// plan edits more than its fields (other vendors' CDI devices), it gives
// way to the whole spec; malformed fields it edits are errors.
func TestPatchSpecGivesWay(t *testing.T) {
	plan := testPlan(t, "all", false)
	for _, doc := range []string{
		`{"process":{"env":["A=1"],"Env":["B=2"]},"root":{"path":"r"}}`,
		`{"Linux":{},"linux":{},"root":{"path":"r"}}`,
		`{"linux":{"resources":{"Devices":[],"devices":[]}},"root":{"path":"r"}}`,
		`{"MOUNTS":[],"root":{"path":"r"}}`,
		// A name twice: runc's decoder merges the objects (the first
		// one's maskedPaths stay), a map of raw values keeps the last.
		`{"linux":{"maskedPaths":["/proc/kcore"]},"root":{"path":"r"},"linux":{"namespaces":[{"type":"mount"}]}}`,
		`{"process":{"env":["A=1"],"capabilities":{"bounding":["CAP_KILL"]},"capabilities":{"effective":["CAP_KILL"]}},"root":{"path":"r"}}`,
		`{"linux":{"resources":{"devices":[],"memory":{"limit":1},"memory":{"swap":2}}},"root":{"path":"r"}}`,
		`{"linux":{"devices":[],"devices":[{"path":"/dev/fuse","type":"c","major":10,"minor":229}]},"root":{"path":"r"}}`,
	} {
		top, err := decodeObject([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := patchSpec(top, plan); !errors.Is(err, errNoPatch) {
			t.Errorf("%s: %v, want errNoPatch", doc, err)
		}
	}
	for _, doc := range []string{
		`{"linux":"x","root":{"path":"r"}}`,
		`{"mounts":{},"root":{"path":"r"}}`,
		`{"process":{"env":"A=1"},"root":{"path":"r"}}`,
		`{"linux":{"devices":[{"major":"x"}]},"root":{"path":"r"}}`,
	} {
		top, err := decodeObject([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := patchSpec(top, plan); err == nil || errors.Is(err, errNoPatch) {
			t.Errorf("%s: %v, want a decoding error", doc, err)
		}
	}
	withCDI := *plan
	withCDI.CDI = []string{"vendor.com/x=a"}
	top, _ := decodeObject([]byte(specCases["minimal"]))
	if _, err := patchSpec(top, &withCDI); !errors.Is(err, errNoPatch) {
		t.Errorf("other vendors' CDI devices: %v, want errNoPatch", err)
	}
}

func TestMembers(t *testing.T) {
	for doc, want := range map[string]int{
		`{}`: 0, " { \n } ": 0, `{"a":1}`: 1, `{"a,b":"},{\"x\":[1,2]","b":{"c":[1,{"d":2}]},"c":null}`: 3,
		`{"a":"\\","b":2}`: 2, `{"a":1,"a":2}`: 2,
	} {
		if got := members([]byte(doc)); got != want {
			t.Errorf("members(%s) = %d, want %d", doc, got, want)
		}
	}
}
