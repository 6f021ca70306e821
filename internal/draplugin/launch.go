package draplugin

import (
	"context"
	"os/exec"

	"github.com/gantry-gpu/gantry/internal/mps"
)

// A claim's MPS control daemon starts through the MPS launcher (package
// mps, launch.go): this plugin's own binary, run again, in a mount
// namespace of its own where the claim's shm (a tmpfs of its own) is
// /dev/shm, chrooted to the host's root.

// LaunchMain runs the MPS launcher when this process is one, and never
// returns then; the binary's main (and a test binary's TestMain) call it
// first.
func LaunchMain() { mps.LaunchMain() }

// launchCmd is the launcher's command for m's daemon, env the control
// program's environment.
func (d *Driver) launchCmd(ctx context.Context, m *preparedMPS, env []string) *exec.Cmd {
	return mps.Launch{Self: d.self, Shm: m.shm(), Root: d.hostRoot, Bind: m.Dir}.Cmd(ctx, env, d.hostPath(d.mpsControl), "-d")
}
