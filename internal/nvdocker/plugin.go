package nvdocker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Plugin is where the wrapper looks for nvidia-docker-plugin.
type Plugin struct {
	// Socket is the volume plugin's socket.
	Socket string
	// API is the REST API's base URL.
	API string
}

// DefaultPlugin is where nvidia-docker-plugin serves (gantry serve
// --volume-plugin's defaults).
var DefaultPlugin = Plugin{Socket: "/run/docker/plugins/nvidia-docker.sock", API: "http://localhost:3476"}

// APIError says that the plugin runs but its REST API could not be asked.
type APIError struct{ Err error }

func (e *APIError) Error() string { return e.Err.Error() }
func (e *APIError) Unwrap() error { return e.Err }

const pluginTimeout = 10 * time.Second

// Running reports whether a volume plugin answers on the socket.
func (p Plugin) Running() bool {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", p.Socket)
		},
	}}
	req, _ := http.NewRequest(http.MethodPost, "http://plugin/Plugin.Activate", strings.NewReader("{}"))
	req.Header.Set("Accept", "application/vnd.docker.plugins.v1.2+json")
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var act struct{ Implements []string }
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&act) != nil {
		return false
	}
	return slices.Contains(act.Implements, "VolumeDriver")
}

// Args returns the docker run arguments the plugin gives for gpus (NV_GPU's
// value; empty for all), or nil when no plugin runs. A plugin whose REST API
// cannot be reached gives an *APIError; one that refuses the request (a GPU
// that does not exist) an error with its reason.
func (p Plugin) Args(gpus string) ([]string, error) {
	if !p.Running() {
		return nil, nil
	}
	ids := strings.FieldsFunc(gpus, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
	q := url.Values{"vol": {"nvidia_driver"}, "dev": {strings.Join(ids, " ")}}
	u := strings.TrimSuffix(p.API, "/") + "/docker/cli?" + q.Encode()
	hc := &http.Client{Timeout: pluginTimeout}
	resp, err := hc.Get(u)
	if err != nil {
		return nil, &APIError{fmt.Errorf("nvidia-docker-plugin answers on %s but its REST API does not: %v", p.Socket, err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, &APIError{fmt.Errorf("reading %s: %v", u, err)}
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("nvidia-docker-plugin: %s (NV_GPU=%q)", strings.TrimSpace(string(body)), gpus)
	}
	words := strings.Fields(string(body))
	if len(words) == 0 {
		return nil, fmt.Errorf("nvidia-docker-plugin gave no arguments at %s", u)
	}
	return words, nil
}
