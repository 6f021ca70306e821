package inject

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

// cacheFormat changes whenever driver.Inventory's meaning or the cache's
// encoding (cachecodec.go) changes, so a new gantry never trusts an old
// gantry's cache. 2: the binary encoding, in inventory-*.bin (1 was JSON,
// in inventory-*.json, which a new gantry ignores). 3: the key holds
// driver.Stamp (device nodes, sockets, program directories). 4: GPUs carry
// NVML's CPU and NUMA affinity sets.
const cacheFormat = 4

// cacheKey is what a cached inventory is valid for. The driver version is
// read from one small file per create; the loader cache's size and time
// catch libraries added or removed without a driver upgrade.
type cacheKey struct {
	Format      int
	DriverRoot  string
	DevRoot     string
	SearchPaths []string
	Version     string
	LDCache     string
	// Nodes is driver.Stamp: device nodes, sockets and program
	// directories, which change without the version or ld.so.cache.
	Nodes string
}

type cacheFile struct {
	Key       cacheKey
	Inventory *driver.Inventory
	// GPUs is the GPU list the light discovery gave, valid while the
	// driver's list of GPUs (GPUKey) is the same and no GPU has MIG
	// instances; absent when that cannot be told (simulated GPUs, MIG).
	GPUKey string
	GPUs   *gpu.System
}

// inventorySource says where an inventory came from, for the log.
type inventorySource string

const (
	fromCache    inventorySource = "cache"
	fromDiscover inventorySource = "discovery"
)

// LoadHost is loadHost for cdi generate: the GPUs as light discovery gives
// them and the driver inventory, from the same cache as the containers'
// (runtime.cache-dir) when it is current, else discovered (and cached).
func LoadHost(cfg config.Config) (*gpu.System, *driver.Inventory, error) {
	sys, inv, _, _, err := loadHost(cfg, false)
	return sys, inv, err
}

// loadHost returns the GPUs and the driver inventory for cfg: from the
// cache in cfg.Runtime.CacheDir when it matches the running driver,
// otherwise by discovery (then written to the cache for the next
// container). Without a driver version file (no kernel driver, or a driver
// root that does not carry one) nothing is cached: there would be no way to
// notice an upgrade. The sources say where each came from.
//
// fullGPUs asks for the full GPU discovery (brand, architecture: NVML),
// which the cache never holds: the GPUs are then discovered every time and
// not cached, the driver inventory still is.
func loadHost(cfg config.Config, fullGPUs bool) (sys *gpu.System, inv *driver.Inventory, gpuSrc, invSrc inventorySource, err error) {
	version, _, err := driver.CurrentVersion(cfg.DriverRoot)
	if err != nil {
		return nil, nil, "", "", err
	}
	discoverGPUs := func() error {
		sys, err = discover.GPUs(cfg, !fullGPUs)
		gpuSrc = fromDiscover
		return err
	}
	if cfg.Runtime.CacheDir == "" || version == "" {
		if err := discoverGPUs(); err != nil {
			return nil, nil, "", "", err
		}
		inv, err = discover.Driver(cfg)
		return sys, inv, gpuSrc, fromDiscover, err
	}
	key := cacheKey{
		Format:      cacheFormat,
		DriverRoot:  cfg.DriverRoot,
		DevRoot:     cfg.EffectiveDevRoot(),
		SearchPaths: cfg.LibrarySearchPaths,
		Version:     version,
		LDCache:     fileStamp(filepath.Join(cfg.DriverRoot, "etc/ld.so.cache")),
		Nodes:       driver.Stamp(cfg.DriverRoot, cfg.EffectiveDevRoot()),
	}
	gkey := ""
	if !fullGPUs {
		gkey = gpuKey(cfg, "/proc")
	}
	path := cachePath(cfg.Runtime.CacheDir, key)
	c := readCache(path, key)
	if c != nil && gkey != "" && c.GPUKey == gkey && c.GPUs != nil {
		return c.GPUs, c.Inventory, fromCache, fromCache, nil
	}
	if err := discoverGPUs(); err != nil {
		return nil, nil, "", "", err
	}
	invSrc = fromCache
	stale := false
	if c == nil {
		if inv, err = discover.Driver(cfg); err != nil {
			return nil, nil, "", "", err
		}
		c = &cacheFile{Key: key, Inventory: inv}
		invSrc, stale = fromDiscover, true
	}
	if gkey != "" {
		c.GPUKey, c.GPUs = gkey, sys
		stale = true
	}
	// Written only when it changed (a host whose GPUs are never cached,
	// simulated or with MIG instances, rewrote the same file on every
	// create). A cache that cannot be written costs speed, not correctness.
	if stale {
		_ = writeInventoryCache(path, *c)
	}
	return sys, c.Inventory, gpuSrc, invSrc, nil
}

