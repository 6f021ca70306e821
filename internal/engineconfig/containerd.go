package engineconfig

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// containerdDefinition is containerd: config.toml, its imports and drop-ins (dropin.go).
var containerdDefinition = Definition{
	Name:        Containerd,
	DefaultPath: "/etc/containerd/config.toml",
	Writes: `/etc/containerd/config.toml (version 2, 3 and 4 layouts): a runc-v2 runtime
              "nvidia" whose options.BinaryName is the runtime, copying runc's options,
              and the default runtime's own entry (runc) when the file has none:
              containerd 1.x forgets its built-in runc once the file defines a runtime`,
	Program:   "containerd",
	CheckHelp: "containerd --config FILE config dump, which must show the default runtime and ours",
	Restart:   "systemctl restart containerd",
	Plan:      planned(planContainerd),
	Parse:     parseContainerd,
	Read:      ReadContainerd,
	Check: func(bin, path string, planned []byte, opts Options, names []string) (string, error) {
		if bin == "" {
			return "", nil
		}
		return checkContainerd(bin, path, map[string][]byte{path: planned}, opts, names)
	},
	Source: containerdSource,
}

// containerdSource is --config-source=command for containerd: `containerd
// --config PATH config dump`, with the file's own imports kept.
func containerdSource(bin, why, path string, current []byte) ([]byte, string, error) {
	if bin == "" {
		return nil, "", fmt.Errorf("%w: --config-source=command runs `containerd config dump`, but %s: give the binary (--executable-path) or use --config-source=file", ErrInvalidOptions, why)
	}
	if current == nil {
		// containerd's dump of a missing file is its built-in
		// configuration; a file is made from it.
		dir, err := os.MkdirTemp("", "gantry-containerd-source-")
		if err != nil {
			return nil, "", err
		}
		defer os.RemoveAll(dir)
		empty := filepath.Join(dir, "config.toml")
		if err := os.WriteFile(empty, nil, 0o600); err != nil {
			return nil, "", err
		}
		path = empty
	}
	dump, err := containerdDump(bin, path)
	if err != nil {
		return nil, "", fmt.Errorf("%w: --config-source=command: containerd cannot load %s as it is: %v: fix it (or use --config-source=file)", ErrEngineRejects, path, err)
	}
	// The dump lists the files it merged under imports, the file
	// itself first; what they hold is in the dump already. The file's
	// own imports stay as they were, so a file that another tool owns
	// keeps being read.
	doc, err := decodeTOML(dump)
	if err != nil {
		return nil, "", fmt.Errorf("%w: `%s config dump` of %s does not parse: %v", ErrEngineRejects, bin, path, err)
	}
	keep := []any{}
	if cur, err := decodeTOML(current); err == nil {
		if list, ok := cur["imports"].([]any); ok {
			keep = list
		}
	}
	dump, _, err = applyTOMLOps(dump, doc, []tomlOp{{key: "imports", value: keep}})
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	return dump, fmt.Sprintf("started from `%s --config %s config dump` (the file, its imports and containerd's defaults; comments are not kept)", bin, path), nil
}

// checkContainerdFiles is checkContainerd with the containerd of opts,
// or the line saying why none checked the files.
func checkContainerdFiles(mainPath string, planned map[string][]byte, opts Options, names []string) (string, error) {
	bin, why := "", "the engine check is off (--no-engine-check)"
	if !opts.SkipEngineCheck {
		bin, why = findEngine(Containerd, opts)
	}
	if bin == "" {
		return fmt.Sprintf("not checked by containerd itself (%s): read back by Gantry's reader only", why), nil
	}
	return checkContainerd(bin, mainPath, planned, opts, names)
}

// runcShimType is the containerd shim that honours options.BinaryName, so
// pointing BinaryName at gantry-runtime makes the shim exec it instead of
// runc.
const runcShimType = "io.containerd.runc.v2"

// criPluginFor maps a containerd config format version to the name of the
// plugin that holds the CRI runtime settings.
func criPluginFor(version int64) (string, error) {
	switch version {
	case 2:
		return "io.containerd.grpc.v1.cri", nil
	case 3, 4:
		// Version 4 (containerd 2.3+, `containerd config default` of 2.4)
		// moves the server settings (grpc, ttrpc, debug, metrics) into
		// plugins; the CRI runtime plugin is version 3's.
		return "io.containerd.cri.v1.runtime", nil
	case 1:
		return "", fmt.Errorf("%w: version 1 (containerd 1.x's original format): convert it to version 2 first, "+
			"either with containerd 2.x's `containerd config migrate` or by adding `version = 2` and renaming "+
			"[plugins.cri...] tables to [plugins.\"io.containerd.grpc.v1.cri\"...], then run again", ErrUnsupportedVersion)
	}
	return "", fmt.Errorf("%w: version %d: this gantry knows versions 2 (containerd 1.x), 3 and 4 (containerd 2.x); upgrade gantry", ErrUnsupportedVersion, version)
}

