package cdispec

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
	"github.com/gantry-gpu/gantry/internal/edits"
)

// Old hooks. CDI specs written before gantry-cdi-hook existed run the gantry
// CLI as their createContainer hooks, `gantry hook create-symlinks|
// update-ldcache ...`, with no env; nvidia-ctk's specs from before
// nvidia-cdi-hook run `nvidia-ctk hook ...` the same way. An engine that
// injects such a spec itself (containerd, CRI-O, Podman, Docker's CDI) hands
// the hook the container's environment on runc before 1.2, so an image's
// LD_PRELOAD is loaded by the dynamic loader of a root process on the host
// before any of the program's own code runs: nothing the program does can
// stop that. The spec must change: the hook given an explicit env, and
// Gantry's own hooks run by the static gantry-cdi-hook.

// OldHook is one such hook of a spec: Where is "spec-wide" or "device NAME".
type OldHook struct {
	Where string
	Hook  *specs.Hook
}

func (h OldHook) String() string {
	return fmt.Sprintf("%s %s %s", h.Where, h.Hook.HookName, strings.Join(h.Hook.Args, " "))
}

// oldForm reports whether h runs the gantry CLI, or nvidia-ctk's hook
// command, without an env.
func oldForm(h *specs.Hook) bool {
	if h == nil || len(h.Env) > 0 {
		return false
	}
	prog := filepath.Base(h.Path)
	if prog == "gantry" {
		return true
	}
	return prog == "nvidia-ctk" && len(h.Args) >= 2 && h.Args[1] == "hook"
}

// OldHooks returns spec's hooks of the old forms.
func OldHooks(spec *specs.Spec) []OldHook {
	var out []OldHook
	check := func(where string, hooks []*specs.Hook) {
		for _, h := range hooks {
			if oldForm(h) {
				out = append(out, OldHook{where, h})
			}
		}
	}
	check("spec-wide", spec.ContainerEdits.Hooks)
	for i := range spec.Devices {
		check("device "+spec.Devices[i].Name, spec.Devices[i].ContainerEdits.Hooks)
	}
	return out
}

// FixOldHooks rewrites spec's old hooks and returns how many: `gantry hook
// SUB ARGS...` becomes `gantry-cdi-hook SUB ARGS...` run from hookPath(the
// gantry path the hook named); every old hook, nvidia-ctk's too, gets the
// explicit environment edits.HookEnv.
func FixOldHooks(spec *specs.Spec, hookPath func(gantry string) (string, error)) (int, error) {
	old := OldHooks(spec)
	for _, o := range old {
		h := o.Hook
		if filepath.Base(h.Path) == "gantry" && len(h.Args) >= 2 && h.Args[1] == "hook" {
			p, err := hookPath(h.Path)
			if err != nil {
				return 0, err
			}
			h.Path = p
			h.Args = append([]string{filepath.Base(p)}, h.Args[2:]...)
		}
		h.Env = edits.HookEnv()
	}
	return len(old), nil
}

// DefaultSpecDirs are the directories CDI engines read by default, which
// gantry cdi fix-hooks and gantry doctor search for old hooks.
var DefaultSpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// maxSpecFile bounds a spec file read: a spec for eight GPUs is tens of kilobytes.
const maxSpecFile = 16 << 20

// OldSpec is a spec file with old hooks.
type OldSpec struct {
	Path  string
	Spec  *specs.Spec
	Hooks []OldHook
}

// FindOldSpecs reads the CDI spec files (.yaml, .yml, .json, regular files,
// not links) among paths, each a file or a directory of them, and returns
// those with old hooks. A missing path is skipped; a file that cannot be read
// or parsed is an error of its own, and the search goes on.
func FindOldSpecs(paths []string) ([]OldSpec, []error) {
	var found []OldSpec
	var errs []error
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			switch strings.ToLower(filepath.Ext(e.Name())) {
			case ".yaml", ".yml", ".json":
				if e.Type().IsRegular() {
					files = append(files, filepath.Join(p, e.Name()))
				}
			}
		}
	}
	for _, f := range files {
		spec, _, err := readSpecFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if hooks := OldHooks(spec); len(hooks) > 0 {
			found = append(found, OldSpec{Path: f, Spec: spec, Hooks: hooks})
		}
	}
	return found, errs
}

func readSpecFile(p string) (*specs.Spec, []byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the CDI spec %s: %w", p, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("reading the CDI spec %s: not a regular file", p)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSpecFile+1))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the CDI spec %s: %w", p, err)
	}
	if len(b) > maxSpecFile {
		return nil, nil, fmt.Errorf("reading the CDI spec %s: larger than %d MiB", p, maxSpecFile>>20)
	}
	spec, err := cdi.ParseSpec(b)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing the CDI spec %s: %w", p, err)
	}
	return spec, b, nil
}

// RewriteOldSpec rewrites the file o.Path with its old hooks fixed
// (FixOldHooks), atomically (a temporary file renamed over it, so an engine
// reads the old spec or the new one), after keeping the original bytes in
// a backup beside it, PATH.bak (PATH.bak.N when that exists; CDI engines
// load only .yaml and .json files). It returns the backup's path.
func RewriteOldSpec(o OldSpec, hookPath func(gantry string) (string, error)) (string, error) {
	spec, orig, err := readSpecFile(o.Path)
	if err != nil {
		return "", err
	}
	n, err := FixOldHooks(spec, hookPath)
	if err != nil || n == 0 {
		return "", err
	}
	if err := Validate(spec); err != nil {
		return "", fmt.Errorf("the rewritten spec %s: %w", o.Path, err)
	}
	format, err := FormatFor(o.Path)
	if err != nil {
		return "", err
	}
	backup := o.Path + ".bak"
	for i := 1; ; i++ {
		if _, err := os.Lstat(backup); errors.Is(err, os.ErrNotExist) {
			break
		}
		backup = fmt.Sprintf("%s.bak.%d", o.Path, i)
	}
	if err := atomicfile.Write(backup, orig, atomicfile.Options{Mode: 0o600, Sync: true}); err != nil {
		return "", fmt.Errorf("keeping a backup of %s: %w", o.Path, err)
	}
	if err := Write(spec, o.Path, format); err != nil {
		return "", err
	}
	return backup, nil
}

// HookBeside returns the gantry-cdi-hook beside the gantry at gantry, when
// it is there (an executable regular file), else "".
func HookBeside(gantry string) string {
	p := filepath.Join(filepath.Dir(gantry), "gantry-cdi-hook")
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return p
	}
	return ""
}
