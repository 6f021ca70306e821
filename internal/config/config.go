// Package config reads Gantry's configuration file.
//
// One TOML file (default /etc/gantry/config.toml, or the path in GANTRY_CONFIG)
// holds the settings every Gantry binary shares. A missing file at the default
// path means "all defaults"; a file named explicitly must exist. Unknown keys are
// an error, so a typo never silently falls back to a default. Command-line flags
// override the file; Default documents every key and its default.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/pelletier/go-toml/v2"
)

// DefaultPath is where the configuration file lives unless GANTRY_CONFIG says otherwise.
const DefaultPath = "/etc/gantry/config.toml"

// EnvPath is the environment variable that overrides DefaultPath.
const EnvPath = "GANTRY_CONFIG"

// Config is the whole configuration file. The toml tags are the documented keys.
type Config struct {
	// GPUs selects the GPU backend: "nvml" (the real driver), "sim:PROFILE"
	// (a built-in simulated host such as sim:h100x8) or "sim:FILE" (a YAML file).
	GPUs string `toml:"gpus"`
	// DriverRoot is the directory the driver's files are installed under:
	// "/" for a host install, /run/nvidia/driver for a driver container,
	// /home/kubernetes/bin/nvidia on GKE.
	DriverRoot string `toml:"driver-root"`
	// DevRoot is where the driver's device nodes are (dev/nvidia*); empty
	// means the same as DriverRoot.
	DevRoot string `toml:"dev-root"`
	// LibrarySearchPaths are extra library directories (inside DriverRoot)
	// searched after the ld.so.cache and the standard directories.
	LibrarySearchPaths []string `toml:"library-search-paths"`
	// LogLevel is one of debug, info, warn, error.
	LogLevel string `toml:"log-level"`

	CDI CDI `toml:"cdi"`

	Runtime Runtime `toml:"runtime"`
}

// Runtime holds the settings of the container-create front ends:
// gantry-runtime (the runc shim), gantry-hook (the OCI prestart hook) and the
// nvidia-container-cli compatible entry point.
type Runtime struct {
	// LowLevel is the OCI runtime gantry-runtime execs: a name looked up in
	// PATH (skipping gantry itself) or an absolute path.
	LowLevel string `toml:"low-level"`
	// CacheDir holds the cached driver inventory, refreshed when the driver
	// version changes; empty disables the cache.
	CacheDir string `toml:"cache-dir"`
	// AcceptEnvUnprivileged honours NVIDIA_VISIBLE_DEVICES in containers without
	// CAP_SYS_ADMIN (NVIDIA's accept-nvidia-visible-devices-envvar-when-unprivileged).
	AcceptEnvUnprivileged bool `toml:"accept-env-unprivileged"`
	// AcceptVolumeMounts reads the device list from mounts under
	// /var/run/nvidia-container-devices (for the device plugin's volume-mount strategy).
	AcceptVolumeMounts bool `toml:"accept-volume-mounts"`
	// LogFile, when set, receives one line per container gantry-runtime or
	// gantry-hook handles (the engines swallow their stderr); empty = stderr only.
	LogFile string `toml:"log-file"`
	// DisableRequire skips every NVIDIA_REQUIRE_* check on this host, as
	// NVIDIA_DISABLE_REQUIRE=true does for one container (NVIDIA's disable-require).
	DisableRequire bool `toml:"disable-require"`
	// SwarmResource names env variables read instead of NVIDIA_VISIBLE_DEVICES
	// when one of them is set, e.g. DOCKER_RESOURCE_GPU for Docker Swarm's
	// generic resources (NVIDIA's swarm-resource).
	SwarmResource []string `toml:"swarm-resource"`
	// KubernetesEnv decides what NVIDIA_VISIBLE_DEVICES may give a container
	// a kubelet created through CRI (containerd, CRI-O). "allocated" (the
	// default): only the devices the kubelet allocated to that container,
	// read from its device checkpoint, so an image or pod that sets the
	// variable itself gets no GPU; privileged containers are trusted, as
	// everywhere, and so are kubelet plugins by construction (a writable
	// bind of KubeletDir's device-plugins/ or plugins_registry/, see
	// request.Options.KubeletPluginDir). "any": the variable as it stands
	// (NVIDIA's behaviour).
	KubernetesEnv string `toml:"kubernetes-env"`
	// KubeletDir is the kubelet's root directory; its device checkpoint is
	// device-plugins/kubelet_internal_checkpoint under it.
	KubeletDir string `toml:"kubelet-dir"`
	// ExclusiveGPUs refuses a container a GPU that another running pod
	// holds, by the kubelet's device checkpoint or a DRA plugin's prepared
	// claims under KubeletDir (package gpuholders); default true.
	ExclusiveGPUs bool `toml:"exclusive-gpus"`
	// DriverLayout is how a GPU container gets the driver's programs and
	// libraries: "tree" (the default), the files the container's
	// capabilities select gathered once per driver version and set of files
	// into a directory (laid out as nvidia-docker 1.0's driver volume) bound
	// read-only at DriverTreePath as one mount, with a link at each file's
	// usual path so images find every file where the per-file layout puts
	// it: fewer mounts for runc to make; "files", one read-only bind mount
	// per file, as NVIDIA's runtime does.
	DriverLayout string `toml:"driver-layout"`
	// DriverTreeDir holds the trees of the "tree" layout, below .sets/, one
	// per driver version and set of files; nvidia-docker-plugin's full
	// per-version trees (its volume directory, the default) are beside them.
	DriverTreeDir string `toml:"driver-tree-dir"`
	// DriverTreePath is where a container sees the tree.
	DriverTreePath string `toml:"driver-tree-path"`
	// NoCgroups leaves the containers' device cgroups alone, for rootless
	// Docker and Podman (NVIDIA's nvidia-container-cli.no-cgroups):
	// gantry-hook does not open the device cgroup for the nodes (as
	// --no-cgroups) and gantry-runtime adds no linux.resources.devices
	// rules; the nodes are still added to the container.
	NoCgroups bool `toml:"no-cgroups"`
	// GantryPath is the gantry binary gantry-runtime (built without NVML)
	// runs to ask NVML for the GPUs when /proc/driver/nvidia cannot answer
	// (MIG devices, or the driver's proc files not visible); empty means
	// the gantry beside gantry-runtime, else /usr/bin/gantry.
	GantryPath string `toml:"gantry-path"`
}

