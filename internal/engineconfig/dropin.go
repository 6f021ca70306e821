package engineconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	toml "github.com/pelletier/go-toml/v2"
)

// DefaultContainerdDropIn is the drop-in NVIDIA's toolkit (1.17 and later)
// writes for containerd, and ContainerdDropInImport the pattern it adds to
// the main file's imports for it.
const (
	DefaultContainerdDropIn = "/etc/containerd/conf.d/99-nvidia.toml"
	ContainerdDropInImport  = "/etc/containerd/conf.d/*.toml"
)

// dropInHeader heads every containerd drop-in Gantry writes.
const dropInHeader = "# Written by gantry runtime configure (nvidia-ctk runtime configure): the CRI plugin\n" +
	"# section of %s with the GPU runtime added, imported by that file.\n" +
	"# containerd before 2.1 lets an imported plugin section replace the main file's\n" +
	"# wholesale, so the whole section is copied here: after editing it in %s,\n" +
	"# run the command again. Regenerated on each run; edit the main file instead.\n"

// FileChange is what ApplyContainerdDropIn did (or would do) to one file.
type FileChange struct {
	Path    string
	Diff    string
	Changes []string
}

// ApplyContainerdDropIn registers the runtime in a containerd drop-in file
// instead of the main configuration, as NVIDIA's toolkit does: dropIn gets
// the main file's CRI plugin section (containerd before 2.1 replaces a
// plugin's section by an imported one wholesale, so it must be complete)
// with the runtime entries of opts added, under the main file's config
// version (2: io.containerd.grpc.v1.cri, 3: io.containerd.cri.v1.runtime);
// main gets an `imports` entry that covers dropIn (DIR/*.toml), unless one
// of its imports already matches it, and `version = 2` when it was empty.
// Both files are replaced atomically, the drop-in first, so the main file
// never imports a half-configured runtime. A second run with the same main
// file changes nothing. With dryRun nothing is written. The result lists
// only files that change.
func ApplyContainerdDropIn(mainPath, dropIn string, opts Options, dryRun bool) ([]FileChange, error) {
	if !filepath.IsAbs(dropIn) {
		return nil, fmt.Errorf("%w: the drop-in path %q is not absolute: give the full path (containerd's default drop-in directory is %s)", ErrInvalidOptions, dropIn, filepath.Dir(ContainerdDropInImport))
	}
	mainTarget, err := resolveTarget(mainPath)
	if err != nil {
		return nil, err
	}
	dropTarget, err := resolveTarget(dropIn)
	if err != nil {
		return nil, err
	}
	if filepath.Clean(mainTarget) == filepath.Clean(dropTarget) {
		return nil, fmt.Errorf("%w: the drop-in %s is the main configuration itself: name another file", ErrInvalidOptions, dropIn)
	}
	mainCur, mainExists, err := readIfExists(mainTarget, mainPath)
	if err != nil {
		return nil, err
	}
	dropCur, dropExists, err := readIfExists(dropTarget, dropIn)
	if err != nil {
		return nil, err
	}
	normOpts, names, err := opts.normalize(Containerd)
	if err != nil {
		return nil, err
	}
	criSource, sourceNote, err := readSource(Containerd, mainPath, mainCur, normOpts)
	if err != nil {
		return nil, err
	}
	mainNext, mainChanges, dropNext, dropChanges, err := planContainerdDropIn(mainPath, mainCur, criSource, dropIn, opts)
	if err != nil {
		return nil, err
	}
	if err := verifyDropIn(mainPath, mainNext, dropIn, dropNext, opts); err != nil {
		return nil, err
	}
	if sourceNote != "" {
		dropChanges = append([]string{sourceNote}, dropChanges...)
	}
	// containerd's own loader reads both as planned, with the main file's
	// other imports; the line goes with the file that changes.
	dropChanged := !dropExists || !bytes.Equal(dropNext, dropCur)
	if dropChanged || len(mainChanges) > 0 {
		line, err := checkContainerdFiles(mainPath, map[string][]byte{mainPath: mainNext, filepath.Clean(dropIn): dropNext}, normOpts, names)
		if err != nil {
			return nil, err
		}
		if dropChanged {
			dropChanges = append(dropChanges, line)
		} else {
			mainChanges = append(mainChanges, line)
		}
	}
	var out []FileChange
	if !dropExists || !bytes.Equal(dropNext, dropCur) {
		from := dropIn
		if !dropExists {
			from = "/dev/null"
		}
		if dropExists {
			dropChanges = append([]string{"regenerate the drop-in (it differed from the main file's CRI section with the runtime added)"}, dropChanges...)
		}
		out = append(out, FileChange{Path: dropIn, Diff: unifiedDiff(from, dropIn, dropCur, dropNext), Changes: dropChanges})
	}
	if len(mainChanges) > 0 {
		from := mainPath
		if !mainExists {
			from = "/dev/null"
		}
		out = append(out, FileChange{Path: mainPath, Diff: unifiedDiff(from, mainPath, mainCur, mainNext), Changes: mainChanges})
	}
	if dryRun || len(out) == 0 {
		return out, nil
	}
	for i := range out {
		f := &out[i]
		if f.Path == dropIn {
			if err := writeConfig(dropTarget, dropIn, dropNext, dropExists); err != nil {
				return nil, err
			}
			if dropExists {
				f.Changes = append(f.Changes, "kept the old file as "+dropIn+BackupSuffix)
			}
			continue
		}
		if err := writeConfig(mainTarget, mainPath, mainNext, mainExists); err != nil {
			return nil, fmt.Errorf("%w (the drop-in %s is written; run again once the main file is writable)", err, dropIn)
		}
		if mainExists {
			f.Changes = append(f.Changes, "kept the old file as "+mainPath+BackupSuffix)
		}
	}
	return out, nil
}

