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
