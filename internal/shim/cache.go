package shim

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/driver"
)

// cacheFormat changes whenever driver.Inventory's meaning changes, so a new
// gantry never trusts an old gantry's cache.
const cacheFormat = 1

// cacheKey is what a cached inventory is valid for. The driver version is
// read from one small file per create; the loader cache's size and time
// catch libraries added or removed without a driver upgrade.
type cacheKey struct {
	Format      int      `json:"format"`
	DriverRoot  string   `json:"driverRoot"`
	DevRoot     string   `json:"devRoot"`
	SearchPaths []string `json:"searchPaths,omitempty"`
	Version     string   `json:"version"`
	LDCache     string   `json:"ldCache"`
}

type cacheFile struct {
	Key       cacheKey          `json:"key"`
	Inventory *driver.Inventory `json:"inventory"`
}

// inventorySource says where an inventory came from, for the log.
type inventorySource string

const (
	fromCache    inventorySource = "cache"
	fromDiscover inventorySource = "discovery"
)

// loadInventory returns the driver inventory for cfg: from the cache in
// cfg.Runtime.CacheDir when it matches the running driver, otherwise by
// discovery (then written to the cache for the next container). Without a
// driver version file (no kernel driver, or a driver root that does not
// carry one) nothing is cached: there would be no way to notice an upgrade.
func loadInventory(cfg config.Config) (*driver.Inventory, inventorySource, error) {
	version, _, err := driver.CurrentVersion(cfg.DriverRoot)
	if err != nil {
		return nil, "", err
	}
	if cfg.Runtime.CacheDir == "" || version == "" {
		inv, err := discover.Driver(cfg)
		return inv, fromDiscover, err
	}
	key := cacheKey{
		Format:      cacheFormat,
		DriverRoot:  cfg.DriverRoot,
		DevRoot:     cfg.EffectiveDevRoot(),
		SearchPaths: cfg.LibrarySearchPaths,
		Version:     version,
		LDCache:     fileStamp(filepath.Join(cfg.DriverRoot, "etc/ld.so.cache")),
	}
	path := cachePath(cfg.Runtime.CacheDir, key)
	if inv := readCache(path, key); inv != nil {
		return inv, fromCache, nil
	}
	inv, err := discover.Driver(cfg)
	if err != nil {
		return nil, "", err
	}
	// A cache that cannot be written costs speed, not correctness.
	_ = writeCache(path, cacheFile{Key: key, Inventory: inv})
	return inv, fromDiscover, nil
}

// cachePath names the cache file after the driver location, so hosts that
// switch driver roots (a driver container) keep one file per root.
func cachePath(dir string, k cacheKey) string {
	h := sha256.Sum256([]byte(k.DriverRoot + "\x00" + k.DevRoot + "\x00" + strings.Join(k.SearchPaths, "\x00")))
	return filepath.Join(dir, "inventory-"+hex.EncodeToString(h[:6])+".json")
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
// and its key matches; nil otherwise.
func readCache(path string, key cacheKey) *driver.Inventory {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o022 != 0 {
		return nil
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || int(sys.Uid) != os.Geteuid() {
		return nil
	}
	var c cacheFile
	if err := json.NewDecoder(f).Decode(&c); err != nil || c.Inventory == nil {
		return nil
	}
	if !sameKey(c.Key, key) {
		return nil
	}
	return c.Inventory
}

func sameKey(a, b cacheKey) bool {
	if a.Format != b.Format || a.DriverRoot != b.DriverRoot || a.DevRoot != b.DevRoot ||
		a.Version != b.Version || a.LDCache != b.LDCache || len(a.SearchPaths) != len(b.SearchPaths) {
		return false
	}
	for i := range a.SearchPaths {
		if a.SearchPaths[i] != b.SearchPaths[i] {
			return false
		}
	}
	return true
}

// writeCache writes c to path through a temporary file and a rename, so
// concurrent creates never read half a file.
func writeCache(path string, c cacheFile) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".inventory-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