// planContainerdDropIn is ApplyContainerdDropIn without I/O.
// criSource is what the drop-in's CRI section is copied from: mainCur,
// or containerd's dump of the main file (SourceCommand).
func planContainerdDropIn(mainPath string, mainCur, criSource []byte, dropIn string, opts Options) (mainNext []byte, mainChanges []string, dropNext []byte, dropChanges []string, err error) {
	doc, err := decodeTOML(mainCur)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%s: %w", mainPath, err)
	}
	src, err := decodeTOML(criSource)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%s: %w", mainPath, err)
	}
	version := int64(2)
	empty := len(doc) == 0
	if len(src) > 0 {
		switch v := src["version"].(type) {
		case nil:
			version = 1
		case int64:
			version = v
		default:
			return nil, nil, nil, nil, fmt.Errorf("%s: %w: version must be an integer, found %v: set `version = 2` or `version = 3`", mainPath, ErrMalformed, v)
		}
	}
	plugin, err := criPluginFor(version)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%s: %w (a version-1 file has no imports: drop-ins need version 2 or 3)", mainPath, err)
	}

	// The drop-in: version, and the main file's CRI plugin section.
	base := map[string]any{"version": version}
	if sec, ok, err := lookup(src, []string{"plugins", plugin}); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%s: %w", mainPath, err)
	} else if ok {
		if _, isTable := sec.(map[string]any); !isTable {
			return nil, nil, nil, nil, fmt.Errorf("%s: %w: plugins.%q is not a table: fix it", mainPath, ErrMalformed, plugin)
		}
		base["plugins"] = map[string]any{plugin: deepCopy(sec)}
	}
	var b bytes.Buffer
	enc := toml.NewEncoder(&b)
	enc.SetIndentTables(true)
	if err := enc.Encode(base); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%s: %w: cannot encode its CRI section: %v", mainPath, ErrMalformed, err)
	}
	r, err := plan(Containerd, b.Bytes(), opts)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%s: %w", dropIn, err)
	}
	dropNext = append([]byte(fmt.Sprintf(dropInHeader, mainPath, mainPath)), r.updated...)
	dropChanges = r.changes
	if _, ok := base["plugins"]; ok {
		dropChanges = append(dropChanges, fmt.Sprintf("copy plugins.%q of %s (version %d)", plugin, mainPath, version))
	}

	// The main file: an import that covers the drop-in.
	pattern := filepath.Join(filepath.Dir(dropIn), "*.toml")
	var imports []any
	switch v := doc["imports"].(type) {
	case nil:
	case []any:
		imports = v
	default:
		return nil, nil, nil, nil, fmt.Errorf("%s: %w: imports must be a list of paths, found %v", mainPath, ErrMalformed, v)
	}
	for _, im := range imports {
		s, ok := im.(string)
		if !ok {
			return nil, nil, nil, nil, fmt.Errorf("%s: %w: imports holds %v, not a path", mainPath, ErrMalformed, im)
		}
		// containerd resolves a relative import against the main file's
		// directory and expands patterns with filepath.Glob.
		if !filepath.IsAbs(s) {
			s = filepath.Join(filepath.Dir(mainPath), s)
		}
		if s == dropIn {
			return mainCur, nil, dropNext, dropChanges, nil
		}
		if m, err := filepath.Match(s, dropIn); err == nil && m {
			return mainCur, nil, dropNext, dropChanges, nil
		}
	}
	var ops []tomlOp
	if empty {
		ops = append(ops, tomlOp{key: "version", value: int64(2)})
		mainChanges = append(mainChanges, "set version = 2 (new configuration)")
	}
	next := append(append([]any{}, imports...), pattern)
	ops = append(ops, tomlOp{key: "imports", value: next})
	mainChanges = append(mainChanges, fmt.Sprintf("add %q to imports (was %s)", pattern, describeTOML(doc["imports"])))
	res, err := finishTOML(mainCur, doc, ops, mainChanges)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%s: %w", mainPath, err)
	}
	if res.lossy {
		return nil, nil, nil, nil, fmt.Errorf("%s: its layout does not let `imports` be added without rewriting the file: add imports = [%q] at its top by hand, or give --drop-in-config=\"\" to edit it in place", mainPath, pattern)
	}
	return res.updated, res.changes, dropNext, dropChanges, nil
}

