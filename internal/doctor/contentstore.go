package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/internal/engineconfig"
)

// DefaultContainerdRoot is containerd's root directory when neither its
// --root flag nor its config's `root` says otherwise.
const DefaultContainerdRoot = "/var/lib/containerd"

// contentStoreDir is containerd's content store under its root; its blobs
// are in blobs/sha256 there, each named by its digest.
const contentStoreDir = "io.containerd.content.v1.content"

// containerdRoot is containerd's root and how doctor knows it:
// --containerd-root, else the running containerd's (from its CRI status),
// else the root its config.toml (or an import) sets, else the default.
func (e *env) containerdRoot() (root, source string) {
	o := e.opts
	if o.ContainerdRoot != "" {
		return o.ContainerdRoot, "--containerd-root"
	}
	if _, socket, err := e.containerdLive(); err == nil && e.liveDirs.Root != "" {
		return e.liveDirs.Root, "the running containerd's, from its CRI status at " + socket
	}
	if reg, files, err := engineconfig.ReadContainerd(o.ContainerdConfig); err == nil && reg.Root != "" {
		return reg.Root, "root in " + strings.Join(files, ", ")
	}
	return DefaultContainerdRoot, "containerd's default"
}

// checkContentStore says whether users other than root can read the blobs
// of containerd's content store, where a task's checkpoint (ctr tasks
// checkpoint, ctr containers checkpoint, the kubelet's) keeps its CRIU
// image: the container's memory. containerd writes each blob 0444 (0666
// less write and execute, under the usual 022 umask) in directories it
// makes 0755, so the directories above decide: its root, 0711 in the
// containerd releases before the fix of CVE-2024-25621, 0700 since (they
// chmod it at every start). The blobs are read by containerd alone (its
// clients go through its socket), so a root of 0700 costs nothing.
func checkContentStore(root, source string) Check {
	blobs := filepath.Join(root, contentStoreDir, "blobs", "sha256")
	// The deepest of the blob directory and those above it that exists;
	// what is missing below it, containerd makes 0755 when it first
	// stores content.
	// Not root, doctor may be denied what others are: judged by the
	// directories' modes below, as far as it sees.
	have, denied := blobs, error(nil)
	for {
		_, err := os.Lstat(have)
		if err == nil {
			break
		}
		if errors.Is(err, fs.ErrPermission) && denied == nil {
			denied = err
		} else if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, fs.ErrPermission) {
			return skip(CheckContentStore, "containerd's root %s (%s): %v", root, source, err)
		}
		if have == filepath.Clean(root) {
			return skip(CheckContentStore, "no containerd root %s (%s): containerd is not installed here, or has never run", root, source)
		}
		have = filepath.Dir(have)
	}
	real, err := filepath.EvalSymlinks(have)
	if err != nil {
		return skip(CheckContentStore, "containerd's root %s (%s): %v", root, source, err)
	}
	// Others reach the blobs only if every directory from / down lets
	// them search it (x).
	dir := "/"
	for _, part := range strings.Split(strings.TrimPrefix(real, "/"), "/") {
		st, err := os.Stat(dir)
		if err != nil {
			return skip(CheckContentStore, "containerd's root %s (%s): %v", root, source, err)
		}
		if st.Mode().Perm()&0o001 == 0 {
			return pass(CheckContentStore, "others cannot reach containerd's content store under %s (%s): %s is mode %04o",
				root, source, dir, st.Mode().Perm())
		}
		dir = filepath.Join(dir, part)
	}
	st, err := os.Stat(real)
	if err != nil {
		return skip(CheckContentStore, "containerd's root %s (%s): %v", root, source, err)
	}
	if st.Mode().Perm()&0o001 == 0 {
		return pass(CheckContentStore, "others cannot reach containerd's content store under %s (%s): %s is mode %04o",
			root, source, real, st.Mode().Perm())
	}
	if denied != nil {
		return skip(CheckContentStore, "containerd's content store under %s (%s) not checked: %v (run doctor as root)", root, source, denied)
	}
	rootMode := "?"
	if st, err := os.Stat(root); err == nil {
		rootMode = fmt.Sprintf("%04o", st.Mode().Perm())
	}
	var how string
	switch {
	case have != blobs:
		how = fmt.Sprintf("%s does not exist yet: containerd makes it 0755 when it first stores content, and others will read every blob in it", blobs)
	case st.Mode().Perm()&0o004 != 0:
		how = fmt.Sprintf("others can list %s (mode %04o) and read every blob in it (containerd writes them 0444)", blobs, st.Mode().Perm())
	default:
		how = fmt.Sprintf("others cannot list %s (mode %04o) but can read any blob whose digest they learn (containerd writes them 0444)", blobs, st.Mode().Perm())
	}
	return warn(CheckContentStore, fix(fixContentStore, "ROOT", root),
		"containerd's root %s (%s) is mode %s and every directory down to its blobs lets others through: %s; a checkpoint of a GPU task kept there (ctr tasks checkpoint, ctr containers checkpoint, the kubelet's) holds the container's memory",
		root, source, rootMode, how)
}
