package dockervol

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/drivervol"
	"github.com/gantry-gpu/gantry/internal/unixsock"
)

// Names Docker and the original's users know.
const (
	// PluginName is the volume driver's name (--volume-driver=nvidia-docker).
	PluginName = "nvidia-docker"
	// DefaultSocketDir is where Docker looks for plugin sockets.
	DefaultSocketDir = "/run/docker/plugins"
	// SocketName is the socket's file name in that directory.
	SocketName = PluginName + ".sock"
	// DriverVolume is the one volume, named DriverVolume_<driver version>.
	DriverVolume = "nvidia_driver"
	// Mountpoint is where the volume goes in a container.
	Mountpoint = "/usr/local/nvidia"
	// DefaultVolumesDir is where the original kept its volumes; the trees
	// of nvidia_driver are in its subdirectory nvidia_driver.
	DefaultVolumesDir = "/var/lib/nvidia-docker/volumes"
)

// VolumeName is the volume of a driver version: nvidia_driver_580.159.04.
func VolumeName(version string) string { return DriverVolume + "_" + version }

// DockerVolume is the --volume value for a driver version:
// nvidia_driver_<version>:/usr/local/nvidia:ro.
func DockerVolume(version string) string { return VolumeName(version) + ":" + Mountpoint + ":ro" }

// Errors answered in Err, each followed by ": <volume name>".
var (
	ErrBadFormat   = errors.New("bad volume format")
	ErrUnsupported = errors.New("unsupported volume")
	ErrNotFound    = errors.New("no such volume")
	ErrVersion     = errors.New("invalid volume version")
)

// Options say what the plugin serves.
type Options struct {
	// Store holds the trees (the volumes directory's nvidia_driver).
	Store drivervol.Store
	// Driver is this host's driver: Create builds its version's tree.
	Driver *driver.Inventory
	// DockerCLI, when set, also answers GET DockerCLIPath on the socket:
	// the REST API's handler (package legacyapi), for the nvidia-docker
	// wrapper, which takes docker run arguments from this root-owned socket
	// only, never from a TCP port another user could listen on first.
	DockerCLI http.Handler
	Logger    *slog.Logger
}

// DockerCLIPath is the REST API endpoint the socket also answers (Options.DockerCLI).
const DockerCLIPath = "/docker/cli/json"

// Server answers the volume plugin protocol.
type Server struct {
	opts Options
	mux  *http.ServeMux
}

// New makes a Server.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Server{opts: opts, mux: http.NewServeMux()}
	s.mux.HandleFunc("/Plugin.Activate", func(w http.ResponseWriter, r *http.Request) {
		reply(w, struct{ Implements []string }{[]string{"VolumeDriver"}})
	})
	for name, h := range map[string]func(request) any{
		"Create": s.create, "Remove": s.remove, "Mount": s.mount, "Path": s.path,
		"Unmount": s.unmount, "Get": s.get, "List": s.list, "Capabilities": s.capabilities,
	} {
		s.mux.HandleFunc("/VolumeDriver."+name, func(w http.ResponseWriter, r *http.Request) {
			var q request
			body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
			if err == nil && len(strings.TrimSpace(string(body))) > 0 {
				err = json.Unmarshal(body, &q)
			}
			if err != nil {
				http.Error(w, fmt.Sprintf("VolumeDriver.%s: reading the request: %v", name, err), http.StatusBadRequest)
				return
			}
			resp := h(q)
			s.opts.Logger.Info("volume plugin", "call", name, "volume", q.Name, "reply", fmt.Sprintf("%+v", resp))
			reply(w, resp)
		})
	}
	return s
}

// ServeHTTP takes POST requests of the plugin media types only, and GET
// DockerCLIPath when Options.DockerCLI is set.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.opts.DockerCLI != nil && r.URL.Path == DockerCLIPath {
		s.opts.DockerCLI.ServeHTTP(w, r)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "the Docker plugin protocol uses POST", http.StatusMethodNotAllowed)
		return
	}
	if a := r.Header.Get("Accept"); a != "" && !acceptable(a) {
		http.Error(w, "unsupported plugin API "+a+": this plugin speaks application/vnd.docker.plugins.v1.2+json", http.StatusNotAcceptable)
		return
	}
	s.mux.ServeHTTP(w, r)
}

var mediaType = regexp.MustCompile(`^application/vnd\.docker\.plugins\.v1(\.[0-9]+)?\+json$`)

func acceptable(accept string) bool {
	for _, a := range strings.Split(accept, ",") {
		a, _, _ = strings.Cut(a, ";")
		if a = strings.TrimSpace(a); mediaType.MatchString(a) || a == "*/*" || a == "application/json" {
			return true
		}
	}
	return false
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/vnd.docker.plugins.v1+json")
	json.NewEncoder(w).Encode(v)
}

// request is every VolumeDriver call's body (Name, and ID for Mount and
// Unmount; Opts for Create, which takes none).
type request struct {
	Name string
	ID   string            `json:",omitempty"`
	Opts map[string]string `json:",omitempty"`
}

type errReply struct{ Err string }

