package driver

import (
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Stamp names what an inventory depends on that can change while the
// driver's version and the host's ld.so.cache stay the same: the control
// device nodes (nvidia-uvm appears when the UVM module is loaded, often
// after the first GPU container), the daemons' sockets (nvidia-persistenced
// or fabric manager started later) and the program directories (a package
// adding nvidia-smi or nvidia-cuda-mps-control runs no ldconfig). A cache of
// an inventory is valid only while the stamp is unchanged. It costs one
// stat per path (about 15), no reads.
func Stamp(root, devRoot string) string {
	if root == "" {
		root = "/"
	}
	if devRoot == "" {
		devRoot = "/"
	}
	var b strings.Builder
	var st unix.Stat_t
	for _, d := range controlDevices {
		if unix.Stat(filepath.Join(devRoot, d.Rel), &st) == nil {
			fmt.Fprintf(&b, "%x;", st.Rdev)
		} else {
			b.WriteString("-;")
		}
	}
	for _, e := range ipcEndpoints {
		if unix.Stat(filepath.Join(root, e.Rel), &st) == nil {
			fmt.Fprintf(&b, "%d.%d;", st.Ino, st.Ctim.Nano())
		} else {
			b.WriteString("-;")
		}
	}
	for _, d := range binaryDirs {
		if unix.Stat(filepath.Join(root, d), &st) == nil {
			fmt.Fprintf(&b, "%d.%d;", st.Ino, st.Mtim.Nano())
		} else {
			b.WriteString("-;")
		}
	}
	return b.String()
}
