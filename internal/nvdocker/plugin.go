package nvdocker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/config"
)

// Plugin is where the wrapper looks for nvidia-docker-plugin.
type Plugin struct {
	// Socket is the volume plugin's socket. gantry serve --volume-plugin
	// answers the REST API's /docker/cli/json there too, and that is the
	// only place the wrapper takes docker run arguments from: a unix socket
	// whose file and directory root owns and whose listener runs as root.
	// Never a TCP port: any local user may listen on localhost:3476 first
	// ([::1] when the API holds 127.0.0.1, either when it was started with
	// another --listen) and answer --privileged -v /:/host.
	Socket string
	// DevRoots are the directories besides / whose dev/nvidia* nodes the
	// plugin may name as a --device's host path (a driver container's
	// root); nil is DefaultDevRoots().
	DevRoots []string
}

// DefaultPlugin is where nvidia-docker-plugin serves (gantry serve
// --volume-plugin's default socket).
var DefaultPlugin = Plugin{Socket: "/run/docker/plugins/nvidia-docker.sock"}

// DefaultDevRoots are the dev roots a plugin may name besides /: the
// GPU operator's driver container root, /run/nvidia/driver, and the dev
// root Gantry's configuration names (gantry serve's).
func DefaultDevRoots() []string {
	roots := []string{"/run/nvidia/driver"}
	if cfg, _, err := config.Load(""); err == nil {
		if r := cfg.EffectiveDevRoot(); filepath.IsAbs(r) && filepath.Clean(r) != "/" {
			roots = append(roots, filepath.Clean(r))
		}
	}
	return roots
}

func (p Plugin) devRoots() []string {
	if p.DevRoots != nil {
		return p.DevRoots
	}
	return DefaultDevRoots()
}

// APIError says that the plugin runs but could not give arguments that can
// be used (an older plugin without /docker/cli/json on its socket, a socket
// not root's): the wrapper warns and uses the runtime instead.
type APIError struct{ Err error }

func (e *APIError) Error() string { return e.Err.Error() }
func (e *APIError) Unwrap() error { return e.Err }

const pluginTimeout = 10 * time.Second

// trusted checks that only root could have made the socket at p: the file
// is a socket owned by root that no one else may write to, and each
// directory above it is root's and writable by no one else (else another
// user could put a socket of their own there).
func trusted(p string) error {
	st, err := os.Lstat(p)
	if err != nil {
		return err
	}
	sys := st.Sys().(*syscall.Stat_t)
	if st.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s is not a socket", p)
	}
	if sys.Uid != 0 || st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is owned by uid %d with mode %v: only a socket of root's that no one else may write to is trusted", p, sys.Uid, st.Mode().Perm())
	}
	if err := rootsDirs(filepath.Dir(p)); err != nil {
		return fmt.Errorf("%w: another user could put a socket at %s", err, p)
	}
	return nil
}

// rootsDirs checks that root owns dir and every directory above it, with
// links resolved (the walk follows the real parents, not the names), and
// that no one else may write to them but to sticky ones.
func rootsDirs(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	for d := real; ; d = filepath.Dir(d) {
		st, err := os.Lstat(d)
		if err != nil {
			return err
		}
		sys := st.Sys().(*syscall.Stat_t)
		if !st.IsDir() || sys.Uid != 0 || st.Mode().Perm()&0o022 != 0 && st.Mode()&os.ModeSticky == 0 {
			return fmt.Errorf("the directory %s (of %s) is owned by uid %d with mode %v", d, dir, sys.Uid, st.Mode())
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

// dialRoot connects to the socket and checks that its listener runs as
// root (SO_PEERCRED: the credentials of whoever called listen).
func dialRoot(ctx context.Context, p string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", p)
	if err != nil {
		return nil, err
	}
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		credErr = err
	}
	if credErr != nil {
		c.Close()
		return nil, fmt.Errorf("reading the credentials of %s's server: %w", p, credErr)
	}
	if cred.Uid != 0 {
		c.Close()
		return nil, fmt.Errorf("the server on %s runs as uid %d, not root", p, cred.Uid)
	}
	return c, nil
}

func (p Plugin) client(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialRoot(ctx, p.Socket)
		},
	}}
}

