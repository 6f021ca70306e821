package cli

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/gantry-gpu/gantry/internal/containerhook"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// repeated collects a flag given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(s string) error { *r = append(*r, s); return nil }

// stdin is where hooks read the container state; tests replace it.
var stdin = func() *os.File { return os.Stdin }

func init() {
	register(&command{
		name:    "hook create-symlinks",
		summary: "OCI hook (CDI specs run it): create symlinks inside the container",
		help: `Run by the container runtime as a createContainer hook, with the container
state on stdin. Creates each --link TARGET::LINK inside the container's root
filesystem (resolved inside it: symlinks in the image never lead out), e.g. the
SONAME link libcuda.so.1 -> libcuda.so.580.159.04.`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			var links repeated
			fs.Var(&links, "link", "TARGET::LINK (repeatable)")
			return func(e *env, args []string) error {
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
		help: `Run by the container runtime as a createContainer hook, with the container
state on stdin. Adds the shared libraries in each --folder (a container path) to the
container's /etc/ld.so.cache, ahead of the image's own entries, and lists the folders
in /etc/ld.so.conf.d/000-gantry.conf. No program from the image is run: the cache is
read and written by Gantry itself.`,
		flags: func(fs *flag.FlagSet) func(*env, []string) error {
			var folders repeated
			fs.Var(&folders, "folder", "container directory holding injected libraries (repeatable)")
			return func(e *env, args []string) error {
				if len(folders) == 0 {
					return usagef("need at least one --folder")
				}
				root, err := openHookRoot()
				if err != nil {
					return err
				}
				defer root.Close()
				return containerhook.UpdateLDCache(root, folders, func(w string) { fmt.Fprintf(e.stderr, "warning: %s\n", w) })
			}
		},
	})
}

func openHookRoot() (*rootfs.Root, error) {
	p, err := containerhook.RootPath(stdin())
	if err != nil {
		return nil, err
	}
	return rootfs.Open(p)
}
