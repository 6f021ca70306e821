package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/gantry-gpu/gantry/internal/config"
)

// nvidia-ctk config works on Gantry's configuration file with NVIDIA's key
// names: each --set key=value is translated by the same table as gantry
// config migrate, and the Gantry key it maps to is set. A key Gantry has no
// use for (nvidia-container-runtime.mode: Gantry has one mode) changes
// nothing and says so; one whose value containers would notice and Gantry
// cannot honour is an error.

func init() {
	nvCommands = append(nvCommands,
		&nvCommand{
			words:   "config",
			summary: "set keys of the configuration by NVIDIA's names (Gantry's /etc/gantry/config.toml)",
			help: `Reads Gantry's configuration (--config-file, default $GANTRY_CONFIG or
/etc/gantry/config.toml; defaults when it is missing), applies each --set with
NVIDIA's config.toml key names, and prints the result, or writes it back with
--in-place (atomically) or to --output.

  sudo nvidia-ctk config --in-place --set nvidia-container-cli.root=/run/nvidia/driver
  sudo nvidia-ctk config --in-place --set nvidia-container-runtime.mode=cdi

Keys map as gantry config migrate maps them (its comments list every NVIDIA
key): nvidia-container-cli.root -> driver-root, nvidia-container-runtime.log-level
-> log-level, ...modes.cdi.spec-dirs -> cdi.spec-dirs, and so on. A key Gantry
does not need (nvidia-container-runtime.mode: Gantry serves legacy and CDI
requests alike; ldconfig; the hook paths) is reported and changes nothing. A key
whose value Gantry cannot honour is an error naming why. A key alone
(--set KEY) sets true.`,
			flags: []nvFlag{
				{Names: []string{"config-file", "config", "c"}, Help: "the configuration file (default $GANTRY_CONFIG or /etc/gantry/config.toml)"},
				{Names: []string{"set"}, Help: "KEY[=VALUE] in NVIDIA's names (repeatable)", Multi: true, Whole: true},
				{Names: []string{"set-list-separator"}, Help: "separator of list values in --set (default :)"},
				{Names: []string{"in-place", "i"}, Bool: true, Help: "write the result back to the file"},
				{Names: []string{"output", "o"}, Help: "write the result to this file (default stdout)"},
			},
			run: runNVConfig,
		},
		&nvCommand{
			words:   "config default",
			summary: "print Gantry's default configuration (gantry config default)",
			help: `Prints the default configuration file, every key documented, or writes it to
--output. create-default and generate-default are the same command.

  nvidia-ctk config default --output=/etc/gantry/config.toml`,
			flags: []nvFlag{{Names: []string{"output", "o"}, Help: "write it to this file (default stdout)"}},
			run:   runNVConfigDefault,
		},
	)
	for _, alias := range []string{"create-default", "generate-default"} {
		c := *nvCommands[len(nvCommands)-1]
		c.words = "config " + alias
		c.summary = "the same as config default"
		nvCommands = append(nvCommands, &c)
	}
}

func runNVConfigDefault(c *nvCtx, f nvValues) error {
	b, err := config.Default().Encode()
	if err != nil {
		return err
	}
	if out, ok := f.Str("output"); ok && out != "" {
		if err := config.WriteFile(out, b, true); err != nil {
			return fmt.Errorf("writing %s: %w", out, err)
		}
		fmt.Fprintf(c.stderr, "wrote %s\n", out)
		return nil
	}
	_, err = c.stdout.Write(b)
	return err
}

func runNVConfig(c *nvCtx, f nvValues) error {
	path, _ := f.Str("config-file")
	if path == "" {
		path = os.Getenv(config.EnvPath)
	}
	if path == "" {
		path = config.DefaultPath
	}
	if filepath.Clean(path) == config.NVIDIADefaultPath {
		return usagef("--config-file %s is NVIDIA's file, which Gantry does not read: give Gantry's (%s), or convert NVIDIA's with gantry config migrate", path, config.DefaultPath)
	}
	sep, ok := f.Str("set-list-separator")
	if !ok {
		sep = ":"
	}
	// Only a regular file is rewritten: GANTRY_CONFIG=/dev/null (no
	// configuration) must never have a file renamed over the device.
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() && f.On("in-place") {
		return usagef("--in-place: %s is not a regular file (GANTRY_CONFIG=/dev/null means no configuration file): name the file with --config-file", path)
	}
	cur := config.Default()
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if cur, err = config.Parse(b); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	case errors.Is(err, fs.ErrNotExist):
	default:
		return fmt.Errorf("reading %s: %w", path, err)
	}
	curMap, err := configMap(cur)
	if err != nil {
		return err
	}
	for _, s := range f["set"] {
		key, val, hasVal := strings.Cut(s, "=")
		key = strings.TrimSpace(key)
		if key == "" {
			return usagef("--set %q: want KEY[=VALUE]", s)
		}
		if !hasVal {
			val = "true"
		}
		changed, err := nvSetKey(c, key, val, sep)
		if err != nil {
			return err
		}
		for k, v := range changed {
			setDotted(curMap, k, v)
		}
	}
	out, err := toml.Marshal(curMap)
	if err != nil {
		return err
	}
	next, err := config.Parse(out)
	if err != nil {
		return fmt.Errorf("the result does not validate: %w", err)
	}
	enc, err := next.Encode()
	if err != nil {
		return err
	}
	if f.On("in-place") {
		if before, err := configMap(cur); err == nil && reflect.DeepEqual(before, curMap) {
			return nil // nothing changed: the file stays as it is, comments and all
		}
		if err := config.WriteFile(path, enc, true); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		fmt.Fprintf(c.stderr, "wrote %s\n", path)
		return nil
	}
	if o, ok := f.Str("output"); ok && o != "" {
		if err := config.WriteFile(o, enc, true); err != nil {
			return fmt.Errorf("writing %s: %w", o, err)
		}
		return nil
	}
	_, err = c.stdout.Write(enc)
	return err
}

