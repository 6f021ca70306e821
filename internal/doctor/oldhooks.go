package doctor

import (
	"fmt"
	"strings"

	"github.com/gantry-gpu/gantry/internal/cdispec"
)

func (e *env) oldCDIHooks() []Check { return one(checkOldCDIHooks(e.opts.Config.CDI.SpecDirs)) }

// checkOldCDIHooks reads every spec in dirs (package cdispec: bounded,
// regular files and links to them, as engines read them). A spec it cannot
// read FAILs too: an engine may load it, and its hooks are unknown.
func checkOldCDIHooks(dirs []string) Check {
	found, errs := cdispec.FindOldSpecs(dirs)
	if len(found) == 0 && len(errs) == 0 {
		return pass(CheckOldCDIHooks, "no spec in %s runs the gantry CLI or nvidia-ctk hook without an env, or a hook by a relative path", strings.Join(dirs, ", "))
	}
	var ev, files []string
	for _, o := range found {
		var hooks []string
		for _, h := range o.Hooks {
			hooks = append(hooks, h.String())
		}
		ev = append(ev, fmt.Sprintf("%s: %s", o.Path, strings.Join(hooks, "; ")))
		files = append(files, o.Path)
	}
	for _, err := range errs {
		ev = append(ev, fmt.Sprintf("%v: cannot tell whether its hooks are old", err))
	}
	if len(files) == 0 {
		files = []string{strings.Join(dirs, " ")}
	}
	return fail(CheckOldCDIHooks, fix(fixOldCDIHooks, "FILE...", strings.Join(files, " ")),
		"hooks without an env that run the dynamically linked gantry (or nvidia-ctk), which an engine's runc before 1.2 runs as root with the image's environment (its LD_PRELOAD runs as host root), or hooks by a relative path, which a runtime resolves in the container (the image's file runs as host root): %s", strings.Join(ev, " | "))
}
