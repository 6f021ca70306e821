package containerhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/ocibundle"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// ErrNoState is returned by ReadState when stdin holds no container state.
var ErrNoState = errors.New("no container state on stdin (this command is an OCI hook: the container runtime runs it with the state on stdin)")

// ErrBadLink is returned by ParseLink for a malformed --link.
var ErrBadLink = errors.New("invalid --link")

// ReadState reads the OCI container state the runtime writes to a hook's
// stdin, then the bundle's config.json, and returns the bundle directory and
// the host path of the container's root filesystem (root.path, relative to
// the bundle unless absolute).
func ReadState(r io.Reader) (bundle, rootPath string, err error) {
	st, _, rootPath, err := ReadStateSpec(r)
	if err != nil {
		return "", "", err
	}
	return st.Bundle, rootPath, nil
}

// ReadStateSpec is ReadState that also returns the state and the bundle's
// config.json, for a caller that needs them (the prestart hook): the spec
// is read once.
func ReadStateSpec(r io.Reader) (st specs.State, spec *specs.Spec, rootPath string, err error) {
	b, err := ocibundle.ReadAtMost(r, ocibundle.MaxStateSize, "the container state on stdin")
	if err != nil {
		return st, nil, "", err
	}
	if st, err = ParseState(b); err != nil {
		return st, nil, "", err
	}
	cb, err := ocibundle.ReadSpec(st.Bundle)
	if err != nil {
		return st, nil, "", err
	}
	spec = &specs.Spec{}
	if err := json.Unmarshal(cb, spec); err != nil {
		return st, nil, "", fmt.Errorf("parsing the bundle's %s: %w", ocibundle.SpecPath(st.Bundle), err)
	}
	var root string
	if spec.Root != nil {
		root = spec.Root.Path
	}
	rootPath, err = RootPath(st.Bundle, root)
	return st, spec, rootPath, err
}

// ParseState parses the OCI state a runtime wrote to a hook's stdin (raw,
// all of it) and checks that it names a bundle by an absolute path.
func ParseState(raw []byte) (st specs.State, err error) {
	if len(strings.TrimSpace(string(raw))) == 0 {
		return st, ErrNoState
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("parsing the container state on stdin: %w (want the OCI state JSON the runtime gives hooks)", err)
	}
	if st.Bundle == "" {
		return st, fmt.Errorf("the container state on stdin (id %q) has no bundle: %w", st.ID, ErrNoState)
	}
	if !filepath.IsAbs(st.Bundle) {
		return st, fmt.Errorf("the container state on stdin has a relative bundle path %q; runtimes give an absolute one", st.Bundle)
	}
	return st, nil
}

// RootPath is the host path of the container's root filesystem: root
// (the bundle's root.path) taken relative to the bundle unless absolute.
func RootPath(bundle, root string) (string, error) {
	if root == "" {
		return "", fmt.Errorf("the bundle's %s has no root.path: cannot find the container's root filesystem", ocibundle.SpecPath(bundle))
	}
	if !filepath.IsAbs(root) {
		root = filepath.Join(bundle, root)
	}
	return filepath.Clean(root), nil
}

// OpenRoot reads the state from r (see ReadState) and opens the container's
// root filesystem.
func OpenRoot(r io.Reader) (*rootfs.Root, error) {
	_, rootPath, err := ReadState(r)
	if err != nil {
		return nil, err
	}
	return rootfs.Open(rootPath)
}

// Link is one symlink to create inside the container: Link, an absolute
// container path, will point to Target (stored as given; usually a bare file
// name in the same directory).
type Link struct{ Target, Link string }

// String gives the --link form.
func (l Link) String() string { return l.Target + "::" + l.Link }

// ParseLink parses the TARGET::LINK form of --link.
func ParseLink(s string) (Link, error) {
	t, l, ok := strings.Cut(s, "::")
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return Link{}, fmt.Errorf("%w %q: contains a NUL byte", ErrBadLink, s)
	case !ok || t == "" || l == "":
		return Link{}, fmt.Errorf("%w %q: want TARGET::LINK, e.g. libcuda.so.580.159.04::/usr/lib/x86_64-linux-gnu/libcuda.so.1", ErrBadLink, s)
	case !path.IsAbs(l):
		return Link{}, fmt.Errorf("%w %q: the link %q must be an absolute container path", ErrBadLink, s, l)
	case path.Clean(l) == "/":
		return Link{}, fmt.Errorf("%w %q: the link cannot be the root directory", ErrBadLink, s)
	}
	return Link{Target: t, Link: path.Clean(l)}, nil
}

// CreateSymlinks creates each link inside root, making its parent
// directories as needed. A file or symlink already at a link's path is
// replaced (like ln -sf); one already pointing to the target is left alone.
func CreateSymlinks(root *rootfs.Root, links []Link) error {
	// Grouped by directory, in first-seen order: each directory is
	// resolved (and made) once.
	type group struct{ targets, names []string }
	var dirs []string
	groups := map[string]*group{}
	done := map[Link]bool{}
	for _, l := range links {
		if done[l] {
			continue
		}
		done[l] = true
		if !path.IsAbs(l.Link) || path.Clean(l.Link) == "/" {
			return fmt.Errorf("link %q: want an absolute container path below /", l.Link)
		}
		dir, name := path.Split(path.Clean(l.Link))
		g := groups[dir]
		if g == nil {
			g = &group{}
			groups[dir] = g
			dirs = append(dirs, dir)
		}
		g.targets = append(g.targets, l.Target)
		g.names = append(g.names, name)
	}
	for _, dir := range dirs {
		g := groups[dir]
		if err := root.ReplaceSymlinksIn(dir, g.targets, g.names); err != nil {
			return fmt.Errorf("linking %s in %s: %w", strings.Join(g.names, ", "), dir, err)
		}
	}
	return nil
}
