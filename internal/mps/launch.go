package mps

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
// the daemon's shm (a tmpfs of its own, MountShm) there; a daemon must not
// see another daemon's, nor the node's. So the daemon starts through a
// launcher: the calling program's own binary, run again with LaunchEnv
// set, in a mount namespace of its own (CLONE_NEWNS, mounts private),
// which binds the daemon's shm over /dev/shm (and, when the host's / is
// mounted elsewhere, a directory over its host path, which a read-only
// host mount would not let the daemon write), changes root to the host's
// and runs the control program with -d. The daemon it forks keeps that
// namespace.

// LaunchEnv marks a run of a binary as the launcher.
const LaunchEnv = "GANTRY_MPS_LAUNCH"

// LaunchMain runs the launcher when this process is one, and never returns
// then; the mains of binaries that start MPS daemons (and their test
// binaries' TestMain) call it first.
func LaunchMain() {
	if os.Getenv(LaunchEnv) != "1" {
		return
	}
	if err := launch(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "MPS launcher: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0) // not reached: launch execs
}

// Launch says how a daemon is launched: Self is this program's binary
// (which calls LaunchMain first), Shm the daemon's /dev/shm, Root the
// host's / as this program sees it ("" or "/" for its own), Bind a
// directory to bind at its own path under Root ("" for none).
type Launch struct {
	Self, Shm, Root, Bind string
}

// Cmd is the launcher's command that runs prog with args, with env as its
// whole environment.
func (l Launch) Cmd(ctx context.Context, env []string, prog string, args ...string) *exec.Cmd {
	root := l.Root
	if root == "" {
		root = "/"
	}
	largs := []string{"--shm", l.Shm, "--root", root}
	if l.Bind != "" {
		largs = append(largs, "--bind", l.Bind)
	}
	cmd := exec.CommandContext(ctx, l.Self, append(append(largs, "--", prog), args...)...)
	cmd.Env = append(slices.Clone(env), LaunchEnv+"=1")
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
	env := slices.DeleteFunc(os.Environ(), func(e string) bool { return e == LaunchEnv+"=1" })
	return unix.Exec(prog[0], prog, env)
}
