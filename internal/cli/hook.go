package cli

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/gantry-gpu/gantry/internal/containerhook"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// repeated collects a flag given several times (--link a --link b).
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(s string) error { *r = append(*r, s); return nil }

// stdin is where hooks read the container state; tests replace it.
var stdin = func() *os.File { return os.Stdin }

func init() {
	register(&command{
		name:    "hook create-symlinks",
		summary: "OCI hook (CDI specs run it): create symlinks inside the container",
		usage:   "--link TARGET::LINK [--link ...]",
		help: `Run by the container runtime as a createContainer hook, with the container
state on stdin. Creates each --link TARGET::LINK inside the container's root
filesystem, replacing a file already there (like ln -sf), e.g. the SONAME link
  --link libcuda.so.580.159.04::/usr/lib/x86_64-linux-gnu/libcuda.so.1
LINK is a container path; it and its directories are resolved inside the
container's root, so symlinks in the image never lead out of it. An error
fails the container: it must not start half configured.`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			var links repeated
			fs.Var(&links, "link", "TARGET::LINK: make the container path LINK a symlink to TARGET (repeatable)")
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				var parsed []containerhook.Link
				for _, s := range links {
					l, err := containerhook.ParseLink(s)
					if err != nil {
						return usagef("%v", err)
					}
					parsed = append(parsed, l)
				}
				root, err := openHookRoot()
				if err != nil {
					return err
				}
				defer root.Close()
				return containerhook.CreateSymlinks(root, parsed)
			}
		},
	})
	register(&command{
		name:    "hook update-ldcache",
		summary: "OCI hook (CDI specs run it): add injected library folders to the container's ld.so.cache",
		usage:   "--folder DIR [--folder ...] [--host-driver-version VERSION]",
		help: `Run by the container runtime as a createContainer hook, with the container
state on stdin. Adds the shared libraries in each --folder (a container path) to
the container's /etc/ld.so.cache, ahead of the image's own entries of the same
name, and lists the folders in /etc/ld.so.conf.d/000-gantry.conf so that a later
ldconfig in the container keeps them. No program from the image is run (nor
ldconfig): Gantry reads and writes the cache itself, resolving every path inside
the container's root. An unreadable cache in the image is replaced, with a
warning; other errors fail the container.

With --host-driver-version (gantry cdi generate adds it), CUDA forward
compatibility is applied: when the image's /usr/local/cuda/compat holds one
libcuda.so.X.Y.Z whose major version X is greater than the host driver's, its
libraries are put ahead of the host driver's, as NVIDIA's enable-cuda-compat hook
arranges.`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			var folders repeated
			fs.Var(&folders, "folder", "container directory holding injected libraries (repeatable)")
			hostDriver := fs.String("host-driver-version", "", "the host's driver version, e.g. 580.159.04: enables CUDA forward compatibility")
			return func(e *env, args []string) error {
				if len(args) > 0 {
					return usagef("unexpected argument %q", args[0])
				}
				if len(folders) == 0 {
					return usagef("need at least one --folder")
				}
				for _, f := range folders {
					if !strings.HasPrefix(f, "/") {
						return usagef("--folder %q: want an absolute container path", f)
					}
				}
				root, err := openHookRoot()
				if err != nil {
					return err
				}
				defer root.Close()
				warn := func(w string) { fmt.Fprintf(e.stderr, "gantry hook update-ldcache: warning: %s\n", w) }
				return containerhook.UpdateLDCacheCompat(root, folders, *hostDriver, warn)
			}
		},
	})
}

// openHookRoot reads the container state from stdin and opens the
// container's root filesystem.
func openHookRoot() (*rootfs.Root, error) {
	in := stdin()
	if in != os.Stdin {
		defer in.Close()
	}
	return containerhook.OpenRoot(in)
}
