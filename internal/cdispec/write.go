package cdispec

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
)

// Formats Marshal and Write accept.
const (
	FormatYAML = "yaml"
	FormatJSON = "json"
)

// Marshal encodes spec as "yaml" or "json". YAML output starts with a "---"
// document marker, as the CDI library writes it; JSON is indented and ends in
// a newline, for people reading /etc/cdi.
func Marshal(spec *specs.Spec, format string) ([]byte, error) {
	if spec == nil {
		return nil, fmt.Errorf("marshalling CDI spec: %w: nil spec", ErrInvalidSpec)
	}
	switch format {
	case FormatYAML:
		b, err := marshalYAML(spec)
		if err != nil {
			return nil, fmt.Errorf("marshalling CDI spec %s as YAML: %w", spec.Kind, err)
		}
		return append([]byte("---\n"), b...), nil
	case FormatJSON:
		b, err := json.MarshalIndent(spec, "", "  ")
		if err != nil {
			return nil, fmt.Errorf("marshalling CDI spec %s as JSON: %w", spec.Kind, err)
		}
		return append(b, '\n'), nil
	}
	return nil, fmt.Errorf("CDI spec format %q: use yaml or json", format)
}

// FormatFor returns the format for path's extension (.yaml, .yml, .json);
// CDI runtimes only load .yaml and .json files, so other names are an error.
func FormatFor(path string) (string, error) {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml":
		return FormatYAML, nil
	case ".json":
		return FormatJSON, nil
	}
	return "", fmt.Errorf("CDI spec file %s: name it .yaml or .json (runtimes ignore other files), or give the format", path)
}

// Write stores spec at path in format ("" picks it from the extension). It
// writes a temporary file in the same directory, syncs it, sets mode 0644 and
// renames it over path, so readers see the old file or the new one, never a
// partial one; on any error the temporary file is removed.
func Write(spec *specs.Spec, path, format string) (err error) {
	if format == "" {
		if format, err = FormatFor(path); err != nil {
			return err
		}
	}
	data, err := Marshal(spec, format)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	// /var/run/cdi does not exist until something writes a spec there.
	if err = os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing CDI spec %s: %w", path, err)
	}
	if err = atomicfile.Write(path, data, atomicfile.Options{Mode: 0o644, Sync: true}); err != nil {
		return fmt.Errorf("writing CDI spec %s: %w (is the directory writable?)", path, err)
	}
	return nil
}
