package legacyapi

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gantry-gpu/gantry/internal/dockervol"
	"github.com/gantry-gpu/gantry/internal/driver"
	"github.com/gantry-gpu/gantry/internal/gpu"
)

// DockerArgs is /docker/cli/json's body.
type DockerArgs struct {
	// VolumeDriver is "nvidia-docker" when the volume plugin serves the
	// driver (Options.VolumePlugin), as in the original; empty otherwise,
	// as the volumes are then host binds that need no driver.
	VolumeDriver string
	// Volumes are --volume values: "nvidia_driver_<version>:/usr/local/nvidia:ro"
	// with the volume plugin, else "hostpath:containerpath:ro".
	Volumes []string
	// Devices are --device values, the control nodes first; HOST:CONTAINER
	// when the nodes are under a dev root other than /.
	Devices []string
}

// Words returns the arguments as docker run takes them.
func (a DockerArgs) Words() []string {
	var out []string
	if a.VolumeDriver != "" {
		out = append(out, "--volume-driver="+a.VolumeDriver)
	}
	for _, v := range a.Volumes {
		out = append(out, "--volume="+v)
	}
	for _, d := range a.Devices {
		out = append(out, "--device="+d)
	}
	return out
}

// DockerCLI computes the arguments for the GPUs named by dev and the volumes
// named by vol, both in the query syntax (space or comma separated; "" or "*" for all).
func (s *Server) DockerCLI(dev, vol string) (*DockerArgs, error) {
	devs, err := SelectDevices(s.opts.System, dev)
	if err != nil {
		return nil, err
	}
	if names := splitList(vol); !(len(names) == 0 || len(names) == 1 && names[0] == "*") {
		for _, n := range names {
			if n != DriverVolume {
				return nil, fmt.Errorf("invalid volume: %s (the only volume is %s)", n, DriverVolume)
			}
		}
	}
	nodes := []string{devCtl, devUVM}
	if s.hasUVMTools() {
		nodes = append(nodes, devUVMTools)
	}
	for _, d := range devs {
		nodes = append(nodes, d.DevicePath())
	}
	a := &DockerArgs{}
	root := s.devRoot()
	for _, n := range nodes {
		if root == "/" {
			a.Devices = append(a.Devices, n)
		} else {
			// The nodes live under a dev root (a driver container's
			// /run/nvidia/driver): HOST:CONTAINER.
			a.Devices = append(a.Devices, filepath.Join(root, n)+":"+n)
		}
	}
	if s.opts.VolumePlugin {
		a.VolumeDriver = dockervol.PluginName
		a.Volumes = []string{dockervol.DockerVolume(s.driverVersion())}
	} else {
		a.Volumes = DriverBinds(s.opts.Driver)
	}
	return a, nil
}

func (s *Server) driverVersion() string {
	if s.opts.Driver != nil && s.opts.Driver.Version != "" {
		return s.opts.Driver.Version
	}
	return s.opts.System.DriverVersion
}

func (s *Server) devRoot() string {
	root := s.opts.DevRoot
	if root == "" && s.opts.Driver != nil {
		root = s.opts.Driver.Root
	}
	if root == "" {
		return "/"
	}
	return filepath.Clean(root)
}

func (s *Server) hasUVMTools() bool {
	_, err := os.Stat(filepath.Join(s.devRoot(), devUVMTools))
	return err == nil
}

// SelectDevices picks GPUs by index or UUID prefix ("GPU-..."), in index
// order, each once; an empty list or "*" picks all.
func SelectDevices(sys *gpu.System, spec string) ([]gpu.Device, error) {
	ids := splitList(spec)
	if len(ids) == 0 || len(ids) == 1 && ids[0] == "*" {
		return sys.Devices, nil
	}
	chosen := map[int]bool{}
next:
	for _, id := range ids {
		if strings.HasPrefix(id, "GPU-") {
			for i, d := range sys.Devices {
				if strings.HasPrefix(d.UUID, id) {
					chosen[i] = true
					continue next
				}
			}
		} else if n, err := strconv.Atoi(id); err == nil && n >= 0 && n < len(sys.Devices) {
			chosen[n] = true
			continue
		}
		return nil, fmt.Errorf("invalid device: %s (give GPU indexes 0-%d or UUIDs, separated by + or ,)", id, len(sys.Devices)-1)
	}
	var out []gpu.Device
	for i, d := range sys.Devices {
		if chosen[i] {
			out = append(out, d)
		}
	}
	return out, nil
}

