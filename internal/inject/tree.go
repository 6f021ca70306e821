package inject

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/drivervol"
	"github.com/gantry-gpu/gantry/internal/edits"
)

// treeFormat changes whenever treeCache's meaning or encoding
// (cachecodec.go) changes. 6: firmware and configuration files mapped too
// (drivervol.FilesDir); 5: a tree per set of files (Set); 4 mapped the
// full per-version tree; 3 was JSON, in *.json, which a new gantry ignores.
const treeFormat = 6

// treeCache is what the runtime keeps of a driver tree between containers,
// so that a create in the tree layout costs one small file read and one
// stat: the tree's directory and, for each driver file it holds, where.
type treeCache struct {
	Format  int
	Dir     string
	Root    string
	Version string
	// Set is the key of the set of driver files the tree holds
	// (drivervol.SetKey of their host paths).
	Set   string
	Path  string
	Files map[string]string
	Links []string
	// Tree is the tree directory's identity when the map was made: a tree
	// removed and built again (another driver root of the same version)
	// is not the one the map describes.
	Tree stamp
	// Stamps identify each mapped file on both sides (host path, then the
	// tree's file) when it was compared, so the map kept beside the tree
	// (verifiedName) is trusted again after a reboot empties cache-dir by
	// a stat of each, not a byte-for-byte comparison of a copied tree.
	Stamps map[string][2]stamp
}

// stamp is what a stat says of a file's identity and content.
type stamp struct {
	Dev, Ino  uint64
	Size      int64
	MtimeNsec int64
	CtimeNsec int64
}

func stampOf(p string) (stamp, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return stamp{}, false
	}
	return stamp{Dev: st.Dev, Ino: st.Ino, Size: st.Size, MtimeNsec: st.Mtim.Nano(), CtimeNsec: st.Ctim.Nano()}, true
}

// verifiedName is the file beside the trees (in driver-tree-dir, which
// outlives a reboot, unlike cache-dir) that keeps a version's verified map.
func verifiedName(store drivervol.Store, root, version string) string {
	h := sha256.Sum256([]byte(root))
	return filepath.Join(store.Dir, ".gantry-files-"+version+"-"+hex.EncodeToString(h[:6])+".bin")
}

// useTree switches the plan's edits to the driver tree layout
// (runtime.driver-layout = "tree"): the driver's programs, libraries,
// firmware and configuration files that the edits mount read-only (those of
// the container's capabilities) as one read-only mount of a tree holding
// exactly those files (package drivervol's
// EnsureSet: one tree per driver version and set of files, built on first
// use, shared by every container given the same files), with a link at
// each file's usual path. Whatever stands in the way (no tree can be
// built, a file the mount would hide) keeps the per-file layout, with a
// note saying why: a container is never refused for its layout.
func (p *Plan) useTree(cfg config.Config) {
	if cfg.Runtime.DriverLayout != config.DriverLayoutTree || p.Edits == nil || p.Inventory == nil {
		return
	}
	files := treeSet(p.Edits, p.Inventory)
	if len(files) == 0 {
		return // no driver file to gather: nothing for a tree to hold
	}
	at := path.Clean(cfg.Runtime.DriverTreePath)
	for _, m := range p.opts.SpecMounts {
		if c := path.Clean("/" + m); c == at || strings.HasPrefix(c, at+"/") {
			p.Record.Notes = append(p.Record.Notes, "driver tree layout not used (a mount per file instead): the container mounts "+m+", which the tree's mount at "+at+" would hide")
			return
		}
	}
	t, err := loadTree(cfg, p.Inventory, files)
	if err != nil {
		p.Record.Notes = append(p.Record.Notes, "driver tree layout not used (a mount per file instead): "+err.Error())
		return
	}
	links := make(map[string]bool, len(t.Links))
	for _, l := range t.Links {
		links[l] = true
	}
	provided, ok := p.Edits.UseTree(edits.Tree{HostPath: t.Path, ContainerPath: cfg.Runtime.DriverTreePath, Files: t.Files, FilesDir: drivervol.FilesDir, Links: links})
	if !ok {
		p.Record.Notes = append(p.Record.Notes, "driver tree layout not used (a mount per file instead): other injected files are at or below "+cfg.Runtime.DriverTreePath)
		return
	}
	p.inTree = provided
	p.Record.Layout = config.DriverLayoutTree
}

