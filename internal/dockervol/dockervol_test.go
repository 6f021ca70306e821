package dockervol

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/drivervol"
	"github.com/gantry-gpu/gantry/internal/fakedriver"
)

func fakeDriver(t *testing.T, version string) *driver.Inventory {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: cannot build the fake driver root (make deps installs it)")
	}
	root := filepath.Join(t.TempDir(), "driver")
	if _, err := fakedriver.Build(root, fakedriver.Options{Version: version, Layout: fakedriver.LayoutGKE}); err != nil {
		t.Fatal(err)
	}
	inv, err := driver.Discover(driver.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// newStore is a store in a temporary directory whose trees (read-only
// mounts once a volume was created or mounted) are removed when the test
// ends, before the directory is.
func newStore(t *testing.T) drivervol.Store {
	t.Helper()
	s := drivervol.Store{Dir: filepath.Join(t.TempDir(), "volumes", DriverVolume)}
	t.Cleanup(func() {
		vs, _ := s.Versions()
		for _, v := range vs {
			if err := s.Remove(v); err != nil {
				t.Error(err)
			}
		}
	})
	return s
}

// needRoot skips tests that mount volumes (Create, Mount make the tree a
// read-only mount).
func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the plugin makes each volume a read-only mount")
	}
}

// plugin serves a plugin on dir's socket; stop shuts it down.
func plugin(t *testing.T, dir string, store drivervol.Store, inv *driver.Inventory) (stop func()) {
	t.Helper()
	ln, err := Listen(dir)
	if err != nil {
		t.Fatal(err)
	}
	hs := NewHTTPServer(New(Options{Store: store, Driver: inv}))
	done := make(chan struct{})
	go func() { hs.Serve(ln); close(done) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			hs.Shutdown(context.Background())
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// client speaks to the socket as Docker's plugin client does.
type client struct {
	t  *testing.T
	hc *http.Client
}

func newClient(t *testing.T, dir string) *client {
	sock := filepath.Join(dir, SocketName)
	return &client{t: t, hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}}
}

func (c *client) raw(method, call, accept string, body any) *http.Response {
	c.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, "http://plugin/"+call, bytes.NewReader(b))
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s: %v", call, err)
	}
	return resp
}

func (c *client) call(call string, body any, out any) {
	c.t.Helper()
	resp := c.raw("POST", call, "application/vnd.docker.plugins.v1.2+json", body)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		c.t.Fatalf("%s: status %d", call, resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/vnd.docker.plugins.v1+json" {
		c.t.Errorf("%s: Content-Type %q", call, ct)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		c.t.Fatalf("%s: %v", call, err)
	}
}

type name struct{ Name string }

type answer struct {
	Err        string
	Mountpoint string
	Volume     *Volume
	Volumes    []Volume
}

func (c *client) do(call, vol string) answer {
	c.t.Helper()
	var r answer
	c.call("VolumeDriver."+call, name{vol}, &r)
	return r
}