// gpuKey names the driver's current set of GPUs for the cache: the PCI
// addresses under PROC/driver/nvidia/gpus. It is empty, meaning "do not
// cache", for simulated GPUs and whenever a GPU has MIG instances (they
// change without the GPU set changing, and need NVML anyway).
func gpuKey(cfg config.Config, proc string) string {
	if cfg.GPUs != "nvml" {
		return ""
	}
	base := filepath.Join(proc, "driver", "nvidia")
	gpus, err := os.ReadDir(filepath.Join(base, "gpus"))
	if err != nil || len(gpus) == 0 {
		return ""
	}
	caps, _ := os.ReadDir(filepath.Join(base, "capabilities"))
	for _, c := range caps {
		if !strings.HasPrefix(c.Name(), "gpu") {
			continue
		}
		mig, _ := os.ReadDir(filepath.Join(base, "capabilities", c.Name(), "mig"))
		for _, m := range mig {
			if strings.HasPrefix(m.Name(), "gi") {
				return ""
			}
		}
	}
	names := make([]string, len(gpus))
	for i, g := range gpus {
		names[i] = g.Name()
	}
	return strings.Join(names, ",")
}

// CacheGlob matches the inventory cache files in runtime.cache-dir.
const CacheGlob = "inventory-*.bin"

// cachePath names the cache file after the driver location, so hosts that
// switch driver roots (a driver container) keep one file per root.
func cachePath(dir string, k cacheKey) string {
	h := sha256.Sum256([]byte(k.DriverRoot + "\x00" + k.DevRoot + "\x00" + strings.Join(k.SearchPaths, "\x00")))
	return filepath.Join(dir, "inventory-"+hex.EncodeToString(h[:6])+".bin")
}

func fileStamp(p string) string {
	st, err := os.Stat(p)
	if err != nil {
		return "absent"
	}
	return fmt.Sprintf("%d@%d", st.Size(), st.ModTime().UnixNano())
}

// readCache returns the cached inventory if the file is ours (owned by this
// user, not writable by others: its paths are bind-mounted into containers)
// and its key matches; nil otherwise (absent, corrupt, another format).
func readCache(path string, key cacheKey) *cacheFile {
	b := readCacheBytes(path)
	if b == nil {
		return nil
	}
	c, err := decodeCache(b)
	if err != nil || c.Inventory == nil || !sameKey(c.Key, key) {
		return nil
	}
	return c
}

// readCacheBytes is the content of the cache file p if it is ours
// (openCache), nil otherwise.
func readCacheBytes(p string) []byte {
	f := openCache(p)
	if f == nil {
		return nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	// One read of the size fstat gave, and one more to see the end.
	b := make([]byte, st.Size()+1)
	n, err := io.ReadFull(f, b)
	if err != io.ErrUnexpectedEOF || int64(n) != st.Size() {
		return nil
	}
	return b[:n]
}

// CacheStamp says what an inventory cache file (CacheGlob) was made for,
// for gantry doctor.
type CacheStamp struct {
	DriverRoot, Version string
}

// ReadCacheStamp reads the key of the inventory cache file p.
func ReadCacheStamp(p string) (CacheStamp, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return CacheStamp{}, err
	}
	d := &decoder{s: string(b)}
	k := decodeKey(d)
	if d.err != nil {
		return CacheStamp{}, fmt.Errorf("%s: %w", p, d.err)
	}
	if k.Format != cacheFormat {
		return CacheStamp{}, fmt.Errorf("%s: cache format %d, this gantry writes %d", p, k.Format, cacheFormat)
	}
	return CacheStamp{DriverRoot: k.DriverRoot, Version: k.Version}, nil
}

func sameKey(a, b cacheKey) bool {
	if a.Format != b.Format || a.DriverRoot != b.DriverRoot || a.DevRoot != b.DevRoot ||
		a.Version != b.Version || a.LDCache != b.LDCache || a.Nodes != b.Nodes || len(a.SearchPaths) != len(b.SearchPaths) {
		return false
	}
	for i := range a.SearchPaths {
		if a.SearchPaths[i] != b.SearchPaths[i] {
			return false
		}
	}
	return true
}

// maxCacheSize bounds what openCache accepts: an inventory or a tree's
// file list is a few tens of KiB.
const maxCacheSize = 4 << 20

// openCache opens the cache file p if it is ours: a regular file owned by
// this user, not writable by others (its paths become mounts), of at most
// maxCacheSize bytes. Nil otherwise.
func openCache(p string) *os.File {
	f, err := os.Open(p)
	if err != nil {
		return nil
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o022 != 0 || st.Size() > maxCacheSize {
		f.Close()
		return nil
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || int(sys.Uid) != os.Geteuid() {
		f.Close()
		return nil
	}
	return f
}

// writeInventoryCache writes c (encodeCache) to path through a temporary
// file and a rename, so concurrent creates never read half a file.
func writeInventoryCache(path string, c cacheFile) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, encodeCache(c), atomicfile.Options{Mode: 0o600})
}

// writeTreeCache writes c (encodeTree) to path, as writeInventoryCache.
func writeTreeCache(path string, c *treeCache) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, encodeTree(c), atomicfile.Options{Mode: 0o600})
}
