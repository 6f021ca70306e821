package inject

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/drivervol"
	"github.com/gantry-gpu/gantry/internal/edits"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/request"
)

// treeConfig builds a fake driver root of layout (real ELF libraries, real
// device nodes) and returns a configuration of the tree layout over it, with
// its cache and tree directories in a new temporary directory.
func treeConfig(t *testing.T, layout string) config.Config {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot build the fake driver root (make deps installs it)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the fake driver's device nodes")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "driver")
	if _, err := fakedriver.Build(root, fakedriver.Options{Layout: layout, DeviceNodes: true}); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.GPUs, cfg.DriverRoot = "sim:h100x1", root
	cfg.Runtime.CacheDir = filepath.Join(dir, "cache")
	cfg.Runtime.DriverLayout = config.DriverLayoutTree
	cfg.Runtime.DriverTreeDir = filepath.Join(dir, "trees")
	return cfg
}

// The driver tree layout on both driver layouts Gantry meets: a
// distribution's (libraries in /usr/lib/x86_64-linux-gnu, linked into the
// tree) and GKE's (the driver already under /usr/local/nvidia, where the tree
// goes: no link needed, the tree's own SONAME links replace the per-file
// ones, including libcuda.so -> libcuda.so.1). Either way one mount from the
// tree directory, nothing else mounted or linked below the tree's path, and
// the libraries still due in ld.so.cache.
func TestPrepareDriverTree(t *testing.T) {
	for _, layout := range []string{fakedriver.LayoutStandard, fakedriver.LayoutGKE} {
		t.Run(layout, func(t *testing.T) {
			cfg := treeConfig(t, layout)
			for round := 1; round <= 2; round++ { // the second from the tree cache
				req, err := request.Parse(request.Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0"}}, discover.RequestOptions(cfg))
				if err != nil {
					t.Fatal(err)
				}
				rec := NewRecord(FrontEndRuntime, "c", "")
				p, err := Prepare(cfg, req, Options{}, rec)
				if err != nil {
					t.Fatal(err)
				}
				if rec.Layout != config.DriverLayoutTree {
					t.Fatalf("round %d: layout %q, notes %v: want the tree", round, rec.Layout, rec.Notes)
				}
				at := cfg.Runtime.DriverTreePath
				var tree int
				for _, m := range p.Edits.Mounts {
					switch {
					case m.ContainerPath == at:
						tree++
						if !strings.HasPrefix(m.HostPath, cfg.Runtime.DriverTreeDir+"/") {
							t.Errorf("tree mount from %s, want below %s", m.HostPath, cfg.Runtime.DriverTreeDir)
						}
					case strings.HasPrefix(m.ContainerPath, at+"/"):
						t.Errorf("round %d: %s mounted inside the tree's mount", round, m.ContainerPath)
					case strings.Contains(m.ContainerPath, ".so"):
						t.Errorf("round %d: library %s still has a mount of its own", round, m.ContainerPath)
					}
				}
				if tree != 1 {
					t.Errorf("round %d: %d mounts at %s, want 1", round, tree, at)
				}
				for _, s := range p.Edits.Symlinks {
					if strings.HasPrefix(s.Link, at+"/") {
						t.Errorf("round %d: link %s -> %s made below the tree's mount (hidden by it)", round, s.Link, s.Target)
					}
				}
				if !slices.ContainsFunc(p.inTree, func(c edits.Provided) bool { return strings.Contains(c.Path, "libcuda.so.") }) {
					t.Errorf("round %d: libcuda not among the files the tree provides (%v): no ld.so.cache entry would be made", round, p.inTree)
				}
				files := cfg
				files.Runtime.DriverLayout = config.DriverLayoutFiles
				pf, err := Prepare(files, req, Options{}, NewRecord(FrontEndRuntime, "c", ""))
				if err != nil {
					t.Fatal(err)
				}
				if linked := filesLinked(t, p, pf, at); len(linked) == 0 {
					t.Errorf("round %d: no firmware or configuration file is served from the tree", round)
				} else if !slices.ContainsFunc(linked, func(l string) bool { return strings.HasPrefix(l, "/lib/firmware/nvidia/") }) {
					t.Errorf("round %d: the firmware is not served from the tree: %q", round, linked)
				}
			}
		})
	}
}

// A container that mounts something of its own at or below the tree's path
// keeps the per-file layout: the tree's mount, made after the container's
// own, would hide it. A mount above the path does not stand in the way.
func TestPrepareDriverTreeSpecMounts(t *testing.T) {
	cfg, dir := fakeDriverConfig(t, "h100x1")
	cfg.Runtime.DriverLayout = config.DriverLayoutTree
	cfg.Runtime.DriverTreeDir = filepath.Join(dir, "trees")
	for _, tc := range []struct {
		mount string
		tree  bool
	}{
		{"/usr/local/nvidia/data", false},
		{"/usr/local/nvidia/", false},
		{"/usr/local", true},
		{"/usr/local/nvidia-other", true},
	} {
		req, err := request.Parse(request.Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0"}}, discover.RequestOptions(cfg))
		if err != nil {
			t.Fatal(err)
		}
		rec := NewRecord(FrontEndRuntime, "c", "")
		p, err := Prepare(cfg, req, Options{SpecMounts: []string{"/proc", tc.mount}}, rec)
		if err != nil {
			t.Fatal(err)
		}
		if got := rec.Layout == config.DriverLayoutTree; got != tc.tree {
			t.Errorf("container mount %s: tree layout %v, want %v (notes %v)", tc.mount, got, tc.tree, rec.Notes)
		}
		if !tc.tree {
			if !slices.ContainsFunc(rec.Notes, func(n string) bool { return strings.Contains(n, tc.mount) }) {
				t.Errorf("container mount %s: no note names it: %v", tc.mount, rec.Notes)
			}
			for _, m := range p.Edits.Mounts {
				if m.ContainerPath == cfg.Runtime.DriverTreePath {
					t.Errorf("container mount %s: the tree is mounted over it", tc.mount)
				}
			}
		}
	}
}

// The tree's file map outlives a reboot (cache-dir is a tmpfs) beside the
// trees, trusted again only while every file on both sides has the stamp it
// had when compared; a tree removed and built again is mapped anew.
func TestTreeMapKeptBesideTree(t *testing.T) {
	cfg := treeConfig(t, fakedriver.LayoutStandard)
	inv, err := discover.Driver(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, f := range append(slices.Clone(inv.Binaries), inv.Libraries...) {
		if f.Capability == driver.Compute || f.Capability == driver.Utility {
			files = append(files, f.HostPath)
		}
	}
	first, err := loadTree(cfg, inv, files)
	if err != nil {
		t.Fatal(err)
	}
	key := drivervol.SetKey(files)
	verified := verifiedName(drivervol.Store{Dir: cfg.Runtime.DriverTreeDir}.Set(key), inv.Root, inv.Version)
	want := treeCache{Format: treeFormat, Dir: cfg.Runtime.DriverTreeDir, Root: inv.Root, Version: inv.Version, Set: key}
	if len(first.Files) != len(files) {
		t.Errorf("the map holds %d files, the set %d", len(first.Files), len(files))
	}
	if got := readVerified(verified, want, first.Path); got == nil || len(got.Files) != len(first.Files) {
		t.Fatalf("the verified map beside the tree: %v, want the %d files", got, len(first.Files))
	}
	// A file changed since the comparison: the kept map is not trusted.
	var host string
	for h := range first.Files {
		host = h
		break
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(host, later, later); err != nil {
		t.Fatal(err)
	}
	if got := readVerified(verified, want, first.Path); got != nil {
		t.Fatal("the kept map was trusted after a driver file changed")
	}
	// A reboot (cache-dir emptied): mapped again, correctly.
	if err := os.RemoveAll(cfg.Runtime.CacheDir); err != nil {
		t.Fatal(err)
	}
	again, err := loadTree(cfg, inv, files)
	if err != nil || len(again.Files) != len(first.Files) {
		t.Fatalf("after the cache was emptied: %v, %v", again, err)
	}
	// The tree removed and built again: the cached map is not the new tree's.
	if err := os.RemoveAll(first.Path); err != nil {
		t.Fatal(err)
	}
	rebuilt, err := loadTree(cfg, inv, files)
	if err != nil {
		t.Fatal(err)
	}
	if rebuilt.Tree == first.Tree {
		t.Fatal("the map of the removed tree was used for the rebuilt one")
	}
	for _, rel := range rebuilt.Files {
		if _, err := os.Stat(filepath.Join(rebuilt.Path, rel)); err != nil {
			t.Errorf("mapped file missing from the rebuilt tree: %v", err)
		}
	}
}

// The tree a container gets holds exactly the driver's programs and
// libraries that the per-file layout would mount for its capabilities (and
// their links), nothing else: compute containers share one tree without
// any graphics library, a graphics container gets another one with them;
// no full per-version tree (a Docker volume) is built on the way.
func TestPrepareDriverTreePerCapabilities(t *testing.T) {
	cfg := treeConfig(t, fakedriver.LayoutStandard)
	prepare := func(layout, caps string) *Plan {
		t.Helper()
		c := cfg
		c.Runtime.DriverLayout = layout
		req, err := request.Parse(request.Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=" + caps}}, discover.RequestOptions(c))
		if err != nil {
			t.Fatal(err)
		}
		rec := NewRecord(FrontEndRuntime, "c", "")
		p, err := Prepare(c, req, Options{}, rec)
		if err != nil {
			t.Fatal(err)
		}
		if layout == config.DriverLayoutTree && rec.Layout != config.DriverLayoutTree {
			t.Fatalf("%s: layout %q, notes %v: want the tree", caps, rec.Layout, rec.Notes)
		}
		return p
	}
	treeOf := func(p *Plan) string {
		t.Helper()
		for _, m := range p.Edits.Mounts {
			if m.ContainerPath == cfg.Runtime.DriverTreePath {
				return m.HostPath
			}
		}
		t.Fatalf("no tree mount in %+v", p.Edits.Mounts)
		return ""
	}
	// The tree's files (by name) and its links.
	contents := func(dir string) (files, links []string) {
		t.Helper()
		for _, d := range []string{drivervol.BinDir, drivervol.Lib64Dir, drivervol.LibDir} {
			ents, err := os.ReadDir(filepath.Join(dir, d))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				if e.Type().IsRegular() {
					files = append(files, e.Name())
				} else {
					links = append(links, e.Name())
				}
			}
		}
		slices.Sort(files)
		return files, links
	}
	// What the per-file layout mounts of the driver's programs and
	// libraries, by name.
	perFile := func(caps string) []string {
		t.Helper()
		p := prepare(config.DriverLayoutFiles, caps)
		var out []string
		for _, f := range append(slices.Clone(p.Inventory.Binaries), p.Inventory.Libraries...) {
			if slices.ContainsFunc(p.Edits.Mounts, func(m edits.Mount) bool { return m.HostPath == f.HostPath }) {
				out = append(out, filepath.Base(f.HostPath))
			}
		}
		slices.Sort(out)
		return out
	}
	graphicsLib := func(name string) bool {
		return strings.Contains(name, "EGL_nvidia") || strings.Contains(name, "GLX_nvidia") || strings.Contains(name, "GLX_indirect")
	}

	computeTree := treeOf(prepare(config.DriverLayoutTree, "compute,utility"))
	files, links := contents(computeTree)
	if want := perFile("compute,utility"); !slices.Equal(files, want) {
		t.Errorf("compute,utility tree holds %q\nthe per-file layout mounts %q", files, want)
	}
	for _, n := range append(slices.Clone(files), links...) {
		if graphicsLib(n) {
			t.Errorf("compute,utility tree holds the graphics library %s", n)
		}
	}
	if !slices.Contains(links, "libcuda.so.1") || !slices.Contains(links, "libcuda.so") {
		t.Errorf("compute,utility tree lacks libcuda's links: %q", links)
	}
	// A second compute container, from the tree cache and without it.
	if again := treeOf(prepare(config.DriverLayoutTree, "utility,compute")); again != computeTree {
		t.Errorf("two compute containers got two trees: %s and %s", computeTree, again)
	}
	if err := os.RemoveAll(cfg.Runtime.CacheDir); err != nil {
		t.Fatal(err)
	}
	if again := treeOf(prepare(config.DriverLayoutTree, "compute,utility")); again != computeTree {
		t.Errorf("a compute container after the cache was emptied got %s, want %s", again, computeTree)
	}

	graphicsTree := treeOf(prepare(config.DriverLayoutTree, "graphics,compute,utility"))
	if graphicsTree == computeTree {
		t.Fatal("the graphics container got the compute tree")
	}
	gfiles, glinks := contents(graphicsTree)
	if want := perFile("graphics,compute,utility"); !slices.Equal(gfiles, want) {
		t.Errorf("graphics tree holds %q\nthe per-file layout mounts %q", gfiles, want)
	}
	for _, want := range []string{"libEGL_nvidia.so.0", "libGLX_nvidia.so.0"} {
		if !slices.Contains(glinks, want) {
			t.Errorf("graphics tree lacks %s: %q", want, glinks)
		}
	}
	// The loaders' files (Vulkan ICD, EGL vendor, OpenCL ICD) and the
	// firmware: links into the tree, no mount each.
	linked := filesLinked(t, prepare(config.DriverLayoutTree, "graphics,compute,utility"), prepare(config.DriverLayoutFiles, "graphics,compute,utility"), cfg.Runtime.DriverTreePath)
	for _, want := range []string{"/usr/share/vulkan/icd.d/nvidia_icd.json", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/etc/OpenCL/vendors/nvidia.icd"} {
		if !slices.Contains(linked, want) {
			t.Errorf("graphics container: %s is not served from the tree (linked: %q)", want, linked)
		}
	}
	if linked := filesLinked(t, prepare(config.DriverLayoutTree, "compute,utility"), prepare(config.DriverLayoutFiles, "compute,utility"), cfg.Runtime.DriverTreePath); slices.Contains(linked, "/usr/share/vulkan/icd.d/nvidia_icd.json") {
		t.Errorf("compute container got the Vulkan ICD file: %q", linked)
	}
	store := drivervol.Store{Dir: cfg.Runtime.DriverTreeDir}
	if vs, err := store.Versions(); err != nil || len(vs) != 0 {
		t.Errorf("the runtime made per-version trees (Docker volumes): %q %v", vs, err)
	}
}

// Containers created at once, the first of their set, all get the one tree
// and the same map of it (drivervol builds atomically; the maps are written
// whole).
func TestLoadTreeConcurrentFirstCreates(t *testing.T) {
	cfg := treeConfig(t, fakedriver.LayoutStandard)
	inv, err := discover.Driver(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, f := range append(slices.Clone(inv.Binaries), inv.Libraries...) {
		if f.Capability == driver.Compute || f.Capability == driver.Utility {
			files = append(files, f.HostPath)
		}
	}
	got := make([]*treeCache, 6)
	errs := make([]error, len(got))
	var wg sync.WaitGroup
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = loadTree(cfg, inv, files)
		}()
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if got[i].Path != got[0].Path || !maps.Equal(got[i].Files, got[0].Files) || len(got[i].Files) != len(files) {
			t.Errorf("create %d: tree %s with %d files, create 0: %s with %d (want %d)", i, got[i].Path, len(got[i].Files), got[0].Path, len(got[0].Files), len(files))
		}
	}
	set := drivervol.Store{Dir: cfg.Runtime.DriverTreeDir}.Set(drivervol.SetKey(files))
	ents, err := os.ReadDir(set.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range ents {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	if !slices.Equal(dirs, []string{inv.Version}) {
		t.Errorf("the set's store holds the directories %q, want one tree", dirs)
	}
}

// filesLinked checks that every regular firmware and configuration file the
// per-file layout mounts (files, the same request's plan) is, in the tree
// layout (tree), no mount but a link at the same container path to
// <at>/files/<container path>, where the tree has the host file's bytes, and
// that the tree layout mounts nothing else of the driver read-only but the
// tree and what is no regular file (a directory). It returns the linked
// container paths, sorted.
func filesLinked(t *testing.T, tree, files *Plan, at string) []string {
	t.Helper()
	inv := tree.Inventory
	library := map[string]bool{}
	for _, f := range slices.Concat(inv.Binaries, inv.Libraries) {
		library[f.HostPath] = true
	}
	other := map[string]bool{}
	for _, f := range slices.Concat(inv.Firmware, inv.Configs) {
		if !library[f.HostPath] { // the GBM backend is a library's link
			other[f.HostPath] = true
		}
	}
	treeHost := ""
	mounts := map[string]edits.Mount{}
	for _, m := range tree.Edits.Mounts {
		if m.ContainerPath == at {
			treeHost = m.HostPath
			continue
		}
		mounts[m.ContainerPath] = m
		if st, err := os.Stat(m.HostPath); slices.Contains(m.Options, "ro") && (err != nil || st.Mode().IsRegular()) {
			t.Errorf("the tree layout still mounts the regular file %s at %s", m.HostPath, m.ContainerPath)
		}
	}
	if treeHost == "" {
		t.Fatalf("no tree mount at %s", at)
	}
	links := map[string]string{}
	for _, s := range tree.Edits.Symlinks {
		links[s.Link] = s.Target
	}
	var linked []string
	for _, m := range files.Edits.Mounts {
		if !other[m.HostPath] {
			continue
		}
		if st, err := os.Stat(m.HostPath); err != nil || !st.Mode().IsRegular() {
			if _, ok := mounts[m.ContainerPath]; !ok {
				t.Errorf("%s (no regular file) lost its mount", m.ContainerPath)
			}
			continue
		}
		if want := at + "/" + drivervol.FilePath(m.ContainerPath); links[m.ContainerPath] != want {
			t.Errorf("%s: link to %q, want %q", m.ContainerPath, links[m.ContainerPath], want)
			continue
		}
		host, err := os.ReadFile(m.HostPath)
		if err != nil {
			t.Fatal(err)
		}
		inTree, err := os.ReadFile(filepath.Join(treeHost, drivervol.FilePath(m.ContainerPath)))
		if err != nil || string(inTree) != string(host) {
			t.Errorf("%s: the tree's file (%v) has not the bytes of %s", m.ContainerPath, err, m.HostPath)
		}
		linked = append(linked, m.ContainerPath)
	}
	slices.Sort(linked)
	return linked
}

// A driver library replaced under the same path and driver version (a
// driver reinstalled, `gantry sim driver-root` run again over the same
// directory): the next container gets a tree holding the new file, not the
// cached tree of the old one. The tree's key holds each file's identity.
func TestTreeFollowsReplacedDriverFile(t *testing.T) {
	cfg := treeConfig(t, fakedriver.LayoutStandard)
	prepare := func() (tree string) {
		t.Helper()
		req, err := request.Parse(request.Input{Env: []string{"NVIDIA_VISIBLE_DEVICES=0"}}, discover.RequestOptions(cfg))
		if err != nil {
			t.Fatal(err)
		}
		rec := NewRecord(FrontEndRuntime, "c", "")
		p, err := Prepare(cfg, req, Options{}, rec)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Layout != config.DriverLayoutTree {
			t.Fatalf("layout %q, notes %v: want the tree", rec.Layout, rec.Notes)
		}
		for _, m := range p.Edits.Mounts {
			if m.ContainerPath == cfg.Runtime.DriverTreePath {
				return m.HostPath
			}
		}
		t.Fatalf("no tree mount at %s in %v", cfg.Runtime.DriverTreePath, p.Edits.Mounts)
		return ""
	}
	inv, err := discover.Driver(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var lib string
	for _, f := range inv.Libraries {
		if strings.HasPrefix(filepath.Base(f.HostPath), "libcuda.so.") {
			lib = f.HostPath
		}
	}
	if lib == "" {
		t.Fatal("no libcuda in the fake driver")
	}
	first := prepare()
	if again := prepare(); again != first { // from the cache: the same tree
		t.Fatalf("second container's tree %s, the first's %s", again, first)
	}
	old, err := os.ReadFile(filepath.Join(first, "lib64", filepath.Base(lib)))
	if err != nil {
		t.Fatal(err)
	}
	// Replaced as a package manager replaces it: a new file renamed over
	// the old one, same path, same version, other bytes.
	updated := append(slices.Clone(old), []byte("rebuilt")...)
	if err := os.WriteFile(lib+".new", updated, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(lib+".new", lib); err != nil {
		t.Fatal(err)
	}
	second := prepare()
	got, err := os.ReadFile(filepath.Join(second, "lib64", filepath.Base(lib)))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(updated) {
		t.Fatalf("after %s was replaced, the container's tree %s holds its old content (%d bytes, want %d)", lib, second, len(got), len(updated))
	}
	if second == first {
		t.Errorf("the replaced file's tree is the old tree %s", first)
	}
}
