package inject

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

// The inventory cache's encoding (and the driver tree cache's, treeCache):
// every field in a fixed order, strings and
// lists length-prefixed (uvarint), numbers as varints, after cacheMagic.
// A create decodes it in a few microseconds; encoding/json took ~0.3 ms in
// a fresh gantry-runtime, most of it reflection done once per process.
// TestCacheCodecEveryField fills every field of the cached types and fails
// when one does not come back (a field added to driver.File or gpu.Device
// and not to this file), so the cache cannot drop data silently.
//
// The file is trusted only as far as openCache allows (ours, not writable
// by others); the decoder still treats it as arbitrary bytes: a count or a
// length beyond what is left, a truncated or overlong file, or trailing
// bytes make it an error, never a panic or a huge allocation
// (FuzzDecodeCache), and the caller then rediscovers.

// cacheMagic opens every cache file; the format number follows in the key.
const cacheMagic = "gantry inventory cache\n"

var errCorrupt = errors.New("corrupt inventory cache")

type encoder struct{ b []byte }

func (e *encoder) uint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) int(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) str(s string)  { e.uint(uint64(len(s))); e.b = append(e.b, s...) }
func (e *encoder) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}
func (e *encoder) strs(ss []string) {
	e.uint(uint64(len(ss)))
	for _, s := range ss {
		e.str(s)
	}
}

// decoder reads the file as one string: every string it returns is a
// slice of it, one allocation for all.
type decoder struct {
	s   string
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = errCorrupt
	}
	d.s = ""
}

// uint reads a uvarint (binary.Uvarint's rules: at most 10 bytes, no
// overflow).
func (d *decoder) uint() uint64 {
	var v uint64
	for i := 0; i < len(d.s) && i < binary.MaxVarintLen64; i++ {
		c := d.s[i]
		if i == binary.MaxVarintLen64-1 && c > 1 {
			break
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			d.s = d.s[i+1:]
			return v
		}
	}
	d.fail()
	return 0
}

func (d *decoder) int() int64 {
	u := d.uint()
	v := int64(u >> 1)
	if u&1 != 0 {
		v = ^v
	}
	return v
}

func (d *decoder) str() string {
	n := d.uint()
	if n > uint64(len(d.s)) {
		d.fail()
		return ""
	}
	s := d.s[:n]
	d.s = d.s[n:]
	return s
}

func (d *decoder) bool() bool {
	if len(d.s) == 0 || d.s[0] > 1 {
		d.fail()
		return false
	}
	v := d.s[0] == 1
	d.s = d.s[1:]
	return v
}

// count reads a list's length: each element takes a byte at least, so a
// count beyond the bytes left is corrupt. Lists grow as their elements are
// decoded (capacity: capFor), so a corrupt count never allocates more than
// the elements actually there.
func (d *decoder) count() int {
	n := d.uint()
	if n > uint64(len(d.s)) {
		d.fail()
		return 0
	}
	return int(n)
}

// capFor is the capacity a list of n elements starts with.
func capFor(n int) int { return min(n, 64) }

func (d *decoder) strs() []string {
	n := d.count()
	if n == 0 {
		return nil
	}
	out := make([]string, 0, capFor(n))
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, d.str())
	}
	return out
}