type mountReply struct {
	Mountpoint string `json:",omitempty"`
	Err        string
}

// Volume is one volume in Get and List.
type Volume struct {
	Name, Mountpoint string
}

type getReply struct {
	Volume *Volume `json:",omitempty"`
	Err    string
}

type listReply struct {
	Volumes []Volume
	Err     string
}

var volumeName = regexp.MustCompile(`^([a-zA-Z0-9_.-]+)_([0-9.]+)$`)

// parse splits a volume name into its driver version.
func parse(name string) (string, error) {
	m := volumeName.FindStringSubmatch(name)
	if m == nil {
		return "", fmt.Errorf("%w: %s (the volume is %s_<driver version>)", ErrBadFormat, name, DriverVolume)
	}
	if m[1] != DriverVolume {
		return "", fmt.Errorf("%w: %s (the only volume is %s_<driver version>)", ErrUnsupported, name, DriverVolume)
	}
	if !driver.IsVersion(m[2]) {
		return "", fmt.Errorf("%w: %s", ErrBadFormat, name)
	}
	return m[2], nil
}

func (s *Server) current() string {
	if s.opts.Driver == nil {
		return ""
	}
	return s.opts.Driver.Version
}

func (s *Server) create(q request) any {
	v, err := parse(q.Name)
	if err != nil {
		return errReply{err.Error()}
	}
	if v != s.current() {
		return errReply{fmt.Sprintf("%v: %s (this host's driver is %s: use %s)", ErrVersion, q.Name, s.current(), VolumeName(s.current()))}
	}
	if _, err := s.opts.Store.Serve(s.opts.Driver); err != nil {
		return errReply{fmt.Sprintf("creating %s: %v", q.Name, err)}
	}
	return errReply{}
}

func (s *Server) remove(q request) any {
	v, err := parse(q.Name)
	if err != nil {
		return errReply{err.Error()}
	}
	if err := s.opts.Store.Remove(v); err != nil && !errors.Is(err, drivervol.ErrNotFound) {
		return errReply{fmt.Sprintf("removing %s: %v", q.Name, err)}
	}
	return errReply{}
}

// lookup returns the tree's path; with serve, once it is a read-only mount
// there (drivervol's Protect), this host's version built again when it is
// missing (Serve: never at the path without that mount).
func (s *Server) lookup(name string, serve bool) (string, error) {
	v, err := parse(name)
	if err != nil {
		return "", err
	}
	var t *drivervol.Tree
	switch {
	case serve && v == s.current():
		t, err = s.opts.Store.Serve(s.opts.Driver)
	case serve:
		if err = s.opts.Store.Protect(v); err == nil {
			t, err = s.opts.Store.Load(v)
		}
	default:
		t, err = s.opts.Store.Load(v)
	}
	if errors.Is(err, drivervol.ErrNotFound) {
		return "", fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return "", fmt.Errorf("%s: %v", name, err)
	}
	return t.Path, nil
}

// mount answers the tree's directory once it is a read-only mount
// (drivervol's Protect): Docker's bind of it is then read-only whatever
// the user's -v said, and no container can write through the tree's hard
// links to the host's driver files.
func (s *Server) mount(q request) any {
	p, err := s.lookup(q.Name, true)
	if err != nil {
		return mountReply{Err: err.Error()}
	}
	return mountReply{Mountpoint: p}
}

func (s *Server) path(q request) any {
	p, err := s.lookup(q.Name, false)
	if err != nil {
		return mountReply{Err: err.Error()}
	}
	return mountReply{Mountpoint: p}
}

func (s *Server) unmount(q request) any {
	if _, err := parse(q.Name); err != nil {
		return errReply{err.Error()}
	}
	return errReply{}
}

func (s *Server) get(q request) any {
	p, err := s.lookup(q.Name, false)
	if err != nil {
		return getReply{Err: err.Error()}
	}
	return getReply{Volume: &Volume{Name: q.Name, Mountpoint: p}}
}

func (s *Server) list(request) any {
	vs, err := s.opts.Store.Versions()
	if err != nil {
		return listReply{Volumes: []Volume{}, Err: err.Error()}
	}
	r := listReply{Volumes: []Volume{}}
	for _, v := range vs {
		r.Volumes = append(r.Volumes, Volume{Name: VolumeName(v), Mountpoint: s.opts.Store.Path(v)})
	}
	return r
}

func (s *Server) capabilities(request) any {
	type caps struct{ Scope string }
	return struct{ Capabilities caps }{caps{Scope: "local"}}
}

// Listen makes the plugin's socket, dir/nvidia-docker.sock, creating dir
// (0700, as Docker's own) when missing. A socket left by a plugin that is
// gone is replaced; one that answers is not.
func Listen(dir string) (net.Listener, error) {
	p := filepath.Join(dir, SocketName)
	ln, err := unixsock.Listen(p, 0o700, "plugin")
	if err != nil {
		return nil, err
	}
	return ln, nil
}

// NewHTTPServer is the server for the socket: building a tree may take a
// while (copies across filesystems), so only reading a request is bounded.
func NewHTTPServer(s *Server) *http.Server {
	return &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
}