// DriverLayout values.
const (
	DriverLayoutFiles = "files"
	DriverLayoutTree  = "tree"
)

// KubernetesEnv values.
const (
	KubernetesEnvAllocated = "allocated"
	KubernetesEnvAny       = "any"
)

// CDI holds the settings of `gantry cdi`.
type CDI struct {
	// Kind is the CDI device kind (vendor/class) of the generated spec.
	Kind string `toml:"kind"`
	// SpecDirs are the directories CDI specs are read from, highest priority last.
	SpecDirs []string `toml:"spec-dirs"`
	// HookPath is the binary that the hooks of generated CDI specs run (for
	// SONAME symlinks and the ld.so.cache update); empty means the
	// gantry-cdi-hook beside the running gantry, else /usr/bin/gantry-cdi-hook.
	HookPath string `toml:"hook-path"`
	// AnnotationPrefixes are the container annotation key prefixes whose
	// values are CDI device names for gantry-runtime to inject.
	AnnotationPrefixes []string `toml:"annotation-prefixes"`
}

// Default returns the configuration used when no file is present.
func Default() Config {
	return Config{
		GPUs:       "nvml",
		DriverRoot: "/",
		LogLevel:   "warn",
		CDI: CDI{
			Kind:               "nvidia.com/gpu",
			SpecDirs:           []string{"/etc/cdi", "/var/run/cdi"},
			AnnotationPrefixes: []string{"cdi.k8s.io/"},
		},
		Runtime: Runtime{
			LowLevel:              "runc",
			CacheDir:              "/run/gantry",
			AcceptEnvUnprivileged: true,
			SwarmResource:         []string{},
			KubernetesEnv:         KubernetesEnvAllocated,
			KubeletDir:            "/var/lib/kubelet",
			ExclusiveGPUs:         true,
			DriverLayout:          DriverLayoutTree,
			DriverTreeDir:         "/var/lib/nvidia-docker/volumes/nvidia_driver",
			DriverTreePath:        "/usr/local/nvidia",
		},
	}
}

// Load reads the configuration from path; an empty path means GANTRY_CONFIG or
// DefaultPath. It returns the path actually used ("" when defaults were used
// because the default file does not exist).
func Load(path string) (Config, string, error) {
	explicit := path != ""
	if path == "" {
		if p := os.Getenv(EnvPath); p != "" {
			path, explicit = p, true
		} else {
			path = DefaultPath
		}
	}
	c, found, err := loadFile(path, explicit)
	if err == nil && !found {
		path = ""
	}
	return c, path, err
}

// LoadFile reads the configuration at path: Load once the path is known.
// A missing file is the defaults unless the path was named explicitly
// (the -config flag, $GANTRY_CONFIG), which is then an error.
func LoadFile(path string, explicit bool) (Config, error) {
	c, _, err := loadFile(path, explicit)
	return c, err
}