// encodeCache is c as a cache file's bytes.
func encodeCache(c cacheFile) []byte {
	e := &encoder{b: make([]byte, 0, 16<<10)}
	e.b = append(e.b, cacheMagic...)
	k := c.Key
	e.uint(uint64(k.Format))
	e.str(k.DriverRoot)
	e.str(k.DevRoot)
	e.strs(k.SearchPaths)
	e.str(k.Version)
	e.str(k.LDCache)
	e.str(k.Nodes)
	e.str(c.GPUKey)
	e.bool(c.Inventory != nil)
	if inv := c.Inventory; inv != nil {
		e.str(inv.Root)
		e.str(inv.Version)
		for _, files := range [][]driver.File{inv.Libraries, inv.Binaries, inv.Sockets, inv.Firmware, inv.Configs, inv.DeviceNodes} {
			e.uint(uint64(len(files)))
			for _, f := range files {
				e.str(f.HostPath)
				e.str(f.ContainerPath)
				e.str(string(f.Kind))
				e.str(string(f.Capability))
				e.str(f.SONAME)
				e.int(f.Major)
				e.int(f.Minor)
			}
		}
		e.strs(inv.Missing)
		e.strs(inv.Warnings)
	}
	e.bool(c.GPUs != nil)
	if s := c.GPUs; s != nil {
		e.str(s.Backend)
		e.str(s.DriverVersion)
		e.str(s.CUDADriverVersion)
		e.uint(uint64(len(s.Devices)))
		for _, g := range s.Devices {
			e.int(int64(g.Index))
			e.int(int64(g.Minor))
			e.str(g.UUID)
			e.str(g.PCIBusID)
			e.str(g.Name)
			e.str(g.Brand)
			e.str(g.Architecture)
			e.str(g.ComputeCapability)
			e.uint(g.MemoryMiB)
			e.int(int64(g.NUMANode))
			e.str(g.CPUAffinity)
			e.str(g.NUMAAffinity)
			e.bool(g.MIGEnabled)
			e.uint(uint64(len(g.MIGDevices)))
			for _, m := range g.MIGDevices {
				e.int(int64(m.Index))
				e.int(int64(m.Parent))
				e.str(m.UUID)
				e.str(m.Profile)
				e.int(int64(m.GPUInstance))
				e.int(int64(m.ComputeInstance))
				e.uint(m.MemoryMiB)
				e.int(int64(m.GICapMinor))
				e.int(int64(m.CICapMinor))
			}
			e.uint(uint64(len(g.NVLinks)))
			for _, l := range g.NVLinks {
				e.str(l.PeerUUID)
				e.bool(l.Switch)
				e.int(int64(l.Links))
			}
		}
	}
	return e.b
}

// decodeKey reads the magic and the key: all a cache's reader needs to
// know whether the rest is worth decoding.
func decodeKey(d *decoder) cacheKey {
	if !strings.HasPrefix(d.s, cacheMagic) {
		d.fail()
		return cacheKey{}
	}
	d.s = d.s[len(cacheMagic):]
	var k cacheKey
	k.Format = int(d.uint())
	k.DriverRoot = d.str()
	k.DevRoot = d.str()
	k.SearchPaths = d.strs()
	k.Version = d.str()
	k.LDCache = d.str()
	k.Nodes = d.str()
	return k
}

// decodeCache is the cache file b, or an error if it is not one (wrong
// magic, corrupt, truncated, or bytes left over).
func decodeCache(b []byte) (*cacheFile, error) {
	d := &decoder{s: string(b)}
	c := &cacheFile{Key: decodeKey(d)}
	if d.err == nil && c.Key.Format != cacheFormat {
		return nil, fmt.Errorf("inventory cache format %d, want %d", c.Key.Format, cacheFormat)
	}
	c.GPUKey = d.str()
	if d.bool() {
		inv := &driver.Inventory{Root: d.str(), Version: d.str()}
		for _, files := range []*[]driver.File{&inv.Libraries, &inv.Binaries, &inv.Sockets, &inv.Firmware, &inv.Configs, &inv.DeviceNodes} {
			n := d.count()
			if n == 0 {
				continue
			}
			*files = make([]driver.File, 0, capFor(n))
			for i := 0; i < n && d.err == nil; i++ {
				*files = append(*files, driver.File{
					HostPath:      d.str(),
					ContainerPath: d.str(),
					Kind:          driver.FileKind(d.str()),
					Capability:    driver.Capability(d.str()),
					SONAME:        d.str(),
					Major:         d.int(),
					Minor:         d.int(),
				})
			}
		}
		inv.Missing = d.strs()
		inv.Warnings = d.strs()
		c.Inventory = inv
	}
	if d.bool() {
		s := &gpu.System{Backend: d.str(), DriverVersion: d.str(), CUDADriverVersion: d.str()}
		n := d.count()
		if n > 0 {
			s.Devices = make([]gpu.Device, 0, capFor(n))
		}
		for i := 0; i < n && d.err == nil; i++ {
			g := gpu.Device{
				Index:             int(d.int()),
				Minor:             int(d.int()),
				UUID:              d.str(),
				PCIBusID:          d.str(),
				Name:              d.str(),
				Brand:             d.str(),
				Architecture:      d.str(),
				ComputeCapability: d.str(),
				MemoryMiB:         d.uint(),
				NUMANode:          int(d.int()),
				CPUAffinity:       d.str(),
				NUMAAffinity:      d.str(),
				MIGEnabled:        d.bool(),
			}
			m := d.count()
			if m > 0 {
				g.MIGDevices = make([]gpu.MIGDevice, 0, capFor(m))
			}
			for j := 0; j < m && d.err == nil; j++ {
				g.MIGDevices = append(g.MIGDevices, gpu.MIGDevice{
					Index:           int(d.int()),
					Parent:          int(d.int()),
					UUID:            d.str(),
					Profile:         d.str(),
					GPUInstance:     int(d.int()),
					ComputeInstance: int(d.int()),
					MemoryMiB:       d.uint(),
					GICapMinor:      int(d.int()),
					CICapMinor:      int(d.int()),
				})
			}
			l := d.count()
			if l > 0 {
				g.NVLinks = make([]gpu.NVLink, 0, capFor(l))
			}
			for j := 0; j < l && d.err == nil; j++ {
				g.NVLinks = append(g.NVLinks, gpu.NVLink{PeerUUID: d.str(), Switch: d.bool(), Links: int(d.int())})
			}
			s.Devices = append(s.Devices, g)
		}
		c.GPUs = s
	}
	if d.err == nil && len(d.s) > 0 {
		d.fail()
	}
	if d.err != nil {
		return nil, d.err
	}
	return c, nil
}

