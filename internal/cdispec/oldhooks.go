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
	"github.com/gantry-gpu/gantry/internal/containerhook"
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

// OldHook is one such hook of a spec: Where is "spec-wide" or "device NAME",
// Why what is wrong with it.
type OldHook struct {
	Where string
	Hook  *specs.Hook
	Why   string
}

func (h OldHook) String() string {
	return fmt.Sprintf("%s %s %s (%s)", h.Where, h.Hook.HookName, strings.Join(h.Hook.Args, " "), h.Why)
}

// hookPrograms are the programs whose hooks fix-hooks knows how to run from
// gantry-cdi-hook when a spec names them by a relative path.
var hookPrograms = map[string]bool{"gantry": true, "nvidia-ctk": true, "gantry-cdi-hook": true, "nvidia-cdi-hook": true}

const (
	whyRelative = "a relative path: the runtime runs the container's file of that name as root on the host"
	whyNoEnv    = "no env: a dynamically linked program given the image's environment as root on the host"
)

// hookArg is the index of the word "hook" in args after the program name
// (nvidia-ctk --debug hook ..., gantry-0.3 hook ...), or -1.
func hookArg(args []string) int {
	for i := 1; i < len(args); i++ {
		if args[i] == "hook" {
			return i
		}
	}
	return -1
}

// oldWhy says what is wrong with h, or "": a relative path (which a
// runtime resolves in the container's root filesystem, so it runs the
// image's program as host root), or no env on a hook that runs the gantry
// CLI (under any name: a `hook` argument) or nvidia-ctk hook.
func oldWhy(h *specs.Hook) string {
	if h == nil {
		return ""
	}
	if !filepath.IsAbs(h.Path) {
		return whyRelative
	}
	if len(h.Env) > 0 {
		return ""
	}
	if filepath.Base(h.Path) == "gantry" || hookArg(h.Args) > 0 {
		return whyNoEnv
	}
	return ""
}

