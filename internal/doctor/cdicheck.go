package doctor

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gantry-gpu/gantry/internal/cdispec"
	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/request"
)

// The CDI specs, resolved as an engine resolves them: the CDI library's
// cache over the configured spec directories (a later directory has the
// higher priority: a device in /var/run/cdi shadows the same device in
// /etc/cdi; two specs of one directory that define the same device
// conflict, and the library drops that device from both). Each spec is
// then checked against the host: every path it names (device nodes, mount
// host paths, hook programs) must exist, as the runtime will need it.

// DefaultPodmanStorage is rootful Podman's graph root, where its
// containers are listed.
const DefaultPodmanStorage = "/var/lib/containers/storage"

// specProblem is one thing wrong with a spec, by the path it names.
type specProblem struct {
	what    string   // "mount hostPath", "device node", "hook"
	path    string   // the host path
	why     string   // "does not exist", ...
	devices []string // the devices that name it; nil for spec-wide edits
}

// cdiSpec is one spec file the library loaded, with doctor's findings.
type cdiSpec struct {
	s        *cdi.Spec
	active   []string            // its devices an engine gets from it
	shadowed map[string][]string // higher-priority spec path -> its devices that spec has
	conflict map[string][]string // same-priority spec path -> devices both define
	missing  []specProblem
	other    []string // other problems (old driver, hooks without env)
}

func (c *cdiSpec) path() string { return c.s.GetPath() }
func (c *cdiSpec) broken() bool { return len(c.missing) > 0 || len(c.other) > 0 }