// treeMagic opens every tree cache file (treeCache); treeFormat follows.
const treeMagic = "gantry driver tree cache\n"

// encodeTree is c as a tree cache file's bytes, maps in key order.
func encodeTree(c *treeCache) []byte {
	e := &encoder{b: make([]byte, 0, 8<<10)}
	e.b = append(e.b, treeMagic...)
	e.uint(uint64(c.Format))
	e.str(c.Dir)
	e.str(c.Root)
	e.str(c.Version)
	e.str(c.Set)
	e.str(c.Path)
	keys := sortedKeys(c.Files)
	e.uint(uint64(len(keys)))
	for _, k := range keys {
		e.str(k)
		e.str(c.Files[k])
	}
	e.strs(c.Links)
	e.stamp(c.Tree)
	keys = sortedKeys(c.Stamps)
	e.uint(uint64(len(keys)))
	for _, k := range keys {
		e.str(k)
		e.stamp(c.Stamps[k][0])
		e.stamp(c.Stamps[k][1])
	}
	return e.b
}

func (e *encoder) stamp(s stamp) {
	e.uint(s.Dev)
	e.uint(s.Ino)
	e.int(s.Size)
	e.int(s.MtimeNsec)
	e.int(s.CtimeNsec)
}

func (d *decoder) stamp() stamp {
	return stamp{Dev: d.uint(), Ino: d.uint(), Size: d.int(), MtimeNsec: d.int(), CtimeNsec: d.int()}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// decodeTree is the tree cache file b, or an error if it is not a whole one
// of this treeFormat (the same rules as decodeCache).
func decodeTree(b []byte) (*treeCache, error) {
	d := &decoder{s: string(b)}
	if !strings.HasPrefix(d.s, treeMagic) {
		return nil, errCorrupt
	}
	d.s = d.s[len(treeMagic):]
	c := &treeCache{Format: int(d.uint())}
	if d.err == nil && c.Format != treeFormat {
		return nil, fmt.Errorf("driver tree cache format %d, want %d", c.Format, treeFormat)
	}
	c.Dir, c.Root, c.Version, c.Set, c.Path = d.str(), d.str(), d.str(), d.str(), d.str()
	if n := d.count(); n > 0 {
		c.Files = make(map[string]string, capFor(n))
		for i := 0; i < n && d.err == nil; i++ {
			k := d.str()
			c.Files[k] = d.str()
		}
	}
	c.Links = d.strs()
	c.Tree = d.stamp()
	if n := d.count(); n > 0 {
		c.Stamps = make(map[string][2]stamp, capFor(n))
		for i := 0; i < n && d.err == nil; i++ {
			k := d.str()
			c.Stamps[k] = [2]stamp{d.stamp(), d.stamp()}
		}
	}
	if d.err == nil && len(d.s) > 0 {
		d.fail()
	}
	if d.err != nil {
		return nil, d.err
	}
	return c, nil
}
