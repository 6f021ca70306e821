package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/config"
	injectpkg "github.com/gantry-gpu/gantry/internal/inject"
	"github.com/gantry-gpu/gantry/internal/request"
)

// checkInventoryCache reads the runtime's cached inventories. A stale one
// is harmless (gantry-runtime compares the version on every create and
// rediscovers), so it is reported, not failed.
func checkInventoryCache(cfg config.Config, running string) Check {
	dir := cfg.Runtime.CacheDir
	if dir == "" {
		return skip(CheckInventoryCache, "the cache is disabled (runtime.cache-dir is empty)")
	}
	files, _ := filepath.Glob(filepath.Join(dir, injectpkg.CacheGlob))
	if len(files) == 0 {
		return skip(CheckInventoryCache, "no cached inventory in %s yet (gantry-runtime writes one on the first GPU container)", dir)
	}
	var current, stale, other []string
	for _, f := range files {
		c, err := injectpkg.ReadCacheStamp(f)
		switch {
		case err != nil:
			stale = append(stale, fmt.Sprintf("%s (unreadable: %v)", f, err))
		case c.DriverRoot != cfg.DriverRoot:
			other = append(other, f)
		case c.Version == running:
			current = append(current, f)
		default:
			stale = append(stale, fmt.Sprintf("%s (driver %s)", f, c.Version))
		}
	}
	ev := fmt.Sprintf("driver %s: current %s", running, listOrNone(current))
	if len(stale) > 0 {
		ev += fmt.Sprintf("; stale, replaced on the next GPU container: %s", strings.Join(stale, ", "))
	}
	if len(other) > 0 {
		ev += fmt.Sprintf("; %d for other driver roots", len(other))
	}
	return pass(CheckInventoryCache, "%s", ev)
}

// libVersion finds the driver version in a mounted driver library's name.
var libVersion = regexp.MustCompile(`^lib(?:cuda|nvidia-ml)\.so\.(\d+\.\d+(?:\.\d+)?)$`)

// checkCDISpecs checks that every spec of the configured kind was generated
// for the running driver: a spec mounts libcuda.so.<version>, and after a
// driver upgrade that file is gone and every container using the spec fails.
func checkCDISpecs(cfg config.Config, running string) Check {
	kind := cfg.CDI.Kind
	if kind == "" {
		kind = request.DefaultKind
	}
	var good, bad []string
	var regen []string
	for _, dir := range cfg.CDI.SpecDirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			ext := filepath.Ext(e.Name())
			if e.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
				continue
			}
			path := filepath.Join(dir, e.Name())
			spec, err := readSpec(path)
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s: %v", path, err))
				regen = append(regen, fmt.Sprintf("gantry cdi generate --output %s", path))
				continue
			}
			if spec.Kind != kind {
				continue
			}
			if hooks := hooksWithoutEnv(spec); len(hooks) > 0 {
				// CVE-2025-23266 class: a runtime runs a hook without env
				// with the container's environment, which the image
				// controls (LD_PRELOAD into a root process on the host).
				bad = append(bad, fmt.Sprintf("%s has hooks without an explicit env, which a runtime runs with the image's environment (unsafe, CVE-2025-23266): %s",
					path, strings.Join(hooks, ", ")))
				regen = append(regen, fmt.Sprintf("gantry cdi generate --output %s", path))
			}
			versions := specVersions(spec)
			switch {
			case len(hooksWithoutEnv(spec)) > 0 && (len(versions) == 0 || len(versions) == 1 && versions[0] == running):
				// reported above
			case len(versions) == 0:
				good = append(good, path+" (mounts no versioned driver library)")
			case len(versions) == 1 && versions[0] == running:
				good = append(good, path)
			default:
				bad = append(bad, fmt.Sprintf("%s was generated for driver %s but the running driver is %s",
					path, strings.Join(versions, ", "), running))
				regen = append(regen, fmt.Sprintf("gantry cdi generate --output %s", path))
			}
		}
	}
	if len(bad) > 0 {
		return fail(CheckCDISpecs, fix(fixCDISpec, "gantry cdi generate --output FILE", strings.Join(regen, "; ")),
			"%s", strings.Join(bad, "; "))
	}
	if len(good) == 0 {
		return skip(CheckCDISpecs, "no %s CDI spec in %s (needed only for --device %s=... and CDI-enabled engines)",
			kind, strings.Join(cfg.CDI.SpecDirs, ", "), kind)
	}
	return pass(CheckCDISpecs, "driver %s: %s", running, strings.Join(good, ", "))
}

func readSpec(path string) (*specs.Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	if err := yaml.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("not a CDI spec: %v", err)
	}
	return &s, nil
}

// specVersions returns the driver versions named by the spec's library mounts.
func specVersions(s *specs.Spec) []string {
	seen := map[string]bool{}
	add := func(e specs.ContainerEdits) {
		for _, m := range e.Mounts {
			if m == nil {
				continue
			}
			if v := libVersion.FindStringSubmatch(filepath.Base(m.HostPath)); v != nil {
				seen[v[1]] = true
			}
		}
	}
	add(s.ContainerEdits)
	for _, d := range s.Devices {
		add(d.ContainerEdits)
	}
	var out []string
	for v := range seen {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

func listOrNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

// hooksWithoutEnv names the hooks of spec (spec-wide and per device) that
// carry no env of their own.
func hooksWithoutEnv(spec *specs.Spec) []string {
	var out []string
	check := func(where string, hooks []*specs.Hook) {
		for _, h := range hooks {
			if h != nil && len(h.Env) == 0 {
				out = append(out, fmt.Sprintf("%s %s %s", where, h.HookName, h.Path))
			}
		}
	}
	check("spec-wide", spec.ContainerEdits.Hooks)
	for _, d := range spec.Devices {
		check("device "+d.Name, d.ContainerEdits.Hooks)
	}
	return out
}
