package engineconfig

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const dropInMainV2 = `# the site's containerd
version = 2
root = "/var/lib/containerd"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.example/pause:3.9"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true
`

func readT(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestContainerdDropIn(t *testing.T) {
	for _, tc := range []struct {
		name, main, plugin string
		version            int64
	}{
		{"v2", dropInMainV2, "io.containerd.grpc.v1.cri", 2},
		{"v3", strings.ReplaceAll(strings.Replace(dropInMainV2, "version = 2", "version = 3", 1), "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"), "io.containerd.cri.v1.runtime", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			mainPath := filepath.Join(dir, "config.toml")
			dropIn := filepath.Join(dir, "conf.d", "99-nvidia.toml")
			if err := os.WriteFile(mainPath, []byte(tc.main), 0o600); err != nil {
				t.Fatal(err)
			}
			opts := Options{RuntimeName: "nvidia", EnableCDI: true}
			if tc.version == 3 {
				// The containerd on PATH may be 1.x, which cannot read
				// version 3 (TestEngineCheck covers that refusal).
				opts.SkipEngineCheck = true
			}
			// A dry run shows both files and writes neither.
			files, err := ApplyContainerdDropIn(mainPath, dropIn, opts, true)
			if err != nil || len(files) != 2 {
				t.Fatalf("dry run: %v %+v", err, files)
			}
			if readT(t, mainPath) != tc.main {
				t.Fatal("dry run changed the main file")
			}
			if _, err := os.Stat(dropIn); !os.IsNotExist(err) {
				t.Fatalf("dry run wrote the drop-in: %v", err)
			}
			files, err = ApplyContainerdDropIn(mainPath, dropIn, opts, false)
			if err != nil || len(files) != 2 || files[0].Path != dropIn || files[1].Path != mainPath {
				t.Fatalf("%v %+v", err, files)
			}
			main := readT(t, mainPath)
			if !strings.HasPrefix(main, "# the site's containerd\n") || !strings.Contains(main, `imports = ["`+filepath.Join(dir, "conf.d")+`/*.toml"]`) {
				t.Errorf("main file:\n%s", main)
			}
			if fi, _ := os.Stat(mainPath); fi.Mode().Perm() != 0o600 {
				t.Errorf("main file mode %v, want 0600 kept", fi.Mode().Perm())
			}
			// The drop-in, as containerd reads it: the main file's CRI
			// section (it replaces it wholesale before containerd 2.1) with
			// the runtime, runc's options copied, CDI on.
			doc, err := decodeTOML([]byte(readT(t, dropIn)))
			if err != nil {
				t.Fatal(err)
			}
			if doc["version"] != tc.version {
				t.Errorf("drop-in version %v, want %d", doc["version"], tc.version)
			}
			for path, want := range map[string]any{
				"sandbox_image":                   "registry.example/pause:3.9",
				"enable_cdi":                      true,
				"containerd.default_runtime_name": "runc",
				"containerd.runtimes.runc.options.SystemdCgroup":   true,
				"containerd.runtimes.nvidia.runtime_type":          "io.containerd.runc.v2",
				"containerd.runtimes.nvidia.options.BinaryName":    DefaultRuntimePath,
				"containerd.runtimes.nvidia.options.SystemdCgroup": true,
			} {
				got, _, _ := lookup(doc, append([]string{"plugins", tc.plugin}, strings.Split(path, ".")...))
				if got != want {
					t.Errorf("drop-in %s = %v, want %v", path, got, want)
				}
			}
			if _, ok := doc["root"]; ok {
				t.Error("the drop-in copies more than the CRI section")
			}
			// Idempotent: nothing to change, nothing written.
			dropBefore := readT(t, dropIn)
			files, err = ApplyContainerdDropIn(mainPath, dropIn, opts, false)
			if err != nil || len(files) != 0 || readT(t, dropIn) != dropBefore || readT(t, mainPath) != main {
				t.Errorf("second run: %v %+v", err, files)
			}
			if names := listDir(t, filepath.Dir(dropIn)); len(names) != 1 {
				t.Errorf("stray files: %v", names)
			}
			// A later edit of the main file's CRI section is carried into
			// the drop-in by the next run.
			edited := strings.Replace(main, "pause:3.9", "pause:3.10", 1)
			if err := os.WriteFile(mainPath, []byte(edited), 0o600); err != nil {
				t.Fatal(err)
			}
			files, err = ApplyContainerdDropIn(mainPath, dropIn, opts, false)
			if err != nil || len(files) != 1 || files[0].Path != dropIn || !strings.Contains(readT(t, dropIn), "pause:3.10") || readT(t, mainPath) != edited {
				t.Errorf("after editing the main file: %v %+v\n%s", err, files, readT(t, dropIn))
			}
		})
	}
}

