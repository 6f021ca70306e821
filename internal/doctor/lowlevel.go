package doctor

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gantry-gpu/gantry/internal/lowlevel"
)

// CheckLowLevel reports the low-level runtimes' versions and the published
// container escapes that affect them (package lowlevel). Its own file, and
// added to Checks here, last: other checks are edited in parallel.
const CheckLowLevel = "low-level runtime"

func init() {
	Checks = append(Checks, CheckDef{
		Name:    CheckLowLevel,
		Summary: "runc and crun (and runtime.low-level) are releases without a known container escape",
		run:     (*env).lowLevel,
		Needs:   []Need{NeedDriver},
		Verifies: "The low-level runtimes that run GPU containers here, `runtime.low-level` of Gantry's configuration and `runc` and `crun` on `PATH`, each asked its `--version`, are releases without a published container escape that an image can trigger: " +
			"runc before 1.2.8, 1.3.0 to 1.3.2 and 1.4.0-rc.1/rc.2 (CVE-2025-31133, CVE-2025-52565, CVE-2025-52881: masked paths, `/dev/console`, redirected `/proc` writes); " +
			"runc before 1.3.6, 1.4.0 to 1.4.2 and 1.5.0-rc.1/rc.2 (CVE-2026-41579: an image whose `/dev` is a link has runc write through it on the host; in Gantry's tests runc 1.1.5 made a GPU device node, mode 0666, in the host directory the link named); " +
			"crun before 1.28 (CVE-2026-47766: crun follows the image's `/dev` links when it makes device nodes; crun 1.8.1 made all twelve). " +
			"An affected runtime is INFO, not a failure (it is not Gantry's, and a distribution may have backported the fix without changing the version): upgrade it (Debian 12 ships runc 1.1.5 and crun 1.8.1; `scripts/build-runc.sh` builds a current runc). A runtime whose version cannot be read is INFO too; none found is SKIP. `gantry-runtime` notes the same in the log record of the first GPU create per runtime binary, and its create server warns at start.",
	})
}

// lowLevelPaths are the runtimes to ask: the configured one, then runc
// and crun on PATH, each once.
func (e *env) lowLevelPaths() []string {
	var out []string
	add := func(name string) {
		p := name
		if !filepath.IsAbs(p) {
			var err error
			if p, err = exec.LookPath(name); err != nil {
				return
			}
		}
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	if l := e.opts.Config.Runtime.LowLevel; l != "" {
		add(l)
	}
	add("runc")
	add("crun")
	return out
}

func (e *env) lowLevel() []Check {
	paths := e.lowLevelPaths()
	if len(paths) == 0 {
		return []Check{skip(CheckLowLevel, "no runc or crun on PATH, and runtime.low-level (%q) not found", e.opts.Config.Runtime.LowLevel)}
	}
	var fine, affected []string
	for _, p := range paths {
		ver, err := lowlevel.Probe(context.Background(), p)
		if err != nil {
			affected = append(affected, fmt.Sprintf("%s: version unknown (%v)", p, err))
			continue
		}
		advs, err := lowlevel.Advisories(ver)
		switch {
		case err != nil:
			affected = append(affected, fmt.Sprintf("%s (%v): %v", p, ver, err))
		case len(advs) > 0:
			affected = append(affected, lowlevel.Warning(p, ver, advs))
		default:
			fine = append(fine, fmt.Sprintf("%s (%v)", p, ver))
		}
	}
	if len(affected) > 0 {
		msg := strings.Join(affected, "; ")
		if len(fine) > 0 {
			msg += "; without a known escape: " + strings.Join(fine, ", ")
		}
		return []Check{info(CheckLowLevel, "%s", msg)}
	}
	return []Check{pass(CheckLowLevel, "no known container escape affects %s", strings.Join(fine, ", "))}
}