func TestProtocol(t *testing.T) {
	needRoot(t)
	const version = "580.159.04"
	inv := fakeDriver(t, version)
	dir := filepath.Join(t.TempDir(), "plugins")
	store := newStore(t)
	plugin(t, dir, store, inv)
	c := newClient(t, dir)

	var act struct{ Implements []string }
	c.call("Plugin.Activate", struct{}{}, &act)
	if len(act.Implements) != 1 || act.Implements[0] != "VolumeDriver" {
		t.Errorf("Activate: %+v", act)
	}
	var caps struct{ Capabilities struct{ Scope string } }
	c.call("VolumeDriver.Capabilities", struct{}{}, &caps)
	if caps.Capabilities.Scope != "local" {
		t.Errorf("Capabilities: %+v", caps)
	}
	if r := c.do("List", ""); r.Err != "" || r.Volumes == nil || len(r.Volumes) != 0 {
		t.Errorf("List before Create: %+v", r)
	}
	vol := VolumeName(version)
	if r := c.do("Get", vol); !strings.Contains(r.Err, "no such volume") {
		t.Errorf("Get before Create: %+v", r)
	}
	if r := c.do("Create", vol); r.Err != "" {
		t.Fatalf("Create: %s", r.Err)
	}
	want := filepath.Join(store.Dir, version)
	if r := c.do("List", ""); len(r.Volumes) != 1 || r.Volumes[0] != (Volume{vol, want}) {
		t.Errorf("List: %+v", r)
	}
	if r := c.do("Get", vol); r.Err != "" || r.Volume == nil || *r.Volume != (Volume{vol, want}) {
		t.Errorf("Get: %+v", r)
	}
	var m answer
	c.call("VolumeDriver.Mount", map[string]string{"Name": vol, "ID": "abc"}, &m)
	if m.Err != "" || m.Mountpoint != want {
		t.Errorf("Mount: %+v", m)
	}
	if _, err := os.Stat(filepath.Join(m.Mountpoint, "lib64", "libcuda.so.1")); err != nil {
		t.Errorf("mounted volume: %v", err)
	}
	if _, err := os.Stat(filepath.Join(m.Mountpoint, "bin", "nvidia-smi")); err != nil {
		t.Errorf("mounted volume: %v", err)
	}
	if err := os.WriteFile(filepath.Join(m.Mountpoint, "lib64", "x"), nil, 0o644); err == nil {
		t.Error("the mounted volume is writable")
	}
	if r := c.do("Path", vol); r.Mountpoint != want {
		t.Errorf("Path: %+v", r)
	}
	if r := c.do("Unmount", vol); r.Err != "" {
		t.Errorf("Unmount: %+v", r)
	}

	for _, bad := range []struct{ name, err string }{
		{"nvidia_driver_550.54.15", "invalid volume version: nvidia_driver_550.54.15 (this host's driver is 580.159.04"},
		{"other_1.2", "unsupported volume: other_1.2"},
		{"nvidia_driver", "bad volume format: nvidia_driver"},
		{"nvidia_driver_..", "bad volume format"},
		{"nvidia_driver_../../etc", "bad volume format"},
	} {
		if r := c.do("Create", bad.name); !strings.Contains(r.Err, bad.err) {
			t.Errorf("Create %s: %q, want %q", bad.name, r.Err, bad.err)
		}
		if r := c.do("Mount", bad.name); r.Err == "" || r.Mountpoint != "" {
			t.Errorf("Mount %s: %+v", bad.name, r)
		}
	}

	// Not the plugin protocol: wrong method, wrong media type.
	if resp := c.raw("GET", "VolumeDriver.List", "", nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", resp.StatusCode)
	}
	if resp := c.raw("POST", "VolumeDriver.List", "application/vnd.docker.plugins.v2+json", nil); resp.StatusCode != http.StatusNotAcceptable {
		t.Errorf("v2 media type: %d", resp.StatusCode)
	}

	// Remove deletes the tree; Mount of this host's version builds it again.
	if r := c.do("Remove", vol); r.Err != "" {
		t.Fatalf("Remove: %+v", r)
	}
	if r := c.do("List", ""); len(r.Volumes) != 0 {
		t.Errorf("List after Remove: %+v", r)
	}
	if r := c.do("Mount", vol); r.Err != "" || r.Mountpoint != want {
		t.Errorf("Mount after Remove: %+v", r)
	}
}

