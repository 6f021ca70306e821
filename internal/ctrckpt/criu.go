package ctrckpt

import (
	"fmt"
	"os/exec"
	"strings"
)

// CRIU is the criu on PATH as checkpoints would run it.
type CRIU struct {
	Path    string // "" when there is none
	Version string // its --version, "" when unknown
	Check   string // the last line of `criu check`
	// Problem says why it cannot checkpoint here ("" when it can): none on
	// PATH, not CRIU 4.x (Debian 12's 3.17 fails on current kernels), or
	// `criu check` failing.
	Problem string
}

// FindCRIU looks criu up in PATH, asks its version and runs `criu check`.
func FindCRIU() CRIU {
	p, err := exec.LookPath("criu")
	if err != nil {
		return CRIU{Problem: "no criu on PATH (scripts/install-criu.sh installs CRIU 4.x)"}
	}
	c := CRIU{Path: p}
	out, _ := exec.Command(p, "--version").Output()
	c.Version = strings.TrimSpace(strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "Version: "))
	chk, cerr := exec.Command(p, "check").CombinedOutput()
	c.Check = lastLine(string(chk))
	switch {
	case c.Version == "" || c.Version < "4" || len(strings.SplitN(c.Version, ".", 2)[0]) != 1:
		c.Problem = fmt.Sprintf("%s is CRIU %q, not 4.x (Debian 12's 3.17 fails on current kernels; scripts/install-criu.sh installs 4.x)", p, c.Version)
	case cerr != nil:
		c.Problem = fmt.Sprintf("%s check fails: %s", p, c.Check)
	}
	return c
}

func lastLine(s string) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(ls[len(ls)-1])
}
