package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/config"
)

// nvidiaFile is a config.toml as NVIDIA's toolkit (1.18) writes it, with the
// driver root of a driver container and a log file set.
func nvidiaFile(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../config/testdata/nvidia/ctk-1.18.toml")
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), `#root = "/run/nvidia/driver"`, `root = "/run/nvidia/driver"`, 1)
	s = strings.Replace(s, `#debug = "/var/log/nvidia-container-runtime.log"`, `debug = "/var/log/nvidia-container-runtime.log"`, 1)
	s = strings.Replace(s, "disable-require = false", "disable-require = true", 1)
	s = strings.Replace(s, `supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"`, `supported-driver-capabilities = "compute,utility"`, 1)
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigMigrate(t *testing.T) {
	src := nvidiaFile(t)
	out, errOut, code := run("config", "migrate", src)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	c, err := config.Parse([]byte(out))
	if err != nil {
		t.Fatalf("the printed configuration does not load: %v\n%s", err, out)
	}
	if c.DriverRoot != "/run/nvidia/driver" || c.Runtime.LogFile != "/var/log/nvidia-container-runtime.log" || c.LogLevel != "info" || !c.Runtime.DisableRequire {
		t.Errorf("migrated config %+v", c)
	}
	for _, want := range []string{"nvidia-container-cli.root = '/run/nvidia/driver' -> driver-root", "nvidia-container-cli.ldconfig = '@/sbin/ldconfig': Gantry never runs ldconfig"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// What containers would notice is also a warning on stderr.
	if !strings.Contains(errOut, "warning: "+src+": supported-driver-capabilities = 'compute,utility': ") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("stderr: want one warning about supported-driver-capabilities, got:\n%s", errOut)
	}

	// NVIDIA's variable names the default file.
	t.Setenv(config.NVIDIAEnvPath, src)
	if out2, _, code := run("config", "migrate"); code != 0 || out2 != out {
		t.Errorf("with %s set: exit %d, output differs: %v", config.NVIDIAEnvPath, code, out2 != out)
	}
}

func TestConfigMigrateWrite(t *testing.T) {
	src := nvidiaFile(t)
	dst := filepath.Join(t.TempDir(), "etc", "gantry", "config.toml")
	out, errOut, code := run("config", "migrate", "--write", dst, src)
	if code != 0 || out != "" || !strings.Contains(errOut, "wrote "+dst) {
		t.Fatalf("--write: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Gantry's own loader takes the file, as every Gantry binary will.
	c, used, err := config.Load(dst)
	if err != nil || used != dst || c.DriverRoot != "/run/nvidia/driver" {
		t.Fatalf("config.Load(%s): %+v %v", dst, c, err)
	}
	before, _ := os.ReadFile(dst)

	_, errOut, code = run("config", "migrate", "--write", dst, src)
	if code != 1 || !strings.Contains(errOut, dst+" exists; not replaced (add --force") {
		t.Fatalf("second --write without --force: exit %d, %s", code, errOut)
	}
	if after, _ := os.ReadFile(dst); string(after) != string(before) {
		t.Fatal("a refused --write changed the file")
	}
	if err := os.WriteFile(dst, []byte("# old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code = run("config", "migrate", "--write", dst, "--force", src); code != 0 {
		t.Fatalf("--force: exit %d: %s", code, errOut)
	}
	if after, _ := os.ReadFile(dst); string(after) != string(before) {
		t.Fatalf("--force did not replace the file:\n%s", after)
	}
	entries, _ := os.ReadDir(filepath.Dir(dst))
	if len(entries) != 1 {
		t.Errorf("files beside the written one (temporary files left?): %v", entries)
	}
}

func TestConfigMigrateErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("disable-require = false\n\n[nvidia-container-cli\nroot = \"/\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wrongType := filepath.Join(dir, "type.toml")
	if err := os.WriteFile(wrongType, []byte("[nvidia-container-runtime]\nruntimes = \"runc\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "out.toml")
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{bad}, 1, "gantry config migrate: " + bad + ": line 3, column"},
		{[]string{wrongType}, 1, "key nvidia-container-runtime.runtimes = 'runc': want a list of strings"},
		{[]string{filepath.Join(dir, "missing.toml")}, 1, "name the file"},
		{[]string{"--force", bad}, 2, "--force needs --write"},
		{[]string{"a", "b"}, 2, "give at most one file"},
		{[]string{"--write", dst, bad}, 1, "line 3"},
	}
	for _, tt := range tests {
		out, errOut, code := run(append([]string{"config", "migrate"}, tt.args...)...)
		if code != tt.code || !strings.Contains(errOut, tt.want) || out != "" {
			t.Errorf("config migrate %v: exit %d, stderr %q, stdout %q; want exit %d and %q", tt.args, code, errOut, out, tt.code, tt.want)
		}
		if strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("config migrate %v: error is not one line: %q", tt.args, errOut)
		}
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("a failed migration wrote %s: %v", dst, err)
	}
}