func planContainerd(current []byte, opts Options, names []string) (result, error) {
	doc, err := decodeTOML(current)
	if err != nil {
		return result{}, err
	}
	var ops []tomlOp
	var changes []string

	version := int64(2)
	if len(doc) == 0 {
		// No file, or only comments: containerd runs on built-in defaults.
		// Version 2 is read by containerd 1.3 and later, 2.x included.
		ops = append(ops, tomlOp{key: "version", value: version})
		changes = append(changes, "set version = 2 (new configuration)")
	} else {
		switch v := doc["version"].(type) {
		case nil:
			version = 1
		case int64:
			version = v
		default:
			return result{}, fmt.Errorf("%w: version must be an integer, found %v: set `version = 2` or `version = 3`", ErrMalformed, v)
		}
	}
	plugin, err := criPluginFor(version)
	if err != nil {
		return result{}, err
	}
	base := []string{"plugins", plugin, "containerd"}
	runtimesPath := append(append([]string{}, base...), "runtimes")

	defaultName := ""
	if v, ok, err := lookup(doc, append(append([]string{}, base...), "default_runtime_name")); err != nil {
		return result{}, err
	} else if ok {
		defaultName, _ = v.(string)
	}

	template, templateName, err := containerdTemplate(doc, runtimesPath, defaultName, names)
	if err != nil {
		return result{}, err
	}
	keep, err := keepDefaultRuntime(doc, runtimesPath, defaultName, names)
	if err != nil {
		return result{}, err
	}

	// The default goes before the runtimes so a new file reads top-down.
	if opts.SetAsDefault && defaultName != opts.RuntimeName {
		ops = append(ops, tomlOp{table: base, key: "default_runtime_name", value: opts.RuntimeName})
		was := "unset, containerd uses runc"
		if defaultName != "" {
			was = defaultName
		}
		changes = append(changes, fmt.Sprintf("set %s.default_runtime_name = %s (was %s)", tomlPath(base), opts.RuntimeName, was))
	}
	if keep != "" {
		entryPath := append(append([]string{}, runtimesPath...), keep)
		ops = append(ops, tomlOp{table: entryPath, newTable: builtinRuncEntry(), placeAfter: runtimesPath})
		changes = append(changes, fmt.Sprintf("add %s (runtime_type %s, containerd's built-in options): containerd 1.x forgets its built-in %s once the file defines a runtime, and its CRI plugin does not load without the default runtime", tomlPath(entryPath), runcShimType, keep))
	}
	for _, name := range names {
		entryPath := append(append([]string{}, runtimesPath...), name)
		v, ok, err := lookup(doc, entryPath)
		if err != nil {
			return result{}, err
		}
		if !ok {
			entry := map[string]any{}
			if template != nil {
				entry = deepCopy(template).(map[string]any)
			}
			entry["runtime_type"] = runcShimType
			options, _ := entry["options"].(map[string]any)
			if options == nil {
				options = map[string]any{}
			}
			options["BinaryName"] = opts.RuntimePath
			entry["options"] = options
			ops = append(ops, tomlOp{table: entryPath, newTable: entry, placeAfter: runtimesPath})
			msg := fmt.Sprintf("add %s (runtime_type %s, options.BinaryName %s", tomlPath(entryPath), runcShimType, opts.RuntimePath)
			if templateName != "" {
				msg += ", other settings copied from runtimes." + templateName
			}
			changes = append(changes, msg+")")
			continue
		}
		entry, isTable := v.(map[string]any)
		if !isTable {
			return result{}, fmt.Errorf("%w: %s is not a table: remove it and run again", ErrMalformed, tomlPath(entryPath))
		}
		if rt, _ := entry["runtime_type"].(string); rt != runcShimType {
			ops = append(ops, tomlOp{table: entryPath, key: "runtime_type", value: runcShimType})
			changes = append(changes, fmt.Sprintf("set %s.runtime_type = %s (was %s)", tomlPath(entryPath), runcShimType, describeTOML(entry["runtime_type"])))
		}
		optionsPath := append(append([]string{}, entryPath...), "options")
		optv, hasOptions := entry["options"]
		if _, isTable := optv.(map[string]any); hasOptions && !isTable {
			return result{}, fmt.Errorf("%w: %s is not a table: remove it and run again", ErrMalformed, tomlPath(optionsPath))
		}
		options, _ := optv.(map[string]any)
		if bn, _ := options["BinaryName"].(string); bn != opts.RuntimePath {
			ops = append(ops, tomlOp{table: optionsPath, key: "BinaryName", value: opts.RuntimePath})
			changes = append(changes, fmt.Sprintf("set %s.BinaryName = %s (was %s)", tomlPath(optionsPath), opts.RuntimePath, describeTOML(options["BinaryName"])))
		}
	}

	if opts.EnableCDI {
		pluginPath := []string{"plugins", plugin}
		v, _, err := lookup(doc, append(append([]string{}, pluginPath...), "enable_cdi"))
		if err != nil {
			return result{}, err
		}
		if on, _ := v.(bool); !on {
			was := "unset"
			if v != nil {
				was = describeTOML(v)
			}
			ops = append(ops, tomlOp{table: pluginPath, key: "enable_cdi", value: true})
			changes = append(changes, fmt.Sprintf("set %s.enable_cdi = true (was %s)", tomlPath(pluginPath), was))
		}
	}
	if len(ops) == 0 {
		return result{}, nil
	}
	if imports, ok := doc["imports"].([]any); ok && len(imports) > 0 && version < 4 {
		// Version 4 is read by containerd 2.3 and later only.
		// Imported files are merged after the main file; before containerd
		// 2.1 a plugin section there replaces ours wholesale.
		changes = append(changes, fmt.Sprintf("note: this file imports %v; a CRI plugin section in an imported file overrides these settings on containerd older than 2.1", imports))
	}
	return finishTOML(current, doc, ops, changes)
}

