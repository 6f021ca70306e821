package engineconfig

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	toml "github.com/pelletier/go-toml/v2"
)

// ErrEngineRejects: the engine's own parser, run on the planned
// configuration before it replaces the file, refused it or read it
// differently from what configure meant (a default runtime without an
// entry, a runtime missing). Nothing is written.
var ErrEngineRejects = errors.New("the engine would not load the planned configuration")

// ConfigSource says where configure reads the configuration it edits.
type ConfigSource string

const (
	// SourceFile edits the file as it is on disk (and, for a containerd
	// drop-in, copies the main file's CRI section): the admin's comments
	// and layout survive. The default.
	SourceFile ConfigSource = "file"
	// SourceCommand starts from the engine's own view of its
	// configuration: `containerd --config FILE config dump` (the file, its
	// imports and containerd's built-in defaults merged, what the daemon
	// loads) or `crio --config FILE config`. The file written is that view
	// with the runtime added, as NVIDIA's --config-source=command does;
	// comments are not kept (the old file is kept as FILE.gantry-backup).
	// Docker has no such command: daemon.json is read as it is.
	SourceCommand ConfigSource = "command"
	// SourceCommandOrFile is SourceCommand where the engine's program is
	// found and SourceFile otherwise (NVIDIA's "command,file").
	SourceCommandOrFile ConfigSource = "command,file"
)

// ParseConfigSource checks a --config-source value.
func ParseConfigSource(s string) (ConfigSource, error) {
	switch ConfigSource(strings.TrimSpace(s)) {
	case "", SourceFile:
		return SourceFile, nil
	case SourceCommand:
		return SourceCommand, nil
	case SourceCommandOrFile:
		return SourceCommandOrFile, nil
	case "file,command":
		return SourceFile, nil // the file is always there to read
	}
	return "", fmt.Errorf("%w: config source %q: use file (the file on disk, the default), command (the engine's `config dump`) or command,file (command where the engine's program is found)", ErrInvalidOptions, s)
}

// engineProgram is the engine's own program, the one whose parser checks
// a candidate.
func engineProgram(e Engine) string {
	d, _ := Lookup(e)
	return d.Program
}

// checkTimeout bounds one run of an engine's parser; generous, for busy
// machines: a config dump takes well under a second on an idle one.
const checkTimeout = 2 * time.Minute

// findEngine returns the engine's program: opts.EngineBinary, else its
// name on PATH; "" when not found (with the reason).
func findEngine(e Engine, opts Options) (string, string) {
	if opts.EngineBinary != "" {
		return opts.EngineBinary, ""
	}
	p, err := exec.LookPath(engineProgram(e))
	if err != nil {
		return "", fmt.Sprintf("%s is not on PATH", engineProgram(e))
	}
	return p, ""
}

// runEngine runs the engine's program with args and returns its stdout;
// an error carries its stderr.
func runEngine(bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = msg[len(msg)-2000:]
		}
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		return nil, fmt.Errorf("`%s %s`: %v: %s", bin, strings.Join(args, " "), err, oneLine(msg))
	}
	return stdout.Bytes(), nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// containerdDump is `containerd --config PATH config dump`: what the
// daemon loads from path (its imports and built-in defaults merged).
func containerdDump(bin, path string) ([]byte, error) {
	return runEngine(bin, "--config", path, "config", "dump")
}