func loadFile(path string, explicit bool) (Config, bool, error) {
	b, err := readFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !explicit {
			return Default(), false, nil
		}
		return Config{}, true, fmt.Errorf("reading config %s: %w (fix the path, or unset %s to use defaults)", path, err, EnvPath)
	}
	c, err := Parse(b)
	if err != nil {
		return Config{}, true, fmt.Errorf("config %s: %w", path, err)
	}
	return c, true, nil
}

// MaxFileSize bounds the configuration file. Real ones are a few hundred
// bytes; the bound keeps a path such as /dev/zero, or a huge file, from
// costing memory in every program that reads the configuration.
const MaxFileSize = 1 << 20

// readFile reads a configuration file that must be a regular file of at
// most MaxFileSize bytes. It opens without blocking, so a FIFO in its place
// is refused instead of hanging the caller.
func readFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if isDevNull(st) {
		// GANTRY_CONFIG=/dev/null: the defaults, an idiom worth keeping.
		return nil, nil
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s)", st.Mode().Type())
	}
	if st.Size() > MaxFileSize {
		return nil, fmt.Errorf("%d bytes, over the %d-byte limit for a configuration file", st.Size(), MaxFileSize)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFileSize {
		return nil, fmt.Errorf("over the %d-byte limit for a configuration file", MaxFileSize)
	}
	return b, nil
}

// isDevNull says whether st is the null device (character device 1:3).
func isDevNull(st os.FileInfo) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && st.Mode()&os.ModeCharDevice != 0 && sys.Rdev == 1<<8|3
}

// Parse decodes a configuration file over the defaults and validates it.
func Parse(b []byte) (Config, error) {
	c := Default()
	dec := toml.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		var sm *toml.StrictMissingError
		if errors.As(err, &sm) {
			var keys []string
			for _, e := range sm.Errors {
				keys = append(keys, strings.Join(e.Key(), "."))
			}
			return Config{}, fmt.Errorf("unknown key %s: see `gantry config default` for every key", strings.Join(keys, ", "))
		}
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return Config{}, fmt.Errorf("line %d, column %d: %s", row, col, de.Error())
		}
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate checks the values that have a fixed set of choices.
func (c Config) Validate() error {
	if err := ValidateGPUs(c.GPUs); err != nil {
		return fmt.Errorf("key gpus: %w", err)
	}
	if c.DriverRoot == "" || !strings.HasPrefix(c.DriverRoot, "/") {
		return fmt.Errorf("key driver-root: %q is not an absolute path (e.g. \"/\" or \"/run/nvidia/driver\")", c.DriverRoot)
	}
	if c.DevRoot != "" && !strings.HasPrefix(c.DevRoot, "/") {
		return fmt.Errorf("key dev-root: %q is not an absolute path", c.DevRoot)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("key log-level: %q is not one of debug, info, warn, error", c.LogLevel)
	}
	if strings.Count(c.CDI.Kind, "/") != 1 {
		return fmt.Errorf("key cdi.kind: %q is not of the form vendor.com/class (e.g. nvidia.com/gpu)", c.CDI.Kind)
	}
	if c.Runtime.LowLevel == "" {
		return fmt.Errorf("key runtime.low-level: empty (use runc, crun or an absolute path)")
	}
	if c.Runtime.CacheDir != "" && !strings.HasPrefix(c.Runtime.CacheDir, "/") {
		return fmt.Errorf("key runtime.cache-dir: %q is not an absolute path (or \"\" to disable the cache)", c.Runtime.CacheDir)
	}
	switch c.Runtime.KubernetesEnv {
	case KubernetesEnvAllocated, KubernetesEnvAny:
	default:
		return fmt.Errorf("key runtime.kubernetes-env: %q is not one of %q (only what the kubelet allocated) or %q (NVIDIA's behaviour)",
			c.Runtime.KubernetesEnv, KubernetesEnvAllocated, KubernetesEnvAny)
	}
	if !strings.HasPrefix(c.Runtime.KubeletDir, "/") {
		return fmt.Errorf("key runtime.kubelet-dir: %q is not an absolute path (the kubelet's --root-dir, default /var/lib/kubelet)", c.Runtime.KubeletDir)
	}
	switch c.Runtime.DriverLayout {
	case DriverLayoutFiles, DriverLayoutTree:
	default:
		return fmt.Errorf("key runtime.driver-layout: %q is not one of %q (one mount of a tree of the container's driver files, the default) or %q (a mount per driver file)",
			c.Runtime.DriverLayout, DriverLayoutTree, DriverLayoutFiles)
	}
	for _, k := range [][2]string{{"driver-tree-dir", c.Runtime.DriverTreeDir}, {"driver-tree-path", c.Runtime.DriverTreePath}} {
		if !strings.HasPrefix(k[1], "/") || path.Clean(k[1]) == "/" {
			return fmt.Errorf("key runtime.%s: %q is not an absolute path below / (defaults: driver-tree-dir /var/lib/nvidia-docker/volumes/nvidia_driver, driver-tree-path /usr/local/nvidia)", k[0], k[1])
		}
	}
	if c.Runtime.LogFile != "" && !strings.HasPrefix(c.Runtime.LogFile, "/") {
		return fmt.Errorf("key runtime.log-file: %q is not an absolute path", c.Runtime.LogFile)
	}
	for _, v := range c.Runtime.SwarmResource {
		if !envName(v) {
			return fmt.Errorf("key runtime.swarm-resource: %q is not an environment variable name (e.g. [\"DOCKER_RESOURCE_GPU\"])", v)
		}
	}
	for _, p := range c.CDI.AnnotationPrefixes {
		if p == "" || strings.ContainsAny(p, " \t=") {
			return fmt.Errorf("key cdi.annotation-prefixes: %q is not an annotation key prefix (e.g. [\"cdi.k8s.io/\"])", p)
		}
	}
	return nil
}

