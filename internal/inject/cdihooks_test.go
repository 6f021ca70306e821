package inject

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/cdiindex"
	"github.com/gantry-gpu/gantry/internal/edits"
)

// Another vendor's spec whose hook names a relative path is refused:
// runc and crun run hooks from the container's root filesystem, so
// `path: evilhook` runs the image's file as host root (runc 1.1.5 and
// 1.5.2, reproduced in the review of sec1). An absolute hook is injected,
// with the fixed env when it has none.
func TestInjectCDIRefusesRelativeHooks(t *testing.T) {
	dir := t.TempDir()
	spec := func(path string) string {
		return "cdiVersion: 0.5.0\nkind: example.com/fpga\ndevices:\n- name: f0\n  containerEdits:\n    deviceNodes:\n    - path: /dev/null\n    hooks:\n    - hookName: createContainer\n      path: " + path + "\n      args: [hook]\n"
	}
	file := filepath.Join(dir, "fpga.yaml")
	for _, tc := range []struct{ path, err string }{
		{"evilhook", `the relative path "evilhook"`},
		{"./bin/evilhook", `the relative path "./bin/evilhook"`},
		{"/usr/bin/fpga-hook", ""},
	} {
		if err := os.WriteFile(file, []byte(spec(tc.path)), 0o644); err != nil {
			t.Fatal(err)
		}
		oci := &ocispecs.Spec{Process: &ocispecs.Process{Env: []string{"LD_PRELOAD=/evil.so"}}}
		err := injectCDI(oci, cdiindex.Options{Dirs: []string{dir}, CacheDir: t.TempDir()}, []string{"example.com/fpga=f0"})
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), file) {
				t.Errorf("%s: %v", tc.path, err)
			}
			if oci.Hooks != nil && len(oci.Hooks.CreateContainer) > 0 {
				t.Errorf("%s: injected %+v", tc.path, oci.Hooks.CreateContainer)
			}
			continue
		}
		if err != nil || oci.Hooks == nil || len(oci.Hooks.CreateContainer) != 1 || strings.Join(oci.Hooks.CreateContainer[0].Env, " ") != edits.HookPATH {
			t.Errorf("%s: %v %+v", tc.path, err, oci.Hooks)
		}
	}
}
