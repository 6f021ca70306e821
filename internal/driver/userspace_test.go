package driver_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

// The loader's libnvidia-ml.so.1 and libcuda.so.1 and the version of the
// files they lead to, in both layouts; without the cache the library
// directories are searched; a root without them lists none.
func TestLoaderLibraries(t *testing.T) {
	for _, layout := range []string{fakedriver.LayoutStandard, fakedriver.LayoutGKE} {
		t.Run(layout, func(t *testing.T) {
			root, res := buildRoot(t, fakedriver.Options{Version: "560.35.03", Layout: layout, GPUs: 1, Compat32: true})
			check := func() {
				t.Helper()
				libs := driver.LoaderLibraries(root)
				if len(libs) != 2 || libs[0].SONAME != "libnvidia-ml.so.1" || libs[1].SONAME != "libcuda.so.1" {
					t.Fatalf("%+v", libs)
				}
				for _, l := range libs {
					if l.Version != res.Version || filepath.Dir(l.Path) != res.LibDir {
						t.Errorf("%s: %+v, want version %s in %s", l.SONAME, l, res.Version, res.LibDir)
					}
				}
			}
			check()
			if err := os.Remove(filepath.Join(root, "etc/ld.so.cache")); err != nil {
				t.Fatal(err)
			}
			check()
		})
	}
	if libs := driver.LoaderLibraries(t.TempDir()); len(libs) != 0 {
		t.Errorf("empty root: %+v", libs)
	}
}