// verifyDropIn reads the planned main file with its imports, as doctor
// and containerd read them (the drop-in as planned, other imports from
// disk), and checks that they register what was asked: a drop-in that no
// import covers, an import read after it that redefines the runtime, or an
// import that does not parse is refused before anything is written.
func verifyDropIn(mainPath string, mainNext []byte, dropIn string, dropNext []byte, opts Options) error {
	opts, names, err := opts.normalize(Containerd)
	if err != nil {
		return err
	}
	got, files, err := readContainerd(mainPath, map[string][]byte{mainPath: mainNext, filepath.Clean(dropIn): dropNext})
	if err != nil {
		return err
	}
	if !slices.Contains(files, filepath.Clean(dropIn)) {
		return fmt.Errorf("%w: %s would not import the drop-in %s (its imports cover only files named *.toml in a directory): name a .toml file", ErrInvalidOptions, mainPath, dropIn)
	}
	if err := verifyRegistered(Containerd, got, opts, names); err != nil {
		return fmt.Errorf("%s read with its imports (%s): %w: fix or remove the later import", mainPath, strings.Join(files, ", "), err)
	}
	return nil
}

// resolveTarget follows path's symlinks, as Apply does: a dangling link's
// target is the file to create.
func resolveTarget(path string) (string, error) {
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		return resolved, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("resolving %s: %w", path, err)
	} else if dest, lerr := os.Readlink(path); lerr == nil {
		if !filepath.IsAbs(dest) {
			dest = filepath.Join(filepath.Dir(path), dest)
		}
		return dest, nil
	}
	return path, nil
}

func readIfExists(target, path string) ([]byte, bool, error) {
	b, err := os.ReadFile(target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading %s: %w", path, err)
	}
	return b, true, nil
}

// writeConfig replaces target atomically, keeping an existing file's mode
// and owner.
func writeConfig(target, path string, data []byte, exists bool) error {
	mode := fs.FileMode(0o644)
	uid, gid := -1, -1
	if exists {
		fi, err := os.Stat(target)
		if err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file: name a file", path)
		}
		mode = fi.Mode().Perm()
		uid, gid = ownerOf(fi)
		// The old content, kept each time the file is replaced.
		old, err := os.ReadFile(target)
		if err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
		if err := writeFileAtomic(target+BackupSuffix, old, mode, uid, gid); err != nil {
			return fmt.Errorf("keeping a backup of %s before replacing it: %w (the file is unchanged)", path, err)
		}
	} else if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return fmt.Errorf("creating the directory for %s: %w", path, err)
	}
	if err := writeFileAtomic(target, data, mode, uid, gid); err != nil {
		return fmt.Errorf("writing %s: %w (the file is unchanged)", path, err)
	}
	return nil
}

func ownerOf(fi fs.FileInfo) (int, int) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid), int(st.Gid)
	}
	return -1, -1
}