// OldHooks returns spec's hooks of the old forms, and those with a relative path.
func OldHooks(spec *specs.Spec) []OldHook {
	var out []OldHook
	check := func(where string, hooks []*specs.Hook) {
		for _, h := range hooks {
			if why := oldWhy(h); why != "" {
				out = append(out, OldHook{where, h, why})
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
// SUB ARGS...` (gantry under any name, or one of the hook programs named by
// a relative path) becomes `gantry-cdi-hook SUB ARGS...` run from
// hookPath(the path the hook named) when gantry-cdi-hook has SUB; every
// old hook, nvidia-ctk's too, gets the explicit environment edits.HookEnv.
// A relative path to any other program is an error naming it: there is
// no telling which host program was meant.
func FixOldHooks(spec *specs.Spec, hookPath func(gantry string) (string, error)) (int, error) {
	old := OldHooks(spec)
	var errs []error
	for _, o := range old {
		h := o.Hook
		prog := filepath.Base(h.Path)
		var sub []string // the hook's arguments for gantry-cdi-hook; nil: keep the program
		if i := hookArg(h.Args); i > 0 && i+1 < len(h.Args) && (prog != "nvidia-ctk" || o.Why == whyRelative) {
			sub = h.Args[i+1:]
		} else if (prog == "gantry-cdi-hook" || prog == "nvidia-cdi-hook") && len(h.Args) > 1 {
			sub = h.Args[1:]
		}
		if sub != nil && containerhook.Lookup(sub[0]) == nil {
			sub = nil
		}
		if o.Why == whyRelative && (!hookPrograms[prog] || sub == nil) {
			errs = append(errs, fmt.Errorf("%s hook %s %q has the relative path %q, which a runtime resolves in the container's root filesystem (it runs the image's file as root on the host): give it the absolute path of the host program", o.Where, h.HookName, h.Args, h.Path))
			continue
		}
		if sub != nil {
			p, err := hookPath(h.Path)
			if err != nil {
				return 0, err
			}
			if !filepath.IsAbs(p) {
				return 0, fmt.Errorf("the hook program %q is not an absolute path", p)
			}
			h.Path = p
			h.Args = append([]string{filepath.Base(p)}, sub...)
		}
		h.Env = edits.HookEnv()
	}
	if len(errs) > 0 {
		return 0, errors.Join(errs...)
	}
	return len(old), nil
}

// ValidateHookPaths fails naming the first hook of spec whose path is not
// absolute: a runtime resolves a relative one in the container's root
// filesystem and runs the image's file as root on the host.
func ValidateHookPaths(spec *specs.Spec) error {
	check := func(where string, hooks []*specs.Hook) error {
		for _, h := range hooks {
			if h != nil && !filepath.IsAbs(h.Path) {
				return fmt.Errorf("%w: %s hook %s has the relative path %q (a runtime would run the container's file of that name as root on the host): give an absolute path", ErrInvalidSpec, where, h.HookName, h.Path)
			}
		}
		return nil
	}
	if err := check("spec-wide", spec.ContainerEdits.Hooks); err != nil {
		return err
	}
	for i := range spec.Devices {
		if err := check("device "+spec.Devices[i].Name, spec.Devices[i].ContainerEdits.Hooks); err != nil {
			return err
		}
	}
	return nil
}

// DefaultSpecDirs are the directories CDI engines read by default, which
// gantry cdi fix-hooks and gantry doctor search for old hooks.
var DefaultSpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// maxSpecFile bounds a spec file read: a spec for eight GPUs is tens of kilobytes.
const maxSpecFile = 16 << 20

// OldSpec is a spec file with old hooks. Target is the regular file Path
// links to (engines follow links: NixOS writes /etc/cdi's specs as links
// into the store), "" when Path is that file.
type OldSpec struct {
	Path   string
	Target string
	Spec   *specs.Spec
	Hooks  []OldHook
}

// FindOldSpecs reads the CDI spec files (.yaml, .yml, .json: regular files
// and links to them, as engines do) among paths, each a file or a directory
// of them, and returns those with old hooks. A link to a file also found
// is read once; a missing path, and in a directory a link to nothing or to
// what is not a file, is skipped; a file that cannot be read or parsed is
// an error of its own, and the search goes on.
func FindOldSpecs(paths []string) ([]OldSpec, []error) {
	var found []OldSpec
	var errs []error
	type file struct{ path, target string }
	var files []file
	regular := map[string]bool{}
	add := func(p string, inDir bool) {
		st, err := os.Lstat(p)
		if err != nil {
			errs = append(errs, err)
			return
		}
		if st.Mode().IsRegular() {
			if real, err := filepath.EvalSymlinks(p); err == nil {
				regular[real] = true
			}
			files = append(files, file{p, ""})
			return
		}
		if st.Mode()&os.ModeSymlink == 0 {
			if !inDir {
				errs = append(errs, fmt.Errorf("reading the CDI spec %s: not a regular file", p))
			}
			return
		}
		real, err := filepath.EvalSymlinks(p)
		if err == nil {
			var tst os.FileInfo
			if tst, err = os.Lstat(real); err == nil && !tst.Mode().IsRegular() {
				err = errors.New("not a regular file")
			}
		}
		if err != nil {
			if !inDir {
				errs = append(errs, fmt.Errorf("reading the CDI spec %s: the link's target: %w", p, err))
			}
			return
		}
		files = append(files, file{p, real})
	}
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
			add(p, false)
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
				add(filepath.Join(p, e.Name()), true)
			}
		}
	}
	for _, f := range files {
		if f.target != "" && regular[f.target] {
			continue // the file itself is in the list
		}
		read := f.path
		if f.target != "" {
			read = f.target
		}
		spec, _, _, err := readSpecFile(read)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if hooks := OldHooks(spec); len(hooks) > 0 {
			found = append(found, OldSpec{Path: f.path, Target: f.target, Spec: spec, Hooks: hooks})
		}
	}
	return found, errs
}

func readSpecFile(p string) (*specs.Spec, []byte, *syscall.Stat_t, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reading the CDI spec %s: %w", p, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return nil, nil, nil, fmt.Errorf("reading the CDI spec %s: not a regular file", p)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSpecFile+1))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reading the CDI spec %s: %w", p, err)
	}
	if len(b) > maxSpecFile {
		return nil, nil, nil, fmt.Errorf("reading the CDI spec %s: larger than %d MiB", p, maxSpecFile>>20)
	}
	spec, err := cdi.ParseSpec(b)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("parsing the CDI spec %s: %w", p, err)
	}
	return spec, b, st.Sys().(*syscall.Stat_t), nil
}

// RewriteOldSpec is RewriteOldSpecFile without the path written.
func RewriteOldSpec(o OldSpec, hookPath func(gantry string) (string, error)) (string, error) {
	_, backup, err := RewriteOldSpecFile(o, hookPath)
	return backup, err
}

