package draplugin

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The MPS control daemon must share /dev/shm with its clients, which get
// the claim's shm directory there; a daemon of one claim must not see
// another's. So the daemon starts through a launcher: the plugin's own
// binary, run again with launchEnv set, in a mount namespace of its own
// (CLONE_NEWNS, mounts private), which binds the claim's shm directory
// over /dev/shm (and, when the host's / is mounted elsewhere, the claim's
// directory over its host path, which the read-only host mount would not
// let the daemon write), changes root to the host's and runs the host's
// control program with -d. The daemon it forks keeps that namespace.

// launchEnv marks a run of the binary as the launcher.
const launchEnv = "GANTRY_DRA_MPS_LAUNCH"

// LaunchMain runs the launcher when this process is one, and never
// returns then; the binary's main (and a test binary's TestMain) call it
// first.
func LaunchMain() {
	if os.Getenv(launchEnv) != "1" {
		return
	}
	if err := launch(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "gantry-dra-plugin MPS launcher: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0) // not reached: launch execs
}

// launchCmd is the launcher's command for m's daemon, env the control
// program's environment.
func (d *Driver) launchCmd(ctx context.Context, m *preparedMPS, env []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, d.self, "--shm", m.shm(), "--root", d.hostRoot, "--bind", m.Dir, "--", d.hostPath(d.mpsControl), "-d")
	cmd.Env = append(slices.Clone(env), launchEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	cmd.WaitDelay = time.Second
	return cmd
}

func launch(args []string) error {
	fs := flag.NewFlagSet("launch", flag.ContinueOnError)
	shm := fs.String("shm", "", "")
	root := fs.String("root", "/", "")
	bind := fs.String("bind", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	prog := fs.Args()
	if *shm == "" || len(prog) == 0 || !filepath.IsAbs(*root) {
		return fmt.Errorf("usage: --shm DIR [--root DIR] [--bind DIR] -- PROGRAM ARGS (got %q)", args)
	}
	// Go's exec made the mounts private (CLONE_NEWNS): nothing below
	// reaches the host's mount table.
	if *root != "/" && *bind != "" {
		if err := unix.Mount(*bind, filepath.Join(*root, *bind), "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s into %s: %w", *bind, *root, err)
		}
	}
	if err := unix.Mount(*shm, filepath.Join(*root, "dev", "shm"), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s over /dev/shm: %w", *shm, err)
	}
	if *root != "/" {
		if err := unix.Chroot(*root); err != nil {
			return fmt.Errorf("chroot %s: %w", *root, err)
		}
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	env := slices.DeleteFunc(os.Environ(), func(e string) bool { return e == launchEnv+"=1" })
	return unix.Exec(prog[0], prog, env)
}