// checkCDISpecs resolves the spec directories with the CDI library and
// checks the specs of the configured kind's vendor: what they name exists,
// they were made for the running driver, their hooks carry an env. With
// no spec of the kind, it fails where Podman is in use (CDI is its only
// GPU path), and is skipped otherwise.
func checkCDISpecs(opts Options, running string) Check {
	cfg := opts.Config
	kind := cfg.CDI.Kind
	if kind == "" {
		kind = request.DefaultKind
	}
	vendor, _ := parser.ParseQualifier(kind)
	dirs := cfg.CDI.SpecDirs
	if len(dirs) == 0 {
		dirs = cdi.DefaultSpecDirs
	}
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))

	var bad, fixes []string
	// Files the library could not load, with their errors; conflicts are
	// reported with the specs below.
	loadErrs := map[string][]string{}
	for path, errs := range cache.GetErrors() {
		for _, err := range errs {
			if !strings.Contains(err.Error(), "conflicting device") {
				loadErrs[path] = append(loadErrs[path], err.Error())
			}
		}
	}
	for _, path := range sortedKeys(loadErrs) {
		bad = append(bad, fmt.Sprintf("%s cannot be loaded by the CDI library (engines skip it): %s", path, strings.Join(loadErrs[path], "; ")))
		fixes = append(fixes, generateCommand(cfg, path, kind))
	}

	var all []*cdiSpec
	byPath := map[string]*cdiSpec{}
	for _, s := range cache.GetVendorSpecs(vendor) {
		c := &cdiSpec{s: s, shadowed: map[string][]string{}, conflict: map[string][]string{}}
		all = append(all, c)
		byPath[s.GetPath()] = c
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].s.GetPriority() != all[j].s.GetPriority() {
			return all[i].s.GetPriority() > all[j].s.GetPriority()
		}
		return all[i].path() < all[j].path()
	})
	for _, c := range all {
		for _, d := range c.s.Devices {
			q := parser.QualifiedName(c.s.GetVendor(), c.s.GetClass(), d.Name)
			got := cache.GetDevice(q)
			switch {
			case got != nil && got.GetSpec() == c.s:
				c.active = append(c.active, q)
			case got != nil:
				w := got.GetSpec().GetPath()
				c.shadowed[w] = append(c.shadowed[w], q)
			default:
				// The library dropped it: another spec of the same
				// priority defines it too.
				for _, o := range all {
					if o != c && o.s.GetPriority() == c.s.GetPriority() && o.s.GetDevice(d.Name) != nil && o.s.Kind == c.s.Kind {
						c.conflict[o.path()] = append(c.conflict[o.path()], q)
					}
				}
			}
		}
		c.missing = missingPaths(c.s)
		if hooks := hooksWithoutEnv(c.s.Spec); len(hooks) > 0 {
			// CVE-2025-23266 class: a runtime runs a hook without env
			// with the container's environment, which the image
			// controls (LD_PRELOAD into a root process on the host).
			c.other = append(c.other, fmt.Sprintf("hooks without an explicit env, which a runtime runs with the image's environment (unsafe, CVE-2025-23266): %s", strings.Join(hooks, ", ")))
		}
		if c.s.Kind == kind {
			if v := specVersions(c.s.Spec); len(v) > 0 && !(len(v) == 1 && v[0] == running) {
				c.other = append(c.other, fmt.Sprintf("generated for driver %s but the running driver is %s", strings.Join(v, ", "), running))
			}
		}
	}

	var good, notes []string
	reported := map[string]bool{}
	for _, c := range all {
		// Conflicts: the library refuses the devices in both files.
		for _, other := range sortedKeys(c.conflict) {
			pair := c.path() + "\x00" + other
			if reported[other+"\x00"+c.path()] {
				continue
			}
			reported[pair] = true
			devs := c.conflict[other]
			bad = append(bad, fmt.Sprintf("%s and %s both define %s (same directory, same priority): the CDI library refuses %s in both (\"conflicting device\"), so --device %s fails with \"unresolvable CDI devices\"",
				c.path(), other, summarize(devs, 4), pluralIt(devs), devs[0]))
			fixes = append(fixes, conflictFix(c, byPath[other], cfg))
		}
		switch {
		case len(c.active) == 0 && len(c.shadowed) > 0:
			// Every device comes from higher-priority specs: this file
			// is read but not used.
			if c.broken() {
				notes = append(notes, fmt.Sprintf("%s is shadowed by %s and not used (it is broken: %s)", c.path(), strings.Join(sortedKeys(c.shadowed), ", "), c.summary()))
			} else {
				notes = append(notes, fmt.Sprintf("%s is shadowed by %s and not used", c.path(), strings.Join(sortedKeys(c.shadowed), ", ")))
			}
		case c.broken():
			where := ""
			if len(c.active) > 0 {
				where = fmt.Sprintf(" (it serves %s)", summarize(c.active, 3))
			}
			bad = append(bad, fmt.Sprintf("%s%s: %s", c.path(), where, c.summary()))
			if good := intactShadowed(c, all); good != "" {
				fixes = append(fixes, fix(fixCDIStale, "STALE", c.path(), "GOOD", good))
				bad[len(bad)-1] += fmt.Sprintf("; it shadows %s, which is intact", good)
			} else {
				fixes = append(fixes, generateCommand(cfg, c.path(), c.s.Kind))
			}
		case len(c.active) > 0:
			ev := c.path()
			if len(c.shadowed) > 0 {
				ev += fmt.Sprintf(" (some devices shadowed by %s)", strings.Join(sortedKeys(c.shadowed), ", "))
			}
			if len(specVersions(c.s.Spec)) == 0 && c.s.Kind == kind {
				ev += " (mounts no versioned driver library)"
			}
			good = append(good, ev)
		}
	}
	if len(bad) > 0 {
		ev := strings.Join(bad, "; ")
		if len(notes) > 0 {
			ev += " (note: " + strings.Join(notes, "; ") + ")"
		}
		f := joinFixes(fixes)
		return fail(CheckCDISpecs, f, "%s", ev)
	}
	if len(good) == 0 {
		out := filepath.Join(dirs[len(dirs)-1], "nvidia.yaml")
		if why := podmanInUse(opts); why != "" {
			return fail(CheckCDISpecs, fix(fixPodmanNoSpec, "gantry cdi generate --output FILE", generateCommand(cfg, out, kind)),
				"no %s CDI spec in %s, and Podman is in use here (%s): Podman takes GPUs only through CDI, so podman run --device %s=all fails with \"unresolvable CDI devices\"",
				kind, strings.Join(dirs, ", "), why, kind)
		}
		return skip(CheckCDISpecs, "no %s CDI spec in %s (needed only for --device %s=... and CDI-enabled engines)",
			kind, strings.Join(dirs, ", "), kind)
	}
	ev := fmt.Sprintf("driver %s: %s; every path they name exists", running, strings.Join(good, ", "))
	if len(notes) > 0 {
		ev += " (note: " + strings.Join(notes, "; ") + ")"
	}
	return pass(CheckCDISpecs, "%s", ev)
}

// summary says what is wrong with c.
func (c *cdiSpec) summary() string {
	var parts []string
	const max = 8
	for i, m := range c.missing {
		if i == max {
			parts = append(parts, fmt.Sprintf("and %d more paths", len(c.missing)-max))
			break
		}
		who := "spec-wide, for every device"
		if m.devices != nil {
			who = "device " + summarize(m.devices, 3)
		}
		parts = append(parts, fmt.Sprintf("%s %s %s (%s)", m.what, m.path, m.why, who))
	}
	return strings.Join(append(parts, c.other...), "; ")
}

