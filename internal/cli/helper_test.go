package cli

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

// gantry answers gantry-runtime's question for the GPUs (discover's
// HelperCommand) without reading a configuration, and does not list it.
func TestHelperCommand(t *testing.T) {
	t.Setenv("GANTRY_CONFIG", "/nonexistent/gantry.toml")
	out, errOut, code := run(discover.HelperCommand, "--gpus", "sim:a100x2-mig", "--light")
	if code != 0 {
		t.Fatalf("gantry %s: exit %d: %s", discover.HelperCommand, code, errOut)
	}
	var reply struct{ GPUs *gpu.System }
	if err := json.Unmarshal([]byte(out), &reply); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want, err := sim.Load("a100x2-mig")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(reply.GPUs, want) {
		t.Errorf("gantry %s printed %+v, want %+v", discover.HelperCommand, reply.GPUs, want)
	}
	if _, _, code := run(discover.HelperCommand, "extra"); code != 2 {
		t.Errorf("gantry %s extra: exit %d, want 2", discover.HelperCommand, code)
	}
	help, _, _ := run("--help")
	if strings.Contains(help, discover.HelperCommand) {
		t.Errorf("gantry --help lists %s:\n%s", discover.HelperCommand, help)
	}
}
