package doctor

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/internal/discover"
)

// brokenHook reports the hook on dockerd's PATH (path, read from source)
// that is there but cannot run: a dangling symbolic link (an upgrade or
// uninstall removed what it pointed at) or a file without an execute bit.
// dockerd's lookup skips such an entry as if it were absent, and docker
// run --gpus fails with "could not select device driver"; doctor names the
// entry and the command that repairs it. It says nothing (false) when a
// working hook is found on the PATH, broken entries before it included:
// dockerd takes that one.
func brokenHook(opts Options, path, source string) (Check, bool) {
	if _, ok := discover.LookPathIn(hookName, path); ok {
		return Check{}, false
	}
	var problems, fixes []string
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		link := filepath.Join(dir, hookName)
		lst, err := os.Lstat(link)
		if err != nil {
			continue
		}
		st, serr := os.Stat(link)
		switch {
		case lst.Mode()&fs.ModeSymlink != 0 && serr != nil:
			target, _ := os.Readlink(link)
			problems = append(problems, fmt.Sprintf("%s is a dangling symbolic link (to %s, which does not exist)", link, target))
			if real := hookTarget(link, target, path); real != "" {
				fixes = append(fixes, fix(fixHookLink, "TARGET", real, "LINK", link))
			} else {
				fixes = append(fixes, fix(fixHookReinstall, "LINK", link))
			}
		case serr == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 == 0:
			problems = append(problems, fmt.Sprintf("%s is not executable (mode %s)", link, st.Mode().Perm()))
			fixes = append(fixes, fix(fixHookMode, "FILE", link))
		}
	}
	if len(problems) == 0 {
		return Check{}, false
	}
	ev := fmt.Sprintf("%s, on dockerd's PATH %q (%s): docker run --gpus fails with \"could not select device driver\" (dockerd skips an entry it cannot execute, and looks the hook up when it starts)",
		strings.Join(problems, "; "), path, source)
	f := joinFixes(fixes)
	return fail(CheckHook, f, "%s", ev), true
}

// hookTarget finds the installed program a dangling hook link should
// point at: the file its target named, moved (the same name), or
// gantry-runtime, which is the hook under NVIDIA's name; looked for beside
// the link, on dockerd's PATH, then on doctor's. "" when none is installed.
func hookTarget(link, target, enginePath string) string {
	names := []string{filepath.Base(target)}
	if names[0] != "gantry-runtime" {
		names = append(names, "gantry-runtime")
	}
	dirs := append([]string{filepath.Dir(link)}, filepath.SplitList(enginePath)...)
	for _, name := range names {
		if name == hookName || name == "." || name == "/" {
			continue
		}
		for _, dir := range dirs {
			if !filepath.IsAbs(dir) {
				continue
			}
			if p := filepath.Join(dir, name); p != link && executable(p) {
				return p
			}
		}
		if p, err := exec.LookPath(name); err == nil {
			if abs, err := filepath.Abs(p); err == nil && abs != link && executable(abs) {
				return abs
			}
		}
	}
	return ""
}

// executable says whether p is (or leads to) a regular file with an
// execute bit.
func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}