// envName reports whether s is a portable environment variable name.
func envName(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// ValidateGPUs checks a --gpus / gpus value.
func ValidateGPUs(s string) error {
	if s == "nvml" {
		return nil
	}
	if rest, ok := strings.CutPrefix(s, "sim:"); ok && rest != "" {
		return nil
	}
	return fmt.Errorf("%q is not a GPU backend: use nvml, sim:PROFILE (e.g. sim:h100x8) or sim:FILE", s)
}

// EffectiveDevRoot is DevRoot, or DriverRoot when DevRoot is empty.
func (c Config) EffectiveDevRoot() string {
	if c.DevRoot != "" {
		return c.DevRoot
	}
	return c.DriverRoot
}

// Encode renders the configuration as a documented TOML file.
func (c Config) Encode() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(header)
	enc := toml.NewEncoder(&buf)
	enc.SetIndentTables(true)
	if err := enc.Encode(c); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

const header = `# Gantry configuration (/etc/gantry/config.toml, or the path in GANTRY_CONFIG).
# Flags given on the command line override these values.
#
# gpus                 nvml | sim:PROFILE (sim:h100x1, sim:h100x8, sim:h200x8, sim:l40sx8, sim:a100x2-mig) | sim:FILE
# driver-root          where the driver is installed: / , /run/nvidia/driver, /usr/local/nvidia's parent, ...
# dev-root             where dev/nvidia* are; empty = driver-root
# library-search-paths extra library directories inside driver-root
# log-level            debug | info | warn | error
# cdi.kind             CDI kind of generated specs
# cdi.spec-dirs        directories CDI specs are read from
# cdi.hook-path        binary CDI hooks run; empty = gantry-cdi-hook beside gantry, else /usr/bin's
# cdi.annotation-prefixes  annotation key prefixes whose values are CDI device names
# runtime.low-level    OCI runtime gantry-runtime execs: runc, crun or an absolute path
# runtime.cache-dir    cached driver inventory (refreshed on driver change); "" = no cache
# runtime.accept-env-unprivileged  honour NVIDIA_VISIBLE_DEVICES without CAP_SYS_ADMIN
# runtime.accept-volume-mounts     read devices from /var/run/nvidia-container-devices mounts
# runtime.log-file     one line per handled container; "" = stderr only
# runtime.disable-require  skip every NVIDIA_REQUIRE_* check on this host
# runtime.swarm-resource   env variables read instead of NVIDIA_VISIBLE_DEVICES (Docker Swarm)
# runtime.kubernetes-env   allocated (a kubelet's containers get only the GPUs it allocated) | any (NVIDIA's behaviour)
# runtime.kubelet-dir      the kubelet's root directory (its device checkpoint)
# runtime.driver-layout    tree (one mount of a tree of the container's driver files, built once per
#                          driver version and set of files, and a link at each file's usual path) |
#                          files (a read-only mount per driver file, NVIDIA's way)
# runtime.driver-tree-dir  where the trees are kept (in .sets/, beside nvidia-docker-plugin's volumes)
# runtime.driver-tree-path where a container sees the tree
# runtime.no-cgroups       true for rootless Docker/Podman: no device cgroup rules (NVIDIA's nvidia-container-cli.no-cgroups)
# runtime.gantry-path      the gantry binary gantry-runtime asks for NVML's GPUs (MIG); empty = gantry beside it, else /usr/bin's

`