// missingPaths checks every host path spec names: device nodes (their
// host path, else their path), mounts' host paths, hooks' programs.
func missingPaths(spec *cdi.Spec) []specProblem {
	var out []specProblem
	index := map[string]int{}
	add := func(what, path, why, device string) {
		k := what + "\x00" + path
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, specProblem{what: what, path: path, why: why})
		}
		if device != "" {
			out[i].devices = append(out[i].devices, device)
		}
	}
	check := func(e specs.ContainerEdits, device string) {
		for _, n := range e.DeviceNodes {
			if n == nil {
				continue
			}
			p := n.HostPath
			if p == "" {
				p = n.Path
			}
			st, err := os.Stat(p)
			switch {
			case err != nil:
				add("device node", p, whyMissing(p, err), device)
			case st.Mode()&fs.ModeDevice == 0 && st.Mode()&fs.ModeNamedPipe == 0:
				add("device node", p, "is not a device node", device)
			}
		}
		for _, m := range e.Mounts {
			if m == nil || m.HostPath == "" || !filepath.IsAbs(m.HostPath) {
				continue // a tmpfs or other source that is no host path
			}
			if _, err := os.Stat(m.HostPath); err != nil {
				add("mount hostPath", m.HostPath, whyMissing(m.HostPath, err), device)
			}
		}
		for _, h := range e.Hooks {
			if h == nil {
				continue
			}
			st, err := os.Stat(h.Path)
			switch {
			case err != nil:
				add("hook "+h.HookName+" program", h.Path, whyMissing(h.Path, err), device)
			case !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0:
				add("hook "+h.HookName+" program", h.Path, "is not an executable file", device)
			}
		}
	}
	check(spec.ContainerEdits, "")
	for _, d := range spec.Devices {
		check(d.ContainerEdits, parser.QualifiedName(spec.GetVendor(), spec.GetClass(), d.Name))
	}
	return out
}

func whyMissing(p string, err error) string {
	if lst, lerr := os.Lstat(p); lerr == nil && lst.Mode()&fs.ModeSymlink != 0 {
		t, _ := os.Readlink(p)
		return "is a dangling symbolic link (to " + t + ")"
	}
	if os.IsNotExist(err) {
		return "does not exist"
	}
	return err.Error()
}

// intactShadowed is a lower-priority spec, not broken, that defines every
// device of c an engine now gets from c: removing c brings it back.
func intactShadowed(c *cdiSpec, all []*cdiSpec) string {
	if len(c.active) == 0 {
		return ""
	}
	for _, o := range all {
		if o == c || o.broken() || o.s.GetPriority() >= c.s.GetPriority() {
			continue
		}
		has := true
		for _, q := range c.active {
			if len(o.shadowed[c.path()]) == 0 || !contains(o.shadowed[c.path()], q) {
				has = false
				break
			}
		}
		if has {
			return o.path()
		}
	}
	return ""
}

// conflictFix says which of two conflicting specs to remove: a broken one,
// else the older; and to regenerate the one kept if it is broken too.
func conflictFix(a, b *cdiSpec, cfg config.Config) string {
	keep, drop := a, b
	switch {
	case a.broken() && !b.broken():
		keep, drop = b, a
	case a.broken() == b.broken() && modTime(a.path()) < modTime(b.path()):
		keep, drop = b, a
	}
	f := fix(fixCDIConflict, "DROP", drop.path(), "KEEP", keep.path())
	if keep.broken() {
		f += ", then " + generateCommand(cfg, keep.path(), keep.s.Kind)
	}
	return f
}

func modTime(p string) int64 {
	if st, err := os.Stat(p); err == nil {
		return st.ModTime().UnixNano()
	}
	return 0
}

// generateCommand is the gantry cdi generate command line that writes
// out with this configuration: the driver root, dev root, GPU backend and
// kind doctor was run with (flags or configuration file) made explicit.
func generateCommand(cfg config.Config, out, kind string) string {
	args := []string{"gantry"}
	if isSim(cfg) {
		args = append(args, "--gpus", cfg.GPUs)
	}
	if cfg.DriverRoot != "" && cfg.DriverRoot != "/" {
		args = append(args, "--driver-root", cfg.DriverRoot)
	}
	if cfg.DevRoot != "" {
		args = append(args, "--dev-root", cfg.DevRoot)
	}
	args = append(args, "cdi", "generate")
	switch kind {
	case request.DefaultKind:
	case cdispec.IMEXKind:
		args = append(args, "--imex")
	default:
		args = append(args, "--kind", kind)
	}
	return strings.Join(append(args, "--output", out), " ")
}

// podmanInUse says why Podman counts as in use here (on PATH, or with
// containers in its storage), or "".
func podmanInUse(opts Options) string {
	if p, err := exec.LookPath("podman"); err == nil {
		return "podman is on PATH: " + p
	}
	root := opts.PodmanStorage
	if root == "" {
		root = DefaultPodmanStorage
	}
	files, _ := filepath.Glob(filepath.Join(root, "*-containers", "containers.json"))
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var list []json.RawMessage
		if json.Unmarshal(b, &list) == nil {
			n += len(list)
		}
	}
	if n > 0 {
		return fmt.Sprintf("%d Podman containers in %s", n, root)
	}
	return ""
}

func summarize(l []string, max int) string {
	if len(l) <= max {
		return strings.Join(l, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(l[:max], ", "), len(l)-max)
}

func pluralIt(l []string) string {
	if len(l) == 1 {
		return "that device"
	}
	return "those devices"
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// joinFixes is the fixes of several failures of one check, each once.
func joinFixes(fixes []string) string { return strings.Join(dedupe(fixes), "; ") }

func dedupe(l []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range l {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
