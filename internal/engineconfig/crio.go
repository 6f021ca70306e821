package engineconfig

import (
	"fmt"
	"path/filepath"
)

// crioDefinition is CRI-O: a drop-in in crio.conf.d, read with crio.conf and the other drop-ins (ReadCRIO).
var crioDefinition = Definition{
	Name:        CRIO,
	Aliases:     []string{"cri-o"}, // how the project spells itself
	Title:       "CRI-O",
	DefaultPath: "/etc/crio/crio.conf.d/99-nvidia.toml",
	Writes:      "/etc/crio/crio.conf.d/99-nvidia.toml: [crio.runtime.runtimes.nvidia]",
	Program:     "crio",
	CheckHelp:   "crio config",
	Restart:     "systemctl restart crio",
	Plan:        planned(planCRIO),
	Parse:       parseCRIO,
	Check: func(bin, path string, planned []byte, _ Options, _ []string) (string, error) {
		return checkCRIO(bin, path, planned)
	},
	Source: crioSource,
}

// crioSource is --config-source=command for CRI-O: `crio config`, for
// crio.conf itself.
func crioSource(bin, why, path string, current []byte) ([]byte, string, error) {
	if bin == "" {
		return nil, "", fmt.Errorf("%w: --config-source=command runs `crio config`, but %s: give the binary (--executable-path) or use --config-source=file", ErrInvalidOptions, why)
	}
	// crio config prints the whole merged configuration: the
	// drop-in is written from it only when it is the main file.
	if filepath.Base(path) != filepath.Base(CRIOMainConfig) {
		return current, fmt.Sprintf("--config-source=command: %s is a drop-in, which holds only the runtime: read as a file", path), nil
	}
	out, err := runEngine(bin, "--config", path, "config")
	if err != nil {
		return nil, "", fmt.Errorf("%w: --config-source=command: CRI-O cannot load %s as it is: %v: fix it (or use --config-source=file)", ErrEngineRejects, path, err)
	}
	return out, fmt.Sprintf("started from `%s --config %s config`", bin, path), nil
}

// crioRuntimeType is CRI-O's handler type for a plain OCI runtime binary
// (the other types, "vm" and "pod", are for sandboxed runtimes).
const crioRuntimeType = "oci"

func planCRIO(current []byte, opts Options, names []string) (result, error) {
	doc, err := decodeTOML(current)
	if err != nil {
		return result{}, err
	}
	var ops []tomlOp
	var changes []string
	base := []string{"crio", "runtime"}
	runtimesPath := []string{"crio", "runtime", "runtimes"}

	// The default goes first so that in a new drop-in [crio.runtime] comes
	// before its sub-tables, as people write it by hand.
	if opts.SetAsDefault {
		v, _, err := lookup(doc, []string{"crio", "runtime", "default_runtime"})
		if err != nil {
			return result{}, err
		}
		if old, _ := v.(string); old != opts.RuntimeName {
			ops = append(ops, tomlOp{table: base, key: "default_runtime", value: opts.RuntimeName})
			was := "unset, CRI-O uses crun or runc"
			if v != nil {
				was = describeTOML(v)
			}
			changes = append(changes, fmt.Sprintf("set crio.runtime.default_runtime = %s (was %s)", opts.RuntimeName, was))
		}
	}

	for _, name := range names {
		entryPath := append(append([]string{}, runtimesPath...), name)
		v, ok, err := lookup(doc, entryPath)
		if err != nil {
			return result{}, err
		}
		if !ok {
			// monitor_path (conmon) and runtime_root are left to CRI-O's
			// defaults: it finds conmon on PATH and uses /run/<name>.
			entry := map[string]any{"runtime_path": opts.RuntimePath, "runtime_type": crioRuntimeType}
			ops = append(ops, tomlOp{table: entryPath, newTable: entry, placeAfter: runtimesPath})
			changes = append(changes, fmt.Sprintf("add %s (runtime_path %s, runtime_type %s)", tomlPath(entryPath), opts.RuntimePath, crioRuntimeType))
			continue
		}
		entry, isTable := v.(map[string]any)
		if !isTable {
			return result{}, fmt.Errorf("%w: %s is not a table: remove it and run again", ErrMalformed, tomlPath(entryPath))
		}
		if p, _ := entry["runtime_path"].(string); p != opts.RuntimePath {
			ops = append(ops, tomlOp{table: entryPath, key: "runtime_path", value: opts.RuntimePath})
			changes = append(changes, fmt.Sprintf("set %s.runtime_path = %s (was %s)", tomlPath(entryPath), opts.RuntimePath, describeTOML(entry["runtime_path"])))
		}
		if t, _ := entry["runtime_type"].(string); t != crioRuntimeType {
			ops = append(ops, tomlOp{table: entryPath, key: "runtime_type", value: crioRuntimeType})
			changes = append(changes, fmt.Sprintf("set %s.runtime_type = %s (was %s)", tomlPath(entryPath), crioRuntimeType, describeTOML(entry["runtime_type"])))
		}
	}
	if len(ops) == 0 {
		return result{}, nil
	}
	return finishTOML(current, doc, ops, changes)
}
