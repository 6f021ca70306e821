package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    func(Config) bool
		wantErr string
	}{
		{name: "empty is defaults", in: "", want: func(c Config) bool { return c.GPUs == "nvml" && c.DriverRoot == "/" && c.CDI.Kind == "nvidia.com/gpu" }},
		{name: "sim profile", in: `gpus = "sim:h100x8"`, want: func(c Config) bool { return c.GPUs == "sim:h100x8" }},
		{name: "nested", in: "driver-root = \"/run/nvidia/driver\"\n[cdi]\nkind = \"example.com/gpu\"\n", want: func(c Config) bool {
			return c.DriverRoot == "/run/nvidia/driver" && c.CDI.Kind == "example.com/gpu" && len(c.CDI.SpecDirs) == 2
		}},
		{name: "unknown key", in: `gpu = "nvml"`, wantErr: "unknown key gpu"},
		{name: "unknown nested key", in: "[cdi]\nkinds = \"x\"\n", wantErr: "unknown key cdi.kinds"},
		{name: "bad backend", in: `gpus = "cuda"`, wantErr: `key gpus: "cuda" is not a GPU backend`},
		{name: "empty sim", in: `gpus = "sim:"`, wantErr: "key gpus"},
		{name: "relative root", in: `driver-root = "run/nvidia"`, wantErr: "key driver-root"},
		{name: "bad level", in: `log-level = "loud"`, wantErr: "key log-level"},
		{name: "bad kind", in: "[cdi]\nkind = \"gpu\"\n", wantErr: "key cdi.kind"},
		{name: "host-wide request rules", in: "[runtime]\ndisable-require = true\nswarm-resource = [\"DOCKER_RESOURCE_GPU\"]\n[cdi]\nannotation-prefixes = [\"cdi.k8s.io/\", \"example.com/cdi-\"]\n", want: func(c Config) bool {
			return c.Runtime.DisableRequire && len(c.Runtime.SwarmResource) == 1 && c.Runtime.SwarmResource[0] == "DOCKER_RESOURCE_GPU" &&
				len(c.CDI.AnnotationPrefixes) == 2 && c.CDI.AnnotationPrefixes[1] == "example.com/cdi-"
		}},
		{name: "default annotation prefix", in: "", want: func(c Config) bool {
			return len(c.CDI.AnnotationPrefixes) == 1 && c.CDI.AnnotationPrefixes[0] == "cdi.k8s.io/" && !c.Runtime.DisableRequire
		}},
		{name: "bad swarm variable", in: "[runtime]\nswarm-resource = [\"DOCKER RESOURCE\"]\n", wantErr: "key runtime.swarm-resource"},
		{name: "swarm resource not a list", in: "[runtime]\nswarm-resource = \"DOCKER_RESOURCE_GPU\"\n", wantErr: "line 2"},
		{name: "empty annotation prefix", in: "[cdi]\nannotation-prefixes = [\"\"]\n", wantErr: "key cdi.annotation-prefixes"},
		{name: "syntax", in: "gpus = \n", wantErr: "line 1"},
		{name: "wrong type", in: "gpus = 3\n", wantErr: "line 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) error = %v, want containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			if !tt.want(c) {
				t.Fatalf("Parse(%q) = %+v", tt.in, c)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvPath, "")
	if _, _, err := Load(filepath.Join(dir, "missing.toml")); err == nil {
		t.Fatal("explicit missing file must be an error")
	}
	p := filepath.Join(dir, "c.toml")
	if err := os.WriteFile(p, []byte(`gpus = "sim:h100x1"`), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvPath, p)
	c, used, err := Load("")
	if err != nil || used != p || c.GPUs != "sim:h100x1" {
		t.Fatalf("Load via env = %+v, %q, %v", c, used, err)
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	c := Default()
	c.LibrarySearchPaths = []string{"/opt/nvidia/lib"}
	b, err := c.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(b)
	if err != nil {
		t.Fatalf("Parse(Encode()): %v\n%s", err, b)
	}
	if got.LibrarySearchPaths[0] != "/opt/nvidia/lib" || got.CDI.Kind != c.CDI.Kind {
		t.Fatalf("round trip = %+v", got)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`gpus = "sim:h100x8"`))
	f.Add([]byte("[cdi]\nkind = \"a.com/b\"\nspec-dirs = [\"/x\"]\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err == nil {
			if verr := c.Validate(); verr != nil {
				t.Fatalf("Parse accepted an invalid config: %v", verr)
			}
		}
	})
}

// GANTRY_CONFIG=/dev/null means the defaults.
func TestLoadDevNull(t *testing.T) {
	c, _, err := Load("/dev/null")
	if err != nil || c.CDI.Kind != Default().CDI.Kind {
		t.Fatalf("Load(/dev/null) = %+v, %v; want the defaults", c, err)
	}
}

// A configuration path that is not a small regular file (the image's
// GANTRY_CONFIG reaching a program, a mistake in a unit file) is refused at
// once with the path named: /dev/zero is not read until memory runs out,
// and a FIFO does not block the caller.
func TestLoadRefusesNonRegularAndHuge(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.toml")
	if err := os.WriteFile(huge, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, MaxFileSize+1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{"/dev/zero", "not a regular file"},
		{fifo, "not a regular file"},
		{dir, "not a regular file"},
		{huge, "over the 1048576-byte limit"},
	} {
		done := make(chan error, 1)
		go func() {
			_, _, err := Load(c.path)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), c.path) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Load(%s) = %v, want an error naming the path and %q", c.path, err, c.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Load(%s) still blocked after 10s", c.path)
		}
	}
}
