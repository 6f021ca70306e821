package edits

import (
	"reflect"
	"slices"
	"testing"
)

func treeEdits() *Edits {
	e := &Edits{
		Mounts: []Mount{
			{HostPath: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.1", ContainerPath: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.1", Options: ReadOnlyOptions},
			{HostPath: "/usr/lib/i386-linux-gnu/libcuda.so.580.1", ContainerPath: "/usr/lib/i386-linux-gnu/libcuda.so.580.1", Options: ReadOnlyOptions},
			{HostPath: "/usr/bin/nvidia-smi", ContainerPath: "/usr/bin/nvidia-smi", Options: ReadOnlyOptions},
			{HostPath: "/lib/firmware/nvidia/580.1/gsp_ga10x.bin", ContainerPath: "/lib/firmware/nvidia/580.1/gsp_ga10x.bin", Options: ReadOnlyOptions},
			{HostPath: "/run/nvidia-persistenced/socket", ContainerPath: "/run/nvidia-persistenced/socket", Options: SocketOptions},
		},
		Symlinks: []Symlink{
			{Target: "libcuda.so.580.1", Link: "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
			{Target: "libcuda.so.580.1", Link: "/usr/lib/i386-linux-gnu/libcuda.so.1"},
			// A development link the tree does not hold.
			{Target: "libcuda.so.1", Link: "/usr/lib/x86_64-linux-gnu/libcuda.so"},
			// The same, which the tree holds too (32-bit).
			{Target: "libcuda.so.1", Link: "/usr/lib/i386-linux-gnu/libcuda.so"},
			// A loader's module link from a folder of its own.
			{Target: "../libcuda.so.1", Link: "/usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so"},
		},
		LibraryDirs: []string{"/usr/lib/i386-linux-gnu", "/usr/lib/x86_64-linux-gnu"},
	}
	e.normalize()
	return e
}

var testTree = Tree{HostPath: "/var/lib/trees/580.1", ContainerPath: DefaultTreePath, FilesDir: "files", Files: map[string]string{
	"/usr/lib/x86_64-linux-gnu/libcuda.so.580.1": "lib64/libcuda.so.580.1",
	"/usr/lib/i386-linux-gnu/libcuda.so.580.1":   "lib/libcuda.so.580.1",
	"/usr/bin/nvidia-smi":                        "bin/nvidia-smi",
	// The tree holding a socket's path must not move it: it is no read-only file.
	"/run/nvidia-persistenced/socket": "bin/socket",
}, Links: map[string]bool{"lib64/libcuda.so.1": true, "lib/libcuda.so.1": true, "lib/libcuda.so": true}}

func TestUseTree(t *testing.T) {
	e := treeEdits()
	provided, ok := e.UseTree(testTree)
	if !ok {
		t.Fatal("UseTree refused an ordinary layout")
	}
	// The program is seen at its per-file path (a link); the libraries,
	// directly in folders the loader cache names, only in the tree.
	wantProvided := []Provided{
		{Path: "/usr/bin/nvidia-smi", HostPath: "/usr/bin/nvidia-smi"},
		{Path: "/usr/local/nvidia/lib/libcuda.so.580.1", HostPath: "/usr/lib/i386-linux-gnu/libcuda.so.580.1"},
		{Path: "/usr/local/nvidia/lib64/libcuda.so.580.1", HostPath: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.1"},
	}
	if !reflect.DeepEqual(provided, wantProvided) {
		t.Fatalf("provided %v, want %v", provided, wantProvided)
	}
	var dests []string
	for _, m := range e.Mounts {
		dests = append(dests, m.ContainerPath)
	}
	// Firmware (not in the tree) and the socket (not read-only) stay; the
	// three files become one mount.
	want := []string{"/lib/firmware/nvidia/580.1/gsp_ga10x.bin", "/run/nvidia-persistenced/socket", "/usr/local/nvidia"}
	if !reflect.DeepEqual(dests, want) {
		t.Fatalf("mounts %v, want %v", dests, want)
	}
	tree := e.Mounts[2]
	if tree.HostPath != testTree.HostPath || !slices.Contains(tree.Options, "ro") {
		t.Fatalf("tree mount %+v: want %s read-only", tree, testTree.HostPath)
	}
	// No link per library: the tree holds the SONAME links; the
	// development link it lacks points into the tree, to the 64-bit one.
	wantLinks := []Symlink{
		{Target: "/usr/local/nvidia/bin/nvidia-smi", Link: "/usr/bin/nvidia-smi"},
		{Target: "/usr/local/nvidia/lib/libcuda.so", Link: "/usr/lib/i386-linux-gnu/libcuda.so"},
		{Target: "/usr/local/nvidia/lib64/libcuda.so.1", Link: "/usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so"},
		{Target: "/usr/local/nvidia/lib64/libcuda.so.1", Link: "/usr/lib/x86_64-linux-gnu/libcuda.so"},
	}
	if !reflect.DeepEqual(e.Symlinks, wantLinks) {
		t.Fatalf("links\n%v\nwant\n%v", e.Symlinks, wantLinks)
	}
	// LibraryDirs is unchanged (inject's ld.so.cache names the tree's
	// folders for the libraries only there).
	if !reflect.DeepEqual(e.LibraryDirs, []string{"/usr/lib/i386-linux-gnu", "/usr/lib/x86_64-linux-gnu"}) {
		t.Fatalf("library dirs %v", e.LibraryDirs)
	}
}

// A driver installed where the tree goes (GKE's /usr/local/nvidia): files
// already at their place in the tree need no link, nor their SONAME links.
func TestUseTreeDriverAtTreePath(t *testing.T) {
	e := &Edits{
		Mounts: []Mount{
			{HostPath: "/home/kubernetes/nvidia/lib64/libcuda.so.580.1", ContainerPath: "/usr/local/nvidia/lib64/libcuda.so.580.1", Options: ReadOnlyOptions},
			{HostPath: "/home/kubernetes/nvidia/bin/nvidia-smi", ContainerPath: "/usr/local/nvidia/bin/nvidia-smi", Options: ReadOnlyOptions},
		},
		Symlinks: []Symlink{
			{Target: "libcuda.so.580.1", Link: "/usr/local/nvidia/lib64/libcuda.so.1"},
			// A link to a link, as the per-file layout makes for libcuda.so.
			{Target: "libcuda.so.1", Link: "/usr/local/nvidia/lib64/libcuda.so"},
		},
		LibraryDirs: []string{"/usr/local/nvidia/lib64"},
	}
	tr := Tree{HostPath: "/t", ContainerPath: "/usr/local/nvidia/", Files: map[string]string{
		"/home/kubernetes/nvidia/lib64/libcuda.so.580.1": "lib64/libcuda.so.580.1",
		"/home/kubernetes/nvidia/bin/nvidia-smi":         "bin/nvidia-smi",
	}, Links: map[string]bool{"lib64/libcuda.so.1": true, "lib64/libcuda.so": true}}
	provided, ok := e.UseTree(tr)
	if !ok {
		t.Fatal("UseTree refused a driver at the tree's path")
	}
	if len(provided) != 2 {
		t.Fatalf("provided %v: want both files (their ld.so.cache entries are still due)", provided)
	}
	if len(e.Symlinks) != 0 || len(e.Mounts) != 1 || e.Mounts[0].ContainerPath != "/usr/local/nvidia" {
		t.Fatalf("got mounts %+v links %+v: want the tree's mount alone", e.Mounts, e.Symlinks)
	}
}

// What the tree's mount would hide, or would need a mount point in, keeps
// the per-file layout, untouched.
func TestUseTreeRefusesConflicts(t *testing.T) {
	cases := map[string]func(e *Edits){
		"mount below the tree path": func(e *Edits) {
			e.Mounts = append(e.Mounts, Mount{HostPath: "/x", ContainerPath: "/usr/local/nvidia/x", Options: ReadOnlyOptions})
		},
		"moved file below the tree path elsewhere": func(e *Edits) {
			e.Mounts[2].ContainerPath = "/usr/local/nvidia/lib64/other"
		},
		"link below the tree path the tree lacks": func(e *Edits) {
			e.Symlinks = append(e.Symlinks, Symlink{Target: "libfoo.so.1", Link: "/usr/local/nvidia/lib64/libfoo.so"})
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			e := treeEdits()
			change(e)
			before := e.Clone()
			if _, ok := e.UseTree(testTree); ok {
				t.Fatal("UseTree accepted a layout the mount would break")
			}
			if !reflect.DeepEqual(e, before) {
				t.Fatalf("edits changed on refusal:\n%+v\nwas\n%+v", e, before)
			}
		})
	}
	e := treeEdits()
	if _, ok := e.UseTree(Tree{HostPath: "/t", ContainerPath: "/usr/local/nvidia", Files: map[string]string{"/usr/bin/nvidia-smi": "../escape"}}); ok {
		t.Fatal("UseTree took a path outside the tree")
	}
}

// Firmware and configuration files the tree holds (drivervol.FilesDir)
// become links at their usual paths into the tree's mount, like programs:
// one mount fewer each. A file of FilesDir in a folder the ld.so.cache
// names is no library: it gets its link too (the old rule would have left
// it only in the tree). What the tree does not hold (a directory of
// application profiles) and the IPC socket (not read-only, even when
// the map names it) keep their mounts.
func TestUseTreeFiles(t *testing.T) {
	const fw = "/lib/firmware/nvidia/580.1/gsp_ga10x.bin"
	e := &Edits{
		Mounts: []Mount{
			{HostPath: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.1", ContainerPath: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.1", Options: ReadOnlyOptions},
			{HostPath: fw, ContainerPath: fw, Options: ReadOnlyOptions},
			{HostPath: "/etc/OpenCL/vendors/nvidia.icd", ContainerPath: "/etc/OpenCL/vendors/nvidia.icd", Options: ReadOnlyOptions},
			// Found in the GKE-style share folder, seen where the loader looks.
			{HostPath: "/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json", ContainerPath: "/usr/share/vulkan/icd.d/nvidia_icd.json", Options: ReadOnlyOptions},
			{HostPath: "/usr/lib/x86_64-linux-gnu/nvidia.conf", ContainerPath: "/usr/lib/x86_64-linux-gnu/nvidia.conf", Options: ReadOnlyOptions},
			{HostPath: "/etc/nvidia/nvidia-application-profiles-rc.d", ContainerPath: "/etc/nvidia/nvidia-application-profiles-rc.d", Options: ReadOnlyOptions},
			{HostPath: "/run/nvidia-persistenced/socket", ContainerPath: "/run/nvidia-persistenced/socket", Options: SocketOptions},
		},
		LibraryDirs: []string{"/usr/lib/x86_64-linux-gnu"},
	}
	e.normalize()
	tr := Tree{HostPath: "/t", ContainerPath: DefaultTreePath, FilesDir: "files", Files: map[string]string{
		"/usr/lib/x86_64-linux-gnu/libcuda.so.580.1": "lib64/libcuda.so.580.1",
		fw:                               "files" + fw,
		"/etc/OpenCL/vendors/nvidia.icd": "files/etc/OpenCL/vendors/nvidia.icd",
		"/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json": "files/usr/share/vulkan/icd.d/nvidia_icd.json",
		"/usr/lib/x86_64-linux-gnu/nvidia.conf":                "files/usr/lib/x86_64-linux-gnu/nvidia.conf",
		"/run/nvidia-persistenced/socket":                      "files/run/nvidia-persistenced/socket",
	}}
	if _, ok := e.UseTree(tr); !ok {
		t.Fatal("UseTree refused")
	}
	var dests []string
	for _, m := range e.Mounts {
		dests = append(dests, m.ContainerPath)
	}
	if want := []string{"/etc/nvidia/nvidia-application-profiles-rc.d", "/run/nvidia-persistenced/socket", "/usr/local/nvidia"}; !reflect.DeepEqual(dests, want) {
		t.Fatalf("mounts %v, want %v", dests, want)
	}
	want := []Symlink{
		{Target: "/usr/local/nvidia/files/etc/OpenCL/vendors/nvidia.icd", Link: "/etc/OpenCL/vendors/nvidia.icd"},
		{Target: "/usr/local/nvidia/files" + fw, Link: fw},
		{Target: "/usr/local/nvidia/files/usr/lib/x86_64-linux-gnu/nvidia.conf", Link: "/usr/lib/x86_64-linux-gnu/nvidia.conf"},
		{Target: "/usr/local/nvidia/files/usr/share/vulkan/icd.d/nvidia_icd.json", Link: "/usr/share/vulkan/icd.d/nvidia_icd.json"},
	}
	if !reflect.DeepEqual(e.Symlinks, want) {
		t.Fatalf("links\n%v\nwant\n%v", e.Symlinks, want)
	}
}
