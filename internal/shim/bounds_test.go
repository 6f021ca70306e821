package shim

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A bundle whose config.json is not a small regular file: a FIFO hung
// gantry-runtime create for ever (nothing ever writes it), and a 200 MB
// spec cost 1.56 GB of memory to decode. Each must fail at once with an
// error naming the file, create no container, and leave the file as it was.
func TestBundleSpecBounds(t *testing.T) { eachRuntime(t, testBundleSpecBounds) }

func testBundleSpecBounds(t *testing.T) {
	cases := []struct {
		name string
		make func(t *testing.T, path string)
		want string
	}{
		{"fifo", func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "named pipe (FIFO), not a regular file"},
		{"directory", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}, "a directory, not a regular file"},
		{"character device", func(t *testing.T, p string) {
			if err := os.Symlink("/dev/zero", p); err != nil {
				t.Fatal(err)
			}
		}, "a character device, not a regular file"},
		{"200 MB", func(t *testing.T, p string) {
			// Sparse: the size is what matters, and it is refused before a read.
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteString(`{"ociVersion": "1.0.2", "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "x": "`); err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(200 << 20); err != nil {
				t.Fatal(err)
			}
		}, "209715200 bytes, too large (the limit is 16777216)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newContainer(t, opts{env: []string{"NVIDIA_VISIBLE_DEVICES=0"}, args: []string{"/bin/true"}})
			spec := filepath.Join(c.bundle, "config.json")
			if err := os.Remove(spec); err != nil {
				t.Fatal(err)
			}
			tc.make(t, spec)
			before, err := os.Lstat(spec)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, c.f.runtime, "--root", c.state, "create", "--bundle", c.bundle, c.id)
			cmd.Env = append(os.Environ(), "GANTRY_CONFIG="+c.config)
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("gantry-runtime create still running after 30s on a %s config.json", tc.name)
			}
			c.t.Cleanup(func() { c.runtime("delete", "--force", c.id) })
			if err == nil {
				t.Fatalf("create succeeded on a %s config.json:\n%s", tc.name, out)
			}
			msg := string(out)
			if !strings.Contains(msg, spec) || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q; want it to name %s and say %q", strings.TrimSpace(msg), spec, tc.want)
			}
			if strings.Count(strings.TrimSpace(msg), "\n") > 0 {
				t.Errorf("error is not one line: %q", msg)
			}
			if list, _ := exec.Command(c.low, "--root", c.state, "list", "-q").Output(); strings.Contains(string(list), c.id) {
				t.Errorf("container %s exists after the refused create", c.id)
			}
			after, err := os.Lstat(spec)
			if err != nil || after.Mode() != before.Mode() || after.Size() != before.Size() {
				t.Errorf("config.json changed: before %v %d, after %v", before.Mode(), before.Size(), after)
			}
		})
	}
}
