package inject

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/cdiindex"
)

// A create that names another vendor's device reads the spec directories
// bounded (issue 27: a 1 GiB spec cost 70 s and 3.4 GB per create): a spec
// over the size limit is not parsed, and a device it defines is refused with
// an error naming the file; the others' devices are injected, each hook
// given the fixed environment.
func TestInjectCDIBounds(t *testing.T) {
	dir := t.TempDir()
	small := "cdiVersion: \"0.6.0\"\nkind: example.com/fpga\ndevices:\n- name: f0\n  containerEdits:\n    env: [\"FPGA=f0\"]\n    hooks:\n    - hookName: createContainer\n      path: /usr/bin/true\n"
	big := "cdiVersion: \"0.6.0\"\nkind: example.com/big\ndevices:\n- name: b0\n  containerEdits:\n    env: [\"BIG=b0\"]\n# " + strings.Repeat("x", cdiindex.DefaultMaxSpecSize) + "\n"
	// The oversized spec in the lower-priority directory (as /etc/cdi
	// under /var/run/cdi): a device of a higher one is still served (one
	// of the same or a lower priority is refused, cdiindex TestBoundRefusal).
	low := t.TempDir()
	for p, s := range map[string]string{filepath.Join(dir, "fpga.yaml"): small, filepath.Join(low, "big.yaml"): big} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	o := cdiindex.Options{Dirs: []string{low, dir}, CacheDir: t.TempDir()}
	spec := &ocispecs.Spec{Process: &ocispecs.Process{}}
	if err := injectCDI(spec, o, []string{"example.com/fpga=f0"}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(spec.Process.Env, "FPGA=f0") || spec.Hooks == nil || len(spec.Hooks.CreateContainer) != 1 || len(spec.Hooks.CreateContainer[0].Env) == 0 {
		t.Errorf("the device's edits: env %q, hooks %+v", spec.Process.Env, spec.Hooks)
	}
	err := injectCDI(&ocispecs.Spec{Process: &ocispecs.Process{}}, o, []string{"example.com/big=b0"})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(low, "big.yaml")) {
		t.Errorf("a device of an oversized spec: %v; want an error naming %s", err, filepath.Join(low, "big.yaml"))
	}
}
