package lowlevel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Version is a low-level runtime's name and version, as its --version
// prints them ("runc", "1.1.5+ds1").
type Version struct {
	Name, Version string
}

func (v Version) String() string { return v.Name + " " + v.Version }

// maxOutput bounds what Probe reads of --version.
const maxOutput = 64 << 10

// Probe runs path --version (at most 5 s, with PATH alone in its
// environment) and parses what it prints.
func Probe(ctx context.Context, path string) (Version, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	var out limitedBuffer
	cmd.Stdout = &out
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		return Version{}, fmt.Errorf("%s --version: %w", path, err)
	}
	v, err := Parse(out.String())
	if err != nil {
		return Version{}, fmt.Errorf("%s --version: %w", path, err)
	}
	return v, nil
}

type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := maxOutput - b.Len(); room < len(p) {
		b.Buffer.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// Parse reads the first line of a runtime's --version: "NAME version X".
func Parse(out string) (Version, error) {
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	f := strings.Fields(line)
	if len(f) < 3 || f[1] != "version" {
		return Version{}, fmt.Errorf("not a runtime's version line: %q", line)
	}
	return Version{Name: f[0], Version: f[2]}, nil
}

// semver is a version's numbers and its release candidate number (rc.N),
// math.MaxInt32 for a release.
type semver struct{ major, minor, patch, rc int }

const release = 1 << 30

// parseSemver reads "1.2.3", "1.4.0-rc.3", "1.1.5+ds1", "1.28"
// (crun's), ignoring what follows a "+" or a "~".
func parseSemver(s string) (semver, error) {
	s, _, _ = strings.Cut(s, "+")
	s, _, _ = strings.Cut(s, "~")
	core, pre, hasPre := strings.Cut(s, "-")
	v := semver{rc: release}
	parts := strings.Split(core, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return v, fmt.Errorf("version %q: want MAJOR.MINOR[.PATCH]", s)
	}
	nums := []*int{&v.major, &v.minor, &v.patch}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return v, fmt.Errorf("version %q: %q is not a number", s, p)
		}
		*nums[i] = n
	}
	if hasPre {
		n, err := strconv.Atoi(strings.TrimPrefix(pre, "rc."))
		if !strings.HasPrefix(pre, "rc.") || err != nil {
			return v, fmt.Errorf("version %q: pre-release %q is not rc.N", s, pre)
		}
		v.rc = n
	}
	return v, nil
}

func (a semver) less(b semver) bool {
	for _, d := range [][2]int{{a.major, b.major}, {a.minor, b.minor}, {a.patch, b.patch}, {a.rc, b.rc}} {
		if d[0] != d[1] {
			return d[0] < d[1]
		}
	}
	return false
}

// v is a version literal of this file.
func v(s string) semver {
	x, err := parseSemver(s)
	if err != nil {
		panic(err)
	}
	return x
}

// in reports whether from <= x < to.
func in(x semver, from, to string) bool { return !x.less(v(from)) && x.less(v(to)) }

// Advisory is a published advisory about a runtime's versions.
type Advisory struct {
	// IDs are its CVE numbers.
	IDs string
	// What the bug lets an image do.
	What string
	// Fixed names the first fixed release of each line.
	Fixed    string
	runtime  string
	affected func(semver) bool
}

// advisories are those that matter to a node running GPU containers,
// each found in the runtime's release notes (runc's CHANGELOG.md, crun's
// NEWS).
var advisories = []Advisory{
	{
		IDs:     "CVE-2025-31133, CVE-2025-52565, CVE-2025-52881",
		What:    "an image that races the create (masked paths, /dev/console, redirected /proc writes) escapes the container",
		Fixed:   "1.2.8, 1.3.3, 1.4.0-rc.3",
		runtime: "runc",
		affected: func(x semver) bool {
			return x.less(v("1.2.8")) || in(x, "1.3.0-rc.0", "1.3.3") || in(x, "1.4.0-rc.0", "1.4.0-rc.3")
		},
	},
	{
		IDs:     "CVE-2026-41579",
		What:    "an image whose /dev is a link writes on the host through it during the create (device nodes made in the host directory the link names)",
		Fixed:   "1.3.6, 1.4.3, 1.5.0",
		runtime: "runc",
		affected: func(x semver) bool {
			return x.less(v("1.3.6")) || in(x, "1.4.0-rc.0", "1.4.3") || in(x, "1.5.0-rc.0", "1.5.0-rc.3")
		},
	},
	{
		IDs:      "CVE-2026-47766",
		What:     "crun follows an image's /dev links when it makes the container's device nodes: they are made outside the root filesystem (on the host)",
		Fixed:    "1.28",
		runtime:  "crun",
		affected: func(x semver) bool { return x.less(v("1.28")) },
	},
}

// ErrUnknown: the version cannot be read as the runtime's numbers (a
// runtime Gantry has no advisories for is not an error).
var ErrUnknown = errors.New("version not understood")

// Advisories are the advisories that affect ver, none for a runtime this
// package has none for.
func Advisories(ver Version) ([]Advisory, error) {
	var out []Advisory
	for _, a := range advisories {
		if a.runtime != ver.Name {
			continue
		}
		x, err := parseSemver(ver.Version)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUnknown, err)
		}
		if a.affected(x) {
			out = append(out, a)
		}
	}
	return out, nil
}

// Warning is one line saying what affects ver and what to upgrade to, ""
// when nothing does. A distribution may have backported a fix without
// changing the version: the line says so.
func Warning(path string, ver Version, advs []Advisory) string {
	if len(advs) == 0 {
		return ""
	}
	var parts []string
	for _, a := range advs {
		parts = append(parts, fmt.Sprintf("%s (%s; fixed in %s %s)", a.IDs, a.What, ver.Name, a.Fixed))
	}
	return fmt.Sprintf("the low-level runtime %s is %s, affected by %s: upgrade it (unless your distribution backported the fixes)",
		path, ver, strings.Join(parts, "; "))
}