// treeSet lists the host paths of the driver's programs, libraries,
// firmware and configuration files that e mounts read-only, sorted: the
// files the per-file layout would give the container, which its tree holds
// (of firmware and configuration files, the regular ones: drivervol leaves
// out a directory, which keeps its mount), and nothing else. IPC sockets
// and device nodes are never among them.
func treeSet(e *edits.Edits, inv *driver.Inventory) []string {
	driverFile := make(map[string]bool, len(inv.Binaries)+len(inv.Libraries)+len(inv.Firmware)+len(inv.Configs))
	for _, g := range [][]driver.File{inv.Binaries, inv.Libraries, inv.Firmware, inv.Configs} {
		for _, f := range g {
			driverFile[f.HostPath] = true
		}
	}
	var out []string
	for _, m := range e.Mounts {
		if driverFile[m.HostPath] && slices.Contains(m.Options, "ro") {
			out = append(out, m.HostPath)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// loadTree returns the tree of inv's driver version holding the files (host
// paths, treeSet) and where it holds each: from runtime.cache-dir while the
// tree is there, otherwise from the tree itself (built when missing), then
// cached. The cache's name and content carry the set's key
// (drivervol.SetKey), so each set has its own.
func loadTree(cfg config.Config, inv *driver.Inventory, files []string) (*treeCache, error) {
	store := drivervol.Store{Dir: cfg.Runtime.DriverTreeDir}
	key := drivervol.SetKey(files)
	want := treeCache{Format: treeFormat, Dir: store.Dir, Root: inv.Root, Version: inv.Version, Set: key}
	var cachePath string
	if cfg.Runtime.CacheDir != "" {
		h := sha256.Sum256([]byte(store.Dir + "\x00" + inv.Root + "\x00" + inv.Version + "\x00" + key))
		cachePath = filepath.Join(cfg.Runtime.CacheDir, "tree-"+hex.EncodeToString(h[:6])+".bin")
		if c := readTreeCache(cachePath, want); c != nil {
			return c, nil
		}
	}
	t, err := store.EnsureSet(inv, files)
	if err != nil {
		return nil, err
	}
	verified := verifiedName(store.Set(key), inv.Root, inv.Version)
	c := readVerified(verified, want, t.Path)
	if c == nil {
		c = &want
		c.Path, c.Links = t.Path, treeLinks(t.Path)
		c.Files, c.Stamps = treeFiles(t, drivervol.Subset(inv, files))
		if len(c.Files) == 0 {
			return nil, fmt.Errorf("the driver tree %s holds none of the driver's files", t.Path)
		}
		c.Tree, _ = stampOf(t.Path)
		_ = writeTreeCache(verified, c)
	}
	if cachePath != "" {
		// A cache that cannot be written costs speed, not correctness.
		_ = writeTreeCache(cachePath, c)
	}
	return c, nil
}

// readVerified returns the map kept beside the tree when it matches want,
// describes the tree at path as it is now, and every file on both sides
// still has the stamp it had when compared.
func readVerified(p string, want treeCache, path string) *treeCache {
	c := readTreeCache(p, want)
	if c == nil || c.Path != path || len(c.Stamps) != len(c.Files) {
		return nil
	}
	for host, rel := range c.Files {
		st, ok := c.Stamps[host]
		if !ok {
			return nil
		}
		if now, ok := stampOf(host); !ok || now != st[0] {
			return nil
		}
		if now, ok := stampOf(filepath.Join(c.Path, rel)); !ok || now != st[1] {
			return nil
		}
	}
	return c
}

// readTreeCache returns the cached tree if the file is ours (openCache, as
// for the inventory's: its paths become mounts), matches want, and the
// tree's directory is still there (`docker volume rm` removes it).
func readTreeCache(p string, want treeCache) *treeCache {
	b := readCacheBytes(p)
	if b == nil {
		return nil
	}
	c, err := decodeTree(b)
	if err != nil || c.Format != want.Format || c.Dir != want.Dir ||
		c.Root != want.Root || c.Version != want.Version || c.Set != want.Set || len(c.Files) == 0 {
		return nil
	}
	if now, ok := stampOf(c.Path); !ok || now.Dev != c.Tree.Dev || now.Ino != c.Tree.Ino || now.CtimeNsec != c.Tree.CtimeNsec {
		return nil
	}
	return c
}

// treeFiles maps each of inv's programs, libraries, firmware and
// configuration files that the tree holds to its place there (drivervol's
// layout: bin/NAME, lib64/FILE, lib/FILE for 32-bit, files/CONTAINER-PATH
// for the others; a host file mapped once, the first place winning). A
// file is taken only when the tree's copy is the same file (the
// hard link drivervol makes on one filesystem) or has the same bytes (its
// copy across filesystems); anything else keeps its own mount. The stamps
// of both sides of each mapped file come with the map.
func treeFiles(t *drivervol.Tree, inv *driver.Inventory) (map[string]string, map[string][2]stamp) {
	have := map[string]bool{}
	for _, b := range t.Binaries {
		have[path.Join(drivervol.BinDir, b)] = true
	}
	for _, l := range t.Libraries {
		have[l.Path] = true
	}
	for _, f := range t.Files {
		have[f] = true
	}
	files := map[string]string{}
	stamps := map[string][2]stamp{}
	add := func(f driver.File, rel string) {
		in := filepath.Join(t.Path, rel)
		if _, done := files[f.HostPath]; done || !have[rel] || !sameFile(f.HostPath, in) {
			return
		}
		a, aok := stampOf(f.HostPath)
		b, bok := stampOf(in)
		if aok && bok {
			files[f.HostPath] = rel
			stamps[f.HostPath] = [2]stamp{a, b}
		}
	}
	for _, f := range inv.Binaries {
		add(f, path.Join(drivervol.BinDir, path.Base(f.ContainerPath)))
	}
	for _, f := range inv.Libraries {
		dir := drivervol.Lib64Dir
		if f.Capability == driver.Compat32 {
			dir = drivervol.LibDir
		}
		add(f, path.Join(dir, path.Base(f.HostPath)))
	}
	for _, f := range slices.Concat(inv.Firmware, inv.Configs) {
		if rel := drivervol.FilePath(f.ContainerPath); rel != "" {
			add(f, rel)
		}
	}
	return files, stamps
}

// treeLinks lists the symbolic links in the tree's directories (SONAME
// links and the like), relative to the tree.
func treeLinks(dir string) []string {
	var links []string
	for _, d := range []string{drivervol.BinDir, drivervol.Lib64Dir, drivervol.LibDir} {
		ents, _ := os.ReadDir(filepath.Join(dir, d))
		for _, e := range ents {
			if e.Type()&os.ModeSymlink != 0 {
				links = append(links, path.Join(d, e.Name()))
			}
		}
	}
	return links
}

// sameFile reports whether a and b are one file, or two of equal bytes.
func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	if err != nil || !sa.Mode().IsRegular() || !sb.Mode().IsRegular() {
		return false
	}
	if os.SameFile(sa, sb) {
		return true
	}
	if sa.Size() != sb.Size() {
		return false
	}
	fa, err := os.Open(a)
	if err != nil {
		return false
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<16), make([]byte, 1<<16)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false
		}
		if errors.Is(ea, io.EOF) || errors.Is(ea, io.ErrUnexpectedEOF) {
			return errors.Is(eb, io.EOF) || errors.Is(eb, io.ErrUnexpectedEOF)
		}
		if ea != nil || eb != nil {
			return false
		}
	}
}