func TestContainerdDropInImports(t *testing.T) {
	dir := t.TempDir()
	dropIn := filepath.Join(dir, "conf.d", "99-nvidia.toml")
	for _, tc := range []struct {
		name, main string
		// want is the main file afterwards; "" for unchanged.
		want string
	}{
		{"missing", "", "version = 2\nimports = [\"" + filepath.Join(dir, "conf.d") + "/*.toml\"]\n"},
		{"relative pattern covers it", "version = 2\nimports = [\"conf.d/*.toml\"]\n", ""},
		{"the file itself", "version = 2\nimports = [\"" + dropIn + "\"]\n", ""},
		{"another import kept", "version = 2\nimports = [\"/opt/site/*.toml\"]\n", "version = 2\nimports = [\"/opt/site/*.toml\", \"" + filepath.Join(dir, "conf.d") + "/*.toml\"]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mainPath := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".toml")
			if tc.main != "" {
				if err := os.WriteFile(mainPath, []byte(tc.main), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := ApplyContainerdDropIn(mainPath, dropIn, Options{}, false); err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want == "" {
				want = tc.main
			}
			if got := readT(t, mainPath); got != want {
				t.Errorf("main file:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func TestContainerdDropInRefuses(t *testing.T) {
	dir := t.TempDir()
	mainPath := filepath.Join(dir, "config.toml")
	for _, tc := range []struct {
		name, main, dropIn string
		want               error
	}{
		{"relative drop-in", "version = 2\n", "conf.d/99-nvidia.toml", ErrInvalidOptions},
		{"version 1", "[plugins.cri]\n", filepath.Join(dir, "conf.d/99.toml"), ErrUnsupportedVersion},
		{"bad TOML", "version = \n", filepath.Join(dir, "conf.d/99.toml"), ErrMalformed},
		{"imports not a list", "version = 2\nimports = \"x\"\n", filepath.Join(dir, "conf.d/99.toml"), ErrMalformed},
		{"the main file itself", "version = 2\n", mainPath, ErrInvalidOptions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(mainPath, []byte(tc.main), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ApplyContainerdDropIn(mainPath, tc.dropIn, Options{}, false)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if readT(t, mainPath) != tc.main {
				t.Error("main file changed")
			}
			if _, err := os.Stat(filepath.Join(dir, "conf.d")); err == nil {
				t.Error("drop-in directory made")
			}
		})
	}
}

// TestContainerdDropInRealContainerd has containerd itself read the two
// files (`containerd config dump` merges the imports as the daemon does):
// the runtime must be there with Gantry's binary, and the main file's CRI
// settings must survive containerd's plugin-by-plugin merge.
func TestContainerdDropInRealContainerd(t *testing.T) {
	bin, err := exec.LookPath("containerd")
	if err != nil {
		t.Skip("containerd not installed (apt-get install containerd)")
	}
	dir := t.TempDir()
	mainPath := filepath.Join(dir, "config.toml")
	dropIn := filepath.Join(dir, "conf.d", "99-nvidia.toml")
	if err := os.WriteFile(mainPath, []byte(dropInMainV2), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyContainerdDropIn(mainPath, dropIn, Options{RuntimeName: "nvidia", SetAsDefault: true}, false); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--config", mainPath, "config", "dump").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd config dump: %v\n%s", err, out)
	}
	dump, err := decodeTOML(bytes.TrimSpace(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	cri := []string{"plugins", "io.containerd.grpc.v1.cri"}
	for path, want := range map[string]any{
		"sandbox_image":                                    "registry.example/pause:3.9",
		"containerd.default_runtime_name":                  "nvidia",
		"containerd.runtimes.nvidia.runtime_type":          "io.containerd.runc.v2",
		"containerd.runtimes.nvidia.options.BinaryName":    DefaultRuntimePath,
		"containerd.runtimes.nvidia.options.SystemdCgroup": true,
		"containerd.runtimes.runc.options.SystemdCgroup":   true,
	} {
		got, _, _ := lookup(dump, append(append([]string{}, cri...), strings.Split(path, ".")...))
		if got != want {
			t.Errorf("containerd sees %s = %v, want %v\n%s", path, got, want, out)
		}
	}
}

// TestContainerdDropInReadBack: what the main file and its imports
// register, read as doctor reads them, must be what was asked; otherwise
// nothing is written.
func TestContainerdDropInReadBack(t *testing.T) {
	dir := t.TempDir()
	mainPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(mainPath, []byte("version = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A drop-in the added import (conf.d/*.toml) would not cover.
	if _, err := ApplyContainerdDropIn(mainPath, filepath.Join(dir, "conf.d", "99-nvidia.conf"), Options{}, true); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("a drop-in no import covers: %v", err)
	}
	// An import read after the drop-in redefines the runtime.
	later := filepath.Join(dir, "conf.d", "zz-site.toml")
	if err := os.MkdirAll(filepath.Dir(later), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(later, []byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\nBinaryName = \"/opt/other\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dropIn := filepath.Join(dir, "conf.d", "99-nvidia.toml")
	_, err := ApplyContainerdDropIn(mainPath, dropIn, Options{}, false)
	if err == nil || !strings.Contains(err.Error(), later) {
		t.Errorf("a later import overriding the runtime: %v", err)
	}
	// A broken import: containerd would not start.
	if err := os.WriteFile(later, []byte("version = \n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = ApplyContainerdDropIn(mainPath, dropIn, Options{}, false)
	var ie *ImportError
	if !errors.As(err, &ie) || ie.File != later {
		t.Errorf("a broken import: %v", err)
	}
	if readT(t, mainPath) != "version = 2\n" {
		t.Error("main file changed")
	}
	if _, err := os.Stat(dropIn); err == nil {
		t.Error("drop-in written")
	}
	// Without it, the drop-in is read back with the runtime.
	if err := os.Remove(later); err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyContainerdDropIn(mainPath, dropIn, Options{}, false); err != nil {
		t.Fatal(err)
	}
	got, files, err := ReadContainerd(mainPath)
	if rt, ok := got.Runtime(DefaultRuntimeName); err != nil || !ok || rt.Program != DefaultRuntimePath || len(files) != 2 {
		t.Errorf("read back: %+v %v %v", got, files, err)
	}
}
