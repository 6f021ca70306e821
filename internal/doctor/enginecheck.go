package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"slices"
	"strings"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
)

// The engine checks follow engineconfig's registry: Docker, containerd
// and CRI-O have checks of their own (engines.go; each reads more than
// its file: the running dockerd, containerd's CRI socket, CRI-O's
// drop-ins), and every other registered engine gets one made from its
// definition (engineCheck), after theirs.

// builtinEngineChecks names the engines whose check is written out, and
// the check.
var builtinEngineChecks = map[engineconfig.Engine]string{
	engineconfig.Docker:     CheckDocker,
	engineconfig.Containerd: CheckContainerd,
	engineconfig.CRIO:       CheckCRIO,
}

// engineOfCheck is the definition of the engine an engine check judges.
func engineOfCheck(check string) (engineconfig.Definition, bool) {
	for e, c := range builtinEngineChecks {
		if c == check {
			return engineconfig.Lookup(e)
		}
	}
	for _, d := range engineconfig.Definitions() {
		if engineCheckName(d) == check {
			return d, true
		}
	}
	return engineconfig.Definition{}, false
}

// engineCheckName is the check of engine d: "docker config".
func engineCheckName(d engineconfig.Definition) string {
	if c, ok := builtinEngineChecks[d.Name]; ok {
		return c
	}
	return string(d.Name) + " config"
}

// engineNeed is the need of a check made from an engine's definition:
// the engine is installed.
func engineNeed(d engineconfig.Definition) Need { return Need("engine " + string(d.Name)) }

// needEngine is the engine a need of engineNeed names.
func needEngine(n Need) (engineconfig.Definition, bool) {
	name, ok := strings.CutPrefix(string(n), "engine ")
	if !ok {
		return engineconfig.Definition{}, false
	}
	return engineconfig.Lookup(engineconfig.Engine(name))
}

// AllChecks is Checks with a check for each registered engine that has
// none written out, after the CRI-O check: the list Run runs, --help
// shows and docs/troubleshooting.md documents.
func AllChecks() []CheckDef {
	var extra []CheckDef
	for _, d := range engineconfig.Definitions() {
		if _, ok := builtinEngineChecks[d.Name]; !ok {
			extra = append(extra, engineCheck(d))
		}
	}
	if len(extra) == 0 {
		return Checks
	}
	i := slices.IndexFunc(Checks, func(c CheckDef) bool { return c.Name == CheckCRIO }) + 1
	return slices.Concat(Checks[:i], extra, Checks[i:])
}

// engineConfig is the configuration file doctor reads for engine d.
func engineConfig(opts Options, d engineconfig.Definition) string {
	if p := opts.EngineConfigs[d.Name]; p != "" {
		return p
	}
	return d.DefaultPath
}

// engineInstalled: the engine's configuration exists or its program is
// on PATH.
func engineInstalled(opts Options, d engineconfig.Definition) bool {
	if _, files, err := engineconfig.ReadEngine(d.Name, engineConfig(opts, d)); len(files) > 0 || !errors.Is(err, fs.ErrNotExist) {
		return true
	}
	_, err := exec.LookPath(d.Program)
	return err == nil
}

// engineCheck is the check of a registered engine made from its
// definition: its configuration (Definition.Read) registers a runtime
// that runs gantry-runtime or nvidia-container-runtime, and that program
// exists, judged with the engine program's PATH.
func engineCheck(d engineconfig.Definition) CheckDef {
	configure := d.ConfigureCommand()
	return CheckDef{
		Name:     engineCheckName(d),
		Summary:  d.Title + "'s configuration registers a GPU runtime",
		Needs:    []Need{NeedDriver, engineNeed(d)},
		Verifies: fmt.Sprintf("%s's configuration (`%s`, as %s reads it) registers a runtime that runs `gantry-runtime` or `nvidia-container-runtime`, and that program exists; skipped when %s is not installed (no configuration, no `%s` on `PATH`).", d.Title, d.DefaultPath, d.Title, d.Title, d.Program) + createServerVerifies,
		Failures: []FailureDoc{
			{"no GPU runtime registered", configure},
			{"a registered runtime's program does not exist, is a dangling link, or is on neither the engine's nor doctor's `PATH`", reinstallFix(configure)},
			{"a registered runtime's program, as the engine looks it up, is found only on doctor's `PATH`", fixRuntimeAbsPath},
			{"a registered runtime's program exists but is not executable", fixProgramMode},
			{"the configuration does not parse (" + d.Title + " will not start with it)", malformedFix(d)},
			{"the file cannot be read", fixReadable},
		},
		run: func(e *env) []Check { return one(checkEngine(e.opts, d)) },
	}
}

func reinstallFix(configure string) string {
	return "install `gantry-runtime` there, or re-register it: " + configure
}

func malformedFix(d engineconfig.Definition) string {
	return "correct it (" + d.Title + " will not start with it), then: " + d.ConfigureCommand()
}

// checkEngine judges a registered engine's configuration (engineCheck).
func checkEngine(opts Options, d engineconfig.Definition) Check {
	name := engineCheckName(d)
	file := engineConfig(opts, d)
	reg, files, err := engineconfig.ReadEngine(d.Name, file)
	if errors.Is(err, fs.ErrNotExist) && len(files) == 0 {
		return skip(name, "%s does not exist (%s not installed)", file, d.Title)
	}
	if errors.Is(err, engineconfig.ErrMalformed) {
		malformed := malformedFix(d)
		return fail(name, fix(malformed), "%v", err)
	}
	if err != nil {
		return fail(name, fix(fixReadable), "%v", err)
	}
	configure := d.ConfigureCommand()
	reinstall := reinstallFix(configure)
	return judgeRuntimes(opts, name, strings.Join(files, ", "), fix(configure), fix(reinstall), reg.Runtimes)
}
