package engineconfig

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// addSeeds adds every input fixture with the given suffix.
func addSeeds(f *testing.F, glob string, extra ...string) {
	files, _ := filepath.Glob(filepath.Join("testdata", "in", glob))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, true)
	}
	for _, s := range extra {
		f.Add([]byte(s), false)
	}
}

// checkPlan is the fuzz property: Plan never panics; when it succeeds, its
// output plans to itself with no changes, with or without SetAsDefault.
func checkPlan(t *testing.T, e Engine, data []byte, setDefault bool) {
	opts := gantryOpts
	opts.SetAsDefault = setDefault
	out, changes, err := Plan(e, data, opts)
	if err != nil {
		return
	}
	if len(changes) == 0 && !bytes.Equal(out, data) {
		t.Fatalf("no changes but output differs")
	}
	again, changes2, err := Plan(e, out, opts)
	if err != nil {
		t.Fatalf("Plan rejects its own output: %v\ninput:\n%s\noutput:\n%s", err, data, out)
	}
	if len(changes2) != 0 || !bytes.Equal(again, out) {
		t.Fatalf("second Plan not a no-op: %q\ninput:\n%s\noutput:\n%s\nagain:\n%s", changes2, data, out, again)
	}
	// The diff of any change must be well formed enough to be non-empty.
	if len(changes) > 0 && !bytes.Equal(out, data) && unifiedDiff("a", "b", data, out) == "" {
		t.Fatal("empty diff for a change")
	}
}

func FuzzPlanDocker(f *testing.F) {
	addSeeds(f, "*.json", "", "{}", "null", `{"runtimes":{"nvidia":7}}`, `{"runtimes":{"nvidia":{"path":1}}}`,
		`{"default-runtime":5,"a":"\u003c"}`, "{\"a\":\n[1,\n2]}")
	f.Fuzz(func(t *testing.T, data []byte, setDefault bool) {
		checkPlan(t, Docker, data, setDefault)
	})
}

func FuzzPlanContainerd(f *testing.F) {
	addSeeds(f, "containerd-*.toml", "", "version = 3\n", "version = 2\nplugins = 1\n",
		"version=2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\noptions.BinaryName = \"x\"\n",
		"version = 2 # c\n[a]\nb = \"\"\"\n[x]\n\"\"\"\n", "version = 2\n[[plugins]]\n")
	f.Fuzz(func(t *testing.T, data []byte, setDefault bool) {
		checkPlan(t, Containerd, data, setDefault)
	})
}

func FuzzPlanCRIO(f *testing.F) {
	addSeeds(f, "crio-*.toml", "", "[crio]\nruntime = {}\n", "crio.runtime.default_runtime = 'x'\n")
	f.Fuzz(func(t *testing.T, data []byte, setDefault bool) {
		checkPlan(t, CRIO, data, setDefault)
	})
}