func splitList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' })
}

// DriverBinds returns the read-only binds that stand in for the original's
// nvidia_driver volume: the driver's own directory at /usr/local/nvidia when
// all its programs and libraries live under one directory named for NVIDIA,
// else one bind per file into /usr/local/nvidia/{bin,lib64,lib}.
func DriverBinds(inv *driver.Inventory) []string {
	if inv == nil {
		return []string{}
	}
	var files []driver.File
	files = append(files, inv.Binaries...)
	files = append(files, inv.Libraries...)
	if len(files) == 0 {
		return []string{}
	}
	if dir := ownDirectory(files); dir != "" {
		return []string{dir + ":" + driverMount + ":ro"}
	}
	out := []string{}
	seen := map[string]bool{}
	add := func(host, ctr string) {
		if !seen[ctr] {
			seen[ctr] = true
			out = append(out, host+":"+ctr+":ro")
		}
	}
	for _, f := range inv.Binaries {
		add(f.HostPath, path.Join(driverMount, "bin", path.Base(f.ContainerPath)))
	}
	for _, f := range inv.Libraries {
		sub := "lib64"
		if f.Capability == driver.Compat32 {
			sub = "lib"
		}
		name := f.SONAME
		if name == "" {
			name = path.Base(f.ContainerPath)
		}
		add(f.HostPath, path.Join(driverMount, sub, name))
	}
	return out
}

// ownDirectory returns the directory holding every file when it is a
// directory of the driver's own (its name mentions nvidia), else "".
func ownDirectory(files []driver.File) string {
	common := filepath.Dir(files[0].HostPath)
	for _, f := range files[1:] {
		for !within(f.HostPath, common) {
			common = filepath.Dir(common)
		}
	}
	// Walk up from the deepest common directory to the nearest one named
	// for NVIDIA (/usr/local/nvidia from /usr/local/nvidia/lib64).
	for d := common; d != "/" && d != "."; d = filepath.Dir(d) {
		if strings.Contains(strings.ToLower(filepath.Base(d)), "nvidia") {
			return d
		}
	}
	return ""
}

func within(p, dir string) bool {
	return dir == "/" || strings.HasPrefix(p, dir+"/")
}

func (s *Server) dockerCLI(w http.ResponseWriter, r *http.Request) {
	a, err := s.DockerCLI(r.FormValue("dev"), r.FormValue("vol"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	words := a.Words()
	for _, word := range words {
		if strings.ContainsAny(word, " \t\n") {
			// Clients split the text on spaces; a path with one would be cut.
			http.Error(w, fmt.Sprintf("argument %q holds white space, which the text form cannot carry: use /docker/cli/json", word), http.StatusInternalServerError)
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	// No trailing newline: the original's clients split the body on " ".
	io.WriteString(w, strings.Join(words, " "))
}

func (s *Server) dockerCLIJSON(w http.ResponseWriter, r *http.Request) {
	a, err := s.DockerCLI(r.FormValue("dev"), r.FormValue("vol"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	writeJSON(w, a)
}

// MesosCLI is /mesos/cli's body: the agent flags that advertise the GPUs
// to Mesos, as the original wrote them: the attribute gpus holds
// /gpu/info/json's body, zlib-compressed, in unpadded URL-safe base64; the
// resource gpus is the set of the GPUs' UUIDs.
func (s *Server) MesosCLI() (string, error) {
	var js bytes.Buffer
	if err := json.NewEncoder(&js).Encode(s.GPUInfo()); err != nil {
		return "", err
	}
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(js.Bytes())
	if err := zw.Close(); err != nil {
		return "", err
	}
	uuids := make([]string, 0, len(s.opts.System.Devices))
	for _, d := range s.opts.System.Devices {
		uuids = append(uuids, d.UUID)
	}
	return fmt.Sprintf("--attributes=gpus:%s --resources=gpus:{%s}",
		base64.RawURLEncoding.EncodeToString(z.Bytes()), strings.Join(uuids, ",")), nil
}

func (s *Server) mesosCLI(w http.ResponseWriter, r *http.Request) {
	out, err := s.MesosCLI()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, out)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