// TestRestartAndVersionChange: the volume outlives the plugin; a plugin
// started on a new driver makes a new volume and keeps the old one.
func TestRestartAndVersionChange(t *testing.T) {
	needRoot(t)
	inv1, inv2 := fakeDriver(t, "550.54.15"), fakeDriver(t, "580.159.04")
	dir := filepath.Join(t.TempDir(), "plugins")
	store := newStore(t)

	stop := plugin(t, dir, store, inv1)
	c := newClient(t, dir)
	v1, v2 := VolumeName("550.54.15"), VolumeName("580.159.04")
	if r := c.do("Create", v1); r.Err != "" {
		t.Fatal(r.Err)
	}
	before, _ := os.Stat(filepath.Join(store.Dir, "550.54.15", "lib64", "libcuda.so.550.54.15"))
	stop()
	if r, err := c.hc.Post("http://plugin/Plugin.Activate", "", nil); err == nil {
		r.Body.Close()
		t.Fatal("the stopped plugin still answers")
	}

	// The same driver after a restart: same volume, same files.
	stop = plugin(t, dir, store, inv1)
	if r := c.do("Get", v1); r.Err != "" || r.Volume.Mountpoint != filepath.Join(store.Dir, "550.54.15") {
		t.Errorf("Get after restart: %+v", r)
	}
	after, _ := os.Stat(filepath.Join(store.Dir, "550.54.15", "lib64", "libcuda.so.550.54.15"))
	if before == nil || after == nil || !os.SameFile(before, after) {
		t.Error("the volume was rebuilt by a restart")
	}
	stop()

	// A new driver.
	plugin(t, dir, store, inv2)
	if r := c.do("Create", v1); !strings.Contains(r.Err, "invalid volume version") {
		t.Errorf("Create of the old version on the new driver: %+v", r)
	}
	if r := c.do("Create", v2); r.Err != "" {
		t.Fatal(r.Err)
	}
	r := c.do("List", "")
	if len(r.Volumes) != 2 || r.Volumes[0].Name != v1 || r.Volumes[1].Name != v2 {
		t.Errorf("List: %+v", r)
	}
	if r := c.do("Mount", v1); r.Err != "" {
		t.Errorf("the old volume cannot be mounted: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(store.Dir, "580.159.04", "lib64", "libcuda.so.580.159.04")); err != nil {
		t.Error(err)
	}
}

func TestListenRefusesLivePlugin(t *testing.T) {
	dir := t.TempDir()
	store := drivervol.Store{Dir: t.TempDir()}
	plugin(t, dir, store, &driver.Inventory{Version: "580.159.04"})
	if ln, err := Listen(dir); err == nil {
		ln.Close()
		t.Fatal("a second plugin took the live socket")
	} else if !strings.Contains(err.Error(), "another plugin") {
		t.Errorf("error: %v", err)
	}
	// A stale socket (nobody listening) is replaced.
	stale := t.TempDir()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(stale, SocketName), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	ln, err := Listen(stale)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	ln.Close()
	// A file that is not a socket is left alone.
	notSock := t.TempDir()
	os.WriteFile(filepath.Join(notSock, SocketName), nil, 0o644)
	if _, err := Listen(notSock); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("regular file: %v", err)
	}
}

// TestSetTreesAreNoVolumes: the trees a runtime builds for sets of driver
// files (drivervol.EnsureSet, below .sets in the same directory) never show
// as volumes: List gives what it gave without them, and no volume name
// reaches them.
func TestSetTreesAreNoVolumes(t *testing.T) {
	needRoot(t)
	const version = "580.159.04"
	inv := fakeDriver(t, version)
	dir := filepath.Join(t.TempDir(), "plugins")
	store := newStore(t)
	plugin(t, dir, store, inv)
	c := newClient(t, dir)
	var compute []string
	for _, f := range append(append([]driver.File{}, inv.Binaries...), inv.Libraries...) {
		if f.Capability == driver.Compute || f.Capability == driver.Utility {
			compute = append(compute, f.HostPath)
		}
	}
	set, err := store.EnsureSet(inv, compute)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(set.Path, store.Dir+"/") {
		t.Fatalf("set tree %s outside the store %s", set.Path, store.Dir)
	}
	if r := c.do("List", ""); r.Err != "" || r.Volumes == nil || len(r.Volumes) != 0 {
		t.Errorf("List with only a set tree: %+v", r)
	}
	vol := VolumeName(version)
	if r := c.do("Create", vol); r.Err != "" {
		t.Fatalf("Create: %s", r.Err)
	}
	if _, err := store.EnsureSet(inv, compute[:1]); err != nil {
		t.Fatal(err)
	}
	if r := c.do("List", ""); len(r.Volumes) != 1 || r.Volumes[0] != (Volume{vol, filepath.Join(store.Dir, version)}) {
		t.Errorf("List with the volume and two set trees: %+v", r)
	}
	for _, name := range []string{DriverVolume + "_" + drivervol.SetsDir, DriverVolume + "_" + filepath.Base(filepath.Dir(set.Path))} {
		if r := c.do("Get", name); r.Err == "" {
			t.Errorf("Get %s: %+v, want an error", name, r)
		}
	}
}