// RewriteOldSpecFile rewrites the file o.Path with its old hooks fixed
// (FixOldHooks), atomically (a temporary file renamed over it, so an engine
// reads the old spec or the new one) with the original's mode and owner,
// after keeping the original bytes in a backup beside it, PATH.bak
// (PATH.bak.N when that exists; CDI engines load only .yaml and .json
// files). It returns the path written and the backup's.
//
// Where o.Path is a link, its target is rewritten in place when root owns
// the target's directories and no one else may write to them; else (or
// where that fails: a read-only store) the link is replaced by the
// rewritten spec, and the link kept as PATH.bak.
func RewriteOldSpecFile(o OldSpec, hookPath func(gantry string) (string, error)) (written, backup string, err error) {
	read := o.Path
	if o.Target != "" {
		// Read what the link names now, not what it named when found.
		if read, err = filepath.EvalSymlinks(o.Path); err != nil {
			return "", "", fmt.Errorf("reading the CDI spec %s: %w", o.Path, err)
		}
	}
	spec, orig, st, err := readSpecFile(read)
	if err != nil {
		return "", "", err
	}
	n, err := FixOldHooks(spec, hookPath)
	if err != nil || n == 0 {
		return "", "", err
	}
	if err := Validate(spec); err != nil {
		return "", "", fmt.Errorf("the rewritten spec %s: %w", o.Path, err)
	}
	format, err := FormatFor(o.Path)
	if err != nil {
		return "", "", err
	}
	data, err := Marshal(spec, format)
	if err != nil {
		return "", "", err
	}
	opts := atomicfile.Options{Mode: os.FileMode(st.Mode & 0o7777), Chown: true, UID: int(st.Uid), GID: int(st.Gid), Sync: true}
	if o.Target == "" {
		backup, err := rewriteInPlace(o.Path, orig, data, opts)
		return o.Path, backup, err
	}
	var inPlace error
	if inPlace = rootsOnly(filepath.Dir(read)); inPlace == nil {
		if backup, inPlace = rewriteInPlace(read, orig, data, opts); inPlace == nil {
			return read, backup, nil
		}
	}
	// Replace the link: keep it (a link to the same target) as the
	// backup, then rename the rewritten spec over it.
	dest, err := os.Readlink(o.Path)
	if err == nil {
		backup = backupName(o.Path)
		err = os.Symlink(dest, backup)
	}
	if err == nil {
		err = atomicfile.Write(o.Path, data, opts)
	}
	if err != nil {
		return "", "", fmt.Errorf("the CDI spec %s links to %s, which cannot be rewritten in place (%v), and replacing the link failed: %w; rewrite %s, or replace the link by a fixed copy", o.Path, read, inPlace, err, read)
	}
	return o.Path, backup, nil
}

func backupName(p string) string {
	backup := p + ".bak"
	for i := 1; ; i++ {
		if _, err := os.Lstat(backup); errors.Is(err, os.ErrNotExist) {
			return backup
		}
		backup = fmt.Sprintf("%s.bak.%d", p, i)
	}
}

func rewriteInPlace(p string, orig, data []byte, opts atomicfile.Options) (string, error) {
	backup := backupName(p)
	if err := atomicfile.Write(backup, orig, atomicfile.Options{Mode: 0o600, Sync: true}); err != nil {
		return "", fmt.Errorf("keeping a backup of %s: %w", p, err)
	}
	if err := atomicfile.Write(p, data, opts); err != nil {
		os.Remove(backup)
		return "", fmt.Errorf("writing CDI spec %s: %w", p, err)
	}
	return backup, nil
}

// rootsOnly checks that root owns dir (a path without links) and each
// directory above it, and that no one else may write to dir, nor to those
// above it but sticky ones (where others cannot rename root's entries).
func rootsOnly(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Lstat(d)
		if err != nil {
			return err
		}
		sys := st.Sys().(*syscall.Stat_t)
		if !st.IsDir() || sys.Uid != 0 || st.Mode().Perm()&0o022 != 0 && (d == dir || st.Mode()&os.ModeSticky == 0) {
			return fmt.Errorf("the directory %s is owned by uid %d with mode %v: not root's alone", d, sys.Uid, st.Mode())
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

// HookBeside returns the gantry-cdi-hook beside the gantry at gantry, an
// absolute path, when it is there (an executable regular file), else "".
func HookBeside(gantry string) string {
	if !filepath.IsAbs(gantry) {
		return ""
	}
	p := filepath.Join(filepath.Dir(gantry), "gantry-cdi-hook")
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return p
	}
	return ""
}