// nvSetKey translates NVIDIA's key = val into the Gantry keys (dotted) and
// values it changes; none, with a note, for a key Gantry does not need.
func nvSetKey(c *nvCtx, key, val, sep string) (map[string]any, error) {
	parts := strings.Split(key, ".")
	for i, p := range parts {
		parts[i] = strconv.Quote(p)
	}
	tkey := strings.Join(parts, ".")
	var values []string
	if val == "true" || val == "false" {
		values = append(values, val)
	} else {
		values = append(values, strconv.Quote(val))
	}
	var list []string
	for _, v := range strings.Split(val, sep) {
		list = append(list, strconv.Quote(v))
	}
	values = append(values, "["+strings.Join(list, ", ")+"]")
	var mg *config.Migration
	var err error
	for _, v := range values {
		// A key's type is not known here: a string, then a list.
		if mg, err = config.MigrateNVIDIA([]byte(tkey+" = "+v+"\n"), config.MigrateOptions{LookPath: exec.LookPath}); err == nil {
			break
		}
	}
	if err != nil {
		return nil, usagef("--set %s=%s: %v", key, val, err)
	}
	var note *config.Note
	for i := range mg.Notes {
		if mg.Notes[i].Key == key {
			note = &mg.Notes[i]
		}
	}
	if note == nil {
		return nil, usagef("--set %s: not a key of NVIDIA's config.toml that Gantry knows (see gantry config migrate --help)", key)
	}
	switch note.Kind {
	case config.Mapped:
	case config.Ignored:
		fmt.Fprintf(c.stderr, "%s: %s = %s: not needed by Gantry (%s); nothing to change\n", c.name, key, val, note.Reason)
		return nil, nil
	case config.Unsupported:
		return nil, fmt.Errorf("--set %s=%s: not supported: %s", key, val, note.Reason)
	default:
		return nil, usagef("--set %s: unknown key (see gantry config migrate --help for NVIDIA's keys)", key)
	}
	def, err := configMap(config.Default())
	if err != nil {
		return nil, err
	}
	got, err := configMap(mg.Config)
	if err != nil {
		return nil, err
	}
	a, b := map[string]any{}, map[string]any{}
	flattenMap("", def, a)
	flattenMap("", got, b)
	changed := map[string]any{}
	for k, v := range b {
		if !reflect.DeepEqual(a[k], v) {
			changed[k] = v
		}
	}
	keys := make([]string, 0, len(changed))
	for k := range changed {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		// The value is Gantry's default: set it, for the file may hold
		// another.
		v, ok := b[note.To]
		if !ok {
			return nil, fmt.Errorf("--set %s: maps to %s, which Gantry's configuration lacks (a bug: report it)", key, note.To)
		}
		fmt.Fprintf(c.stderr, "%s: %s = %s -> %s (Gantry's default)\n", c.name, key, val, note.To)
		changed[note.To] = v
	} else {
		fmt.Fprintf(c.stderr, "%s: %s = %s -> %s\n", c.name, key, val, strings.Join(keys, ", "))
	}
	return changed, nil
}

// configMap is c as TOML's generic tree.
func configMap(c config.Config) (map[string]any, error) {
	b, err := toml.Marshal(c)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := toml.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return m, nil
}

func flattenMap(prefix string, m map[string]any, out map[string]any) {
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			flattenMap(prefix+k+".", sub, out)
			continue
		}
		out[prefix+k] = v
	}
}

func setDotted(m map[string]any, key string, v any) {
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		sub, ok := m[p].(map[string]any)
		if !ok {
			sub = map[string]any{}
			m[p] = sub
		}
		m = sub
	}
	m[parts[len(parts)-1]] = v
}