// builtinRuncDefault is the runtime containerd's CRI plugin uses when the
// file sets no default_runtime_name, and the only one it defines itself.
const builtinRuncDefault = "runc"

// keepDefaultRuntime returns the default runtime's name when the file does
// not define its entry, so that configure writes it: containerd 1.6 and
// 1.7 decode the CRI plugin's section over their built-in configuration
// with go-toml v1, which replaces a map instead of merging into it (its
// Tree.Unmarshal makes a new map), so a file that defines any runtime
// loses the built-in runc; the CRI plugin then refuses to load ("no
// corresponding runtime configured in containerd.runtimes for
// default_runtime_name") and a Kubernetes node loses its runtime. 2.x
// decodes with go-toml v2, which merges into the built-in map, so the
// entry is redundant there but harmless. A default that is neither
// defined nor runc was already broken: that is refused, naming the fix,
// unless an import may define it (ApplyContainerdDropIn and the engine's
// own check read those).
func keepDefaultRuntime(doc tomlDoc, runtimesPath []string, defaultName string, ours []string) (string, error) {
	name := defaultName
	if name == "" {
		name = builtinRuncDefault
	}
	if slices.Contains(ours, name) {
		return "", nil // registered below
	}
	if _, ok, err := lookup(doc, append(append([]string{}, runtimesPath...), name)); err != nil || ok {
		return "", err
	}
	if name != builtinRuncDefault {
		if imports, _ := doc["imports"].([]any); len(imports) > 0 {
			return "", nil
		}
		return "", fmt.Errorf("%w: %s.default_runtime_name is %q but the file defines no %s.%s: containerd's CRI plugin cannot load it as it is; define that runtime or remove default_runtime_name, then run again",
			ErrMalformed, tomlPath(runtimesPath[:len(runtimesPath)-1]), name, tomlPath(runtimesPath), name)
	}
	return name, nil
}

// builtinRuncEntry is the runc entry containerd defines itself: the runc
// shim with all-default options. The options are the keys both 1.x's and
// 2.x's built-in entry carry (`containerd config default`), each at its
// zero value, which is what the shim uses when a key is absent.
func builtinRuncEntry() map[string]any {
	return map[string]any{
		"runtime_type": runcShimType,
		"options": map[string]any{
			"BinaryName":    "",
			"CriuImagePath": "",
			"CriuWorkPath":  "",
			"IoGid":         int64(0),
			"IoUid":         int64(0),
			"NoNewKeyring":  false,
			"Root":          "",
			"ShimCgroup":    "",
			"SystemdCgroup": false,
		},
	}
}

// containerdTemplate picks the runtime whose settings a new entry copies
// (cgroup driver, annotations, ...): the current default, then runc, then
// crun, then one of the names being registered that already exists. Only
// runtimes on the runc shim qualify: BinaryName means nothing to others.
// Copying from an NVIDIA entry is fine because runtime_type and BinaryName
// are overwritten anyway.
func containerdTemplate(doc tomlDoc, runtimesPath []string, defaultName string, ours []string) (map[string]any, string, error) {
	for _, name := range append([]string{defaultName, "runc", "crun"}, ours...) {
		if name == "" {
			continue
		}
		v, ok, err := lookup(doc, append(append([]string{}, runtimesPath...), name))
		if err != nil {
			return nil, "", err
		}
		entry, isTable := v.(map[string]any)
		if !ok || !isTable {
			continue
		}
		if rt, _ := entry["runtime_type"].(string); rt != "" && rt != runcShimType {
			continue
		}
		return entry, name, nil
	}
	return nil, "", nil
}

// describeTOML renders an old value for a change line.
func describeTOML(v any) string {
	if v == nil {
		return "unset"
	}
	s, err := tomlValue(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return s
}

// finishTOML applies ops and notes when the file had to be re-encoded.
func finishTOML(current []byte, doc tomlDoc, ops []tomlOp, changes []string) (result, error) {
	updated, lossy, err := applyTOMLOps(current, doc, ops)
	if err != nil {
		return result{}, err
	}
	if lossy && len(bytes.TrimSpace(current)) > 0 {
		changes = append(changes, "rewrote the whole file: its comments and layout were not preserved (Apply keeps the original beside it, suffixed "+BackupSuffix+")")
	}
	return result{updated: updated, changes: changes, lossy: lossy}, nil
}