// running reports whether a volume plugin answers on the socket; false
// where the socket is missing or the caller may not connect (it is root's,
// mode 0600: only root uses the plugin).
func (p Plugin) running() (bool, error) {
	if _, err := os.Lstat(p.Socket); err != nil {
		// No plugin, or one the caller may not see (a directory of root's
		// mode 0700): not ours to use.
		return false, nil
	}
	if err := trusted(p.Socket); err != nil {
		return false, &APIError{fmt.Errorf("not using nvidia-docker-plugin: %w", err)}
	}
	req, _ := http.NewRequest(http.MethodPost, "http://plugin/Plugin.Activate", strings.NewReader("{}"))
	req.Header.Set("Accept", "application/vnd.docker.plugins.v1.2+json")
	resp, err := p.client(2 * time.Second).Do(req)
	if err != nil {
		if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return false, nil
		}
		return false, &APIError{fmt.Errorf("not using nvidia-docker-plugin: %w", err)}
	}
	defer resp.Body.Close()
	var act struct{ Implements []string }
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&act) != nil {
		return false, nil
	}
	return slices.Contains(act.Implements, "VolumeDriver"), nil
}

// Args returns the docker run arguments the plugin gives for gpus (NV_GPU's
// value; empty for all), or nil when no plugin runs. A plugin that cannot
// be asked, or one not root's, gives an *APIError; one that refuses the
// request (a GPU that does not exist) an error with its reason, as does an
// answer holding anything but the arguments a plugin gives (CheckArgs).
func (p Plugin) Args(gpus string) ([]string, error) {
	ok, err := p.running()
	if err != nil || !ok {
		return nil, err
	}
	ids := strings.FieldsFunc(gpus, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
	q := url.Values{"vol": {"nvidia_driver"}, "dev": {strings.Join(ids, " ")}}
	resp, err := p.client(pluginTimeout).Get("http://plugin/docker/cli/json?" + q.Encode())
	if err != nil {
		return nil, &APIError{fmt.Errorf("nvidia-docker-plugin answers on %s but not for /docker/cli/json: %v", p.Socket, err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, &APIError{fmt.Errorf("reading nvidia-docker-plugin's /docker/cli/json on %s: %v", p.Socket, err)}
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusBadRequest:
		return nil, fmt.Errorf("nvidia-docker-plugin: %s (NV_GPU=%q)", strings.TrimSpace(string(body)), gpus)
	default:
		// A plugin from before /docker/cli/json was served on its socket
		// answers the volume protocol's 405 or 404.
		return nil, &APIError{fmt.Errorf("nvidia-docker-plugin on %s does not answer /docker/cli/json (%s): restart it with this Gantry's gantry serve --volume-plugin", p.Socket, resp.Status)}
	}
	var a struct {
		VolumeDriver string
		Volumes      []string
		Devices      []string
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fmt.Errorf("nvidia-docker-plugin on %s: reading /docker/cli/json: %v", p.Socket, err)
	}
	var words []string
	if a.VolumeDriver != "" {
		words = append(words, "--volume-driver="+a.VolumeDriver)
	}
	for _, v := range a.Volumes {
		words = append(words, "--volume="+v)
	}
	for _, d := range a.Devices {
		words = append(words, "--device="+d)
	}
	if err := CheckArgs(words, p.devRoots()); err != nil {
		return nil, fmt.Errorf("nvidia-docker-plugin on %s: %w", p.Socket, err)
	}
	return words, nil
}

var (
	volumeArg = regexp.MustCompile(`^--volume=nvidia_driver_[0-9]{1,6}(\.[0-9]{1,6}){0,3}:/usr/local/nvidia:ro$`)
	// A device node: /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools,
	// /dev/nvidiaN, or HOST:CONTAINER with the host node under a dev root
	// (a driver container's /run/nvidia/driver/dev/nvidia0:/dev/nvidia0).
	deviceArg = regexp.MustCompile(`^--device=(?:(/[A-Za-z0-9._/-]*)?(/dev/nvidia(?:ctl|-uvm|-uvm-tools|[0-9]{1,3})):)?(/dev/nvidia(?:ctl|-uvm|-uvm-tools|[0-9]{1,3}))$`)
)

// CheckArgs accepts only the docker run arguments nvidia-docker-plugin
// gives: --volume-driver=nvidia-docker once,
// --volume=nvidia_driver_<version>:/usr/local/nvidia:ro once, and
// --device=/dev/nvidia<ctl|-uvm|-uvm-tools|N>, each node at most once,
// optionally from the same /dev/ name under one of devRoots (a driver
// container's root). Anything else (--privileged, -v /:/host, --pid=host,
// another device, a node under a directory another user controls) is an
// error naming it: the arguments go straight into docker run as its
// caller, and docker follows links in a host path and grants the device.
func CheckArgs(words []string, devRoots []string) error {
	var driver, volume int
	nodes := map[string]bool{}
	for _, w := range words {
		switch {
		case w == "--volume-driver=nvidia-docker":
			driver++
		case volumeArg.MatchString(w):
			volume++
		default:
			m := deviceArg.FindStringSubmatch(w)
			if m == nil || m[2] != "" && m[2] != m[3] || m[1] != "" && filepath.Clean(m[1]+m[2]) != m[1]+m[2] || nodes[m[3]] {
				return fmt.Errorf("refusing the argument %q: it is none the plugin gives (--volume-driver=nvidia-docker, --volume=nvidia_driver_<version>:/usr/local/nvidia:ro, --device=/dev/nvidia*); check what serves that socket", w)
			}
			host := m[3]
			if m[1] != "" {
				if !slices.Contains(devRoots, m[1]) {
					return fmt.Errorf("refusing the argument %q: the host node is under %s, not /dev nor a dev root Gantry is configured with (%s); check what serves that socket", w, m[1], strings.Join(devRoots, ", "))
				}
				host = m[1] + m[2]
			}
			if err := checkNode(host, m[1]); err != nil {
				return fmt.Errorf("refusing the argument %q: %w; check what serves that socket", w, err)
			}
			nodes[m[3]] = true
		}
	}
	if driver != 1 || volume != 1 || len(nodes) == 0 {
		return fmt.Errorf("refusing the arguments %q: want --volume-driver=nvidia-docker, one --volume=nvidia_driver_<version>:/usr/local/nvidia:ro and the --device flags", words)
	}
	return nil
}

// procDevices lists the kernel's device majors; tests replace it.
var procDevices = "/proc/devices"

// nvidiaMajor is the NVIDIA driver's character device major (nvidiactl, nvidiaN).
const nvidiaMajor = 195

// checkNode checks a --device host path: its directories root's alone (no
// one else can put a node or a link there), and when it exists (docker
// follows links) a character device of NVIDIA's: major 195, or for
// nvidia-uvm* the major /proc/devices gives nvidia-uvm: under a dev root
// (devRoot, one Gantry is configured with) the major its proc/devices gives
// when it has one (a driver container's, or `gantry sim driver-root`'s: its
// nodes carry the majors it lists), else the kernel's.
func checkNode(host, devRoot string) error {
	dir := filepath.Dir(host)
	for {
		if _, err := os.Lstat(dir); err == nil || dir == "/" {
			break
		}
		dir = filepath.Dir(dir) // a missing directory: its parent decides who may make it
	}
	if err := rootsDirs(dir); err != nil {
		return fmt.Errorf("the host node %s: %w: another user could put a node there", host, err)
	}
	st, err := os.Stat(host)
	if errors.Is(err, os.ErrNotExist) {
		return nil // docker says so
	}
	if err != nil {
		return err
	}
	want, name, devices := uint32(nvidiaMajor), "nvidia", procDevices
	if strings.HasPrefix(filepath.Base(host), "nvidia-uvm") {
		want, name = 0, "nvidia-uvm"
		if devRoot != "" {
			p := filepath.Join(devRoot, "proc/devices")
			if st, err := os.Lstat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o022 == 0 &&
				st.Sys().(*syscall.Stat_t).Uid == 0 && rootsDirs(filepath.Dir(p)) == nil {
				devices = p
			}
		}
		if b, err := os.ReadFile(devices); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				f := strings.Fields(l)
				if len(f) == 2 && f[1] == "nvidia-uvm" {
					if n, err := strconv.ParseUint(f[0], 10, 32); err == nil {
						want = uint32(n)
					}
				}
			}
		}
	}
	if st.Mode()&os.ModeCharDevice == 0 {
		return fmt.Errorf("the host node %s is not a character device (%v)", host, st.Mode().Type())
	}
	rdev := st.Sys().(*syscall.Stat_t).Rdev
	if got := unix.Major(rdev); want == 0 || got != want {
		return fmt.Errorf("the host node %s is the character device %d:%d, not one of the %s driver's (major %d in %s)", host, got, unix.Minor(rdev), name, want, devices)
	}
	return nil
}
