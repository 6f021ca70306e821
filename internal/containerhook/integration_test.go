package containerhook

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gantry-gpu/gantry/internal/edits"
)

var (
	gantryOnce sync.Once
	gantryBin  string
	gantryErr  string
)

// buildGantry builds the gantry command once, with the go tool that runs
// the tests.
func buildGantry(t *testing.T) string {
	t.Helper()
	gantryOnce.Do(func() {
		goTool := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			if goTool, err = exec.LookPath("go"); err != nil {
				gantryErr = "skip: no go tool to build gantry"
				return
			}
		}
		gantryBin = filepath.Join(artifacts, "gantry")
		out, err := exec.Command(goTool, "build", "-o", gantryBin, "github.com/gantry-gpu/gantry/cmd/gantry").CombinedOutput()
		if err != nil {
			gantryErr = "go build ./cmd/gantry: " + err.Error() + "\n" + string(out)
		}
	})
	if strings.HasPrefix(gantryErr, "skip: ") {
		t.Skip(gantryErr)
	}
	if gantryErr != "" {
		t.Fatal(gantryErr)
	}
	return gantryBin
}

// The hooks exactly as a runtime runs them from a spec Gantry generates:
// the hook entries of edits.CDI, executed with the OCI state on stdin for a
// bundle whose config.json names the image root. The real loader in the
// image then finds libcuda.
func TestGantryHookCommands(t *testing.T) {
	dir := imageRoot(t, nil)
	if out, err := probe(t, dir); err == nil {
		t.Fatalf("probe found libcuda before the hooks ran: %s", out)
	}
	bin := buildGantry(t)
	state := bundle(t, dir)
	e := &edits.Edits{
		Symlinks:    []edits.Symlink{{Target: driverLib, Link: nvDir + "/libcuda.so.1"}},
		LibraryDirs: []string{nvDir},
	}
	hooks := e.CDI(bin).Hooks
	if len(hooks) != 2 {
		t.Fatalf("edits.CDI gave %d hooks, want 2", len(hooks))
	}
	for _, h := range hooks {
		cmd := &exec.Cmd{Path: h.Path, Args: h.Args, Stdin: bytes.NewReader(state)}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(h.Args, " "), err, stderr.String())
		}
	}
	if out, err := probe(t, dir); err != nil || out != wantVersion {
		t.Fatalf("probe after the hooks: %q, %v; want %s", out, err, wantVersion)
	}

	// Failures: non-zero exit and one line on stderr.
	for _, tc := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"hook", "update-ldcache", "--folder", nvDir}, "no container state on stdin"},
		{string(state), []string{"hook", "update-ldcache", "--folder", "/missing"}, "/missing"},
		{string(state), []string{"hook", "create-symlinks", "--link", "nolink"}, "TARGET::LINK"},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Stdin = strings.NewReader(tc.stdin)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		msg := stderr.String()
		if err == nil || !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 {
			t.Errorf("gantry %s: err %v, stderr %q; want a failure, one line containing %q", strings.Join(tc.args, " "), err, msg, tc.want)
		}
	}
}