// checkContainerd has containerd's own loader read the planned files
// (path -> content; mainPath among them) before they replace the real
// ones: the main file is written to a temporary directory with its
// imports spelled out (the planned imports there too, the others where
// they are), `containerd --config TEMP config dump` must succeed, and
// what it prints must define the default runtime and register every
// runtime asked for. It returns a line for the change list.
func checkContainerd(bin, mainPath string, planned map[string][]byte, opts Options, names []string) (string, error) {
	dir, err := os.MkdirTemp("", "gantry-containerd-check-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	doc, err := decodeTOML(planned[mainPath])
	if err != nil {
		return "", fmt.Errorf("%s: %w", mainPath, err)
	}
	if list, ok := doc["imports"].([]any); ok && len(list) > 0 {
		var spelled []any
		n := 0
		for _, v := range list {
			p, _ := v.(string)
			if p == "" {
				continue
			}
			if !filepath.IsAbs(p) {
				p = filepath.Join(filepath.Dir(mainPath), p)
			}
			paths := []string{p}
			if strings.ContainsAny(p, "*?[") {
				m, _ := filepath.Glob(p)
				for f := range planned {
					if ok, _ := filepath.Match(p, f); ok && !slices.Contains(m, f) {
						m = append(m, f)
					}
				}
				sort.Strings(m)
				paths = m
			}
			for _, ip := range paths {
				if b, ok := planned[filepath.Clean(ip)]; ok {
					n++
					ip = filepath.Join(dir, fmt.Sprintf("import-%02d-%s", n, filepath.Base(ip)))
					if err := os.WriteFile(ip, b, 0o600); err != nil {
						return "", err
					}
				}
				spelled = append(spelled, ip)
			}
		}
		doc["imports"] = spelled
	}
	main, err := toml.Marshal(doc)
	if err != nil {
		return "", fmt.Errorf("%s: %w: %v", mainPath, ErrMalformed, err)
	}
	candidate := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(candidate, main, 0o600); err != nil {
		return "", err
	}
	version := engineVersion(bin)
	dump, err := containerdDump(bin, candidate)
	if err != nil {
		return "", fmt.Errorf("%w: %s (%s) refuses what configure planned for %s: %v; %s is unchanged: fix the file so that `containerd --config %s config dump` succeeds, then run again",
			ErrEngineRejects, bin, version, mainPath, err, mainPath, mainPath)
	}
	if dumped, err := decodeTOML(dump); err == nil {
		want, _ := doc["version"].(int64)
		if have, _ := dumped["version"].(int64); have < want {
			return "", fmt.Errorf("%w: %s is config version %d, and %s (%s) reads version %d at most: it would ignore the file's CRI section; %s is unchanged: check with the containerd that reads the file (--executable-path), or write a version-%d file for this one",
				ErrEngineRejects, mainPath, want, bin, version, have, mainPath, have)
		}
	}
	got, err := parseContainerd(dump)
	if err != nil {
		return "", fmt.Errorf("%w: %s (%s) config dump of what configure planned for %s does not read back: %v; %s is unchanged", ErrEngineRejects, bin, version, mainPath, err, mainPath)
	}
	if got.CRIDisabled != "" {
		// Docker CE's config.toml: containerd loads the file, and a
		// disabled plugin's settings are not in its dump (1.x) or not
		// used; the runtimes wait for the CRI plugin to be enabled.
		return fmt.Sprintf("checked by %s (%s): `config dump` loads the result; its CRI plugin is disabled (disabled_plugins %s), so the runtimes are used once it is enabled", bin, version, got.CRIDisabled), nil
	}
	def := got.DefaultRuntime
	if def == "" {
		def = builtinRuncDefault
	}
	var have []string
	for _, rt := range got.Runtimes {
		have = append(have, rt.Name)
	}
	if _, ok := got.Runtime(def); !ok {
		return "", fmt.Errorf("%w: %s (%s) would have no entry for its default runtime %q with what configure planned for %s (its runtimes would be %s), so its CRI plugin would not load; %s is unchanged: define runtimes.%s in the file (or report this as a Gantry bug)",
			ErrEngineRejects, bin, version, def, mainPath, strings.Join(have, ", "), mainPath, def)
	}
	for _, n := range names {
		if rt, ok := got.Runtime(n); !ok || rt.Program != opts.RuntimePath {
			return "", fmt.Errorf("%w: %s (%s) does not see runtime %q running %s in what configure planned for %s (its runtimes would be %s): an import may override the CRI section; %s is unchanged",
				ErrEngineRejects, bin, version, n, opts.RuntimePath, mainPath, strings.Join(have, ", "), mainPath)
		}
	}
	return fmt.Sprintf("checked by %s (%s): `config dump` of the result has runtimes %s, default %s", bin, version, strings.Join(have, ", "), def), nil
}

// engineVersion is the engine's --version line, for messages.
func engineVersion(bin string) string {
	out, err := runEngine(bin, "--version")
	if err != nil {
		return "version unknown"
	}
	return oneLine(string(out))
}

// checkDocker has dockerd read the planned daemon.json where it can:
// `dockerd --validate --config-file CANDIDATE` (Docker 23.0 and later).
// dockerd 20.10 (Debian 12's) has no --validate; there the result is read
// the way dockerd's loader judges runtimes instead, and the line returned
// says so.
func checkDocker(bin, path string, planned []byte) (string, error) {
	if err := strictDocker(planned); err != nil {
		return "", fmt.Errorf("%w: %s as planned: %v; %s is unchanged", ErrEngineRejects, path, err, path)
	}
	if bin == "" {
		return "", nil
	}
	help, _ := exec.Command(bin, "--help").CombinedOutput()
	version := engineVersion(bin)
	if !bytes.Contains(help, []byte("--validate")) {
		return fmt.Sprintf("%s (%s) has no --validate (Docker 23.0 added it): the result was checked by Gantry's reader (JSON, runtimes, default-runtime)", bin, version), nil
	}
	dir, err := os.MkdirTemp("", "gantry-docker-check-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	candidate := filepath.Join(dir, "daemon.json")
	if err := os.WriteFile(candidate, planned, 0o600); err != nil {
		return "", err
	}
	if _, err := runEngine(bin, "--validate", "--config-file", candidate); err != nil {
		return "", fmt.Errorf("%w: %s (%s) refuses what configure planned for %s: %v; %s is unchanged", ErrEngineRejects, bin, version, path, err, path)
	}
	return fmt.Sprintf("checked by %s (%s): dockerd --validate accepts the result", bin, version), nil
}

// strictDocker reads daemon.json's runtime settings the way dockerd's
// loader does: every runtime an object with a string path (or, Docker 23+,
// a runtimeType) and string runtimeArgs, no runtime named runc (reserved),
// and a default-runtime that is runc or a defined runtime.
func strictDocker(data []byte) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	var doc struct {
		Runtimes       map[string]json.RawMessage `json:"runtimes"`
		DefaultRuntime *string                    `json:"default-runtime"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return jsonSyntaxError(data, err)
	}
	for name, raw := range doc.Runtimes {
		var rt struct {
			Path        *string  `json:"path"`
			RuntimeType *string  `json:"runtimeType"`
			RuntimeArgs []string `json:"runtimeArgs"`
		}
		if err := json.Unmarshal(raw, &rt); err != nil {
			return fmt.Errorf("runtimes.%s: %v", name, err)
		}
		if name == "runc" {
			return fmt.Errorf("runtimes.runc: dockerd reserves the name runc")
		}
		if (rt.Path == nil || *rt.Path == "") && (rt.RuntimeType == nil || *rt.RuntimeType == "") {
			return fmt.Errorf("runtimes.%s has no path", name)
		}
	}
	if doc.DefaultRuntime != nil {
		d := *doc.DefaultRuntime
		if _, ok := doc.Runtimes[d]; !ok && d != "runc" && d != "io.containerd.runc.v2" {
			return fmt.Errorf("default-runtime %q is not among the runtimes dockerd knows", d)
		}
	}
	return nil
}

// checkCRIO has CRI-O read the planned drop-in with the rest of its
// configuration where a crio binary is present: `crio --config MAIN
// --config-dir DIR config` with DIR a copy of the drop-in directory
// holding the planned file, which must exit 0 (CRI-O parses and merges
// every file first). Without crio the result was read by Gantry's reader
// (Plan's read-back) and the line says so.
func checkCRIO(bin, path string, planned []byte) (string, error) {
	if bin == "" {
		return "", nil
	}
	version := engineVersion(bin)
	dir, err := os.MkdirTemp("", "gantry-crio-check-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	dropDir := filepath.Join(dir, "crio.conf.d")
	if err := os.Mkdir(dropDir, 0o700); err != nil {
		return "", err
	}
	main := CRIOMainConfig
	if filepath.Base(path) == filepath.Base(CRIOMainConfig) {
		// crio.conf itself, edited in place (--drop-in-config="").
		main = filepath.Join(dir, "crio.conf")
		if err := os.WriteFile(main, planned, 0o600); err != nil {
			return "", err
		}
	} else {
		// A drop-in: its directory's other files as they are, and it.
		ents, _ := os.ReadDir(filepath.Dir(path))
		for _, e := range ents {
			if b, err := os.ReadFile(filepath.Join(filepath.Dir(path), e.Name())); err == nil && e.Type().IsRegular() {
				_ = os.WriteFile(filepath.Join(dropDir, e.Name()), b, 0o600)
			}
		}
		if err := os.WriteFile(filepath.Join(dropDir, filepath.Base(path)), planned, 0o600); err != nil {
			return "", err
		}
	}
	args := []string{"--config-dir", dropDir}
	if _, err := os.Stat(main); err == nil {
		args = append([]string{"--config", main}, args...)
	}
	if _, err := runEngine(bin, append(args, "config")...); err != nil {
		return "", fmt.Errorf("%w: %s (%s) refuses what configure planned for %s: %v; %s is unchanged", ErrEngineRejects, bin, version, path, err, path)
	}
	return fmt.Sprintf("checked by %s (%s): `crio config` reads the result", bin, version), nil
}
