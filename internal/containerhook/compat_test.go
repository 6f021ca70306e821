package containerhook

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// CUDA forward compatibility through the update-ldcache hook: with the
// host driver's version, an image whose /usr/local/cuda/compat holds a
// newer libcuda gets that one from the real loader; an older or same-major
// one, or no version given, leaves the host driver's libcuda in charge.
func TestForwardCompatThroughTheLoader(t *testing.T) {
	for _, tc := range []struct {
		name, compat, host, want string
	}{
		{"newer compat wins", "libcuda.so.999.1.1", "580.159.04", "1"},
		{"same major: host driver", "libcuda.so.580.0.1", "580.159.04", wantVersion},
		{"older compat: host driver", "libcuda.so.100.1.1", "580.159.04", wantVersion},
		{"no host version: no compat", "libcuda.so.999.1.1", "", wantVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := imageRoot(t, func(dir string) {
				mkdirs(t, dir, CompatDir)
				copyFile(t, filepath.Join(artifacts, stubLib), filepath.Join(dir, CompatDir, tc.compat))
			})
			r := openRoot(t, dir)
			l, err := ParseLink(driverLib + "::" + nvDir + "/libcuda.so.1")
			if err != nil {
				t.Fatal(err)
			}
			if err := CreateSymlinks(r, []Link{l}); err != nil {
				t.Fatal(err)
			}
			if err := UpdateLDCacheCompat(r, []string{nvDir}, tc.host, nil); err != nil {
				t.Fatal(err)
			}
			if out, err := probe(t, dir); err != nil || out != tc.want {
				t.Errorf("probe: %q, %v; want %s", out, err, tc.want)
			}
			conf, _ := os.ReadFile(filepath.Join(dir, ConfFile))
			if first := strings.Contains(string(conf), "\n"+CompatDir+"\n"); first != (tc.want == "1") {
				t.Errorf("%s lists %s: %v, want %v", ConfFile, CompatDir, first, tc.want == "1")
			}
		})
	}
}

// ForwardCompat refuses to guess: several libcuda versions, or a version it
// cannot read, mean no compat libraries.
func TestForwardCompatAmbiguous(t *testing.T) {
	dir := basicRoot(t)
	mkdirs(t, dir, CompatDir)
	for _, n := range []string{"libcuda.so.999.1.1", "libcuda.so.998.1.1"} {
		copyFile(t, filepath.Join(artifacts, stubLib), filepath.Join(dir, CompatDir, n))
	}
	libs, why, err := ForwardCompat(openRoot(t, dir), "580.159.04")
	if err != nil || len(libs) != 0 || !strings.Contains(why, "exactly one") {
		t.Errorf("two compat versions: %v, %q, %v", libs, why, err)
	}
	if _, _, err := ForwardCompat(openRoot(t, dir), "bogus"); err == nil {
		t.Error("a bogus host version was accepted")
	}
}
