package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"
)

// DefaultDockerSocket is dockerd's API socket.
const DefaultDockerSocket = "/var/run/docker.sock"

// dockerdInfo is what doctor reads of the running dockerd's GET /info: the
// runtimes it registered at its last start or reload (daemon.json and
// --add-runtime), its default runtime, and where it reads CDI specs.
type dockerdInfo struct {
	Runtimes       map[string]struct{ Path string } `json:"Runtimes"`
	DefaultRuntime string                           `json:"DefaultRuntime"`
	CDISpecDirs    []string                         `json:"CDISpecDirs"`
}

// askDockerd GETs /info over dockerd's socket. An error means no daemon
// answers there; doctor then has only the file to go on.
func askDockerd(socket string) (*dockerdInfo, error) {
	client := &http.Client{
		Timeout: 3 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		}},
	}
	resp, err := client.Get("http://docker/info")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /info: %s", resp.Status)
	}
	var info dockerdInfo
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("GET /info: not Docker's answer: %v", err)
	}
	return &info, nil
}

// compareDockerd compares what daemon.json registers with what the running
// dockerd has. A runtime in the file but not in the daemon (or another
// default runtime) means the file changed after dockerd started: docker run
// --runtime nvidia says "Unknown runtime specified" until it is restarted.
func compareDockerd(file string, all []registered, defaultRuntime string, info *dockerdInfo) (problems []string) {
	for _, r := range all {
		if !runtimeBinaries[baseName(r.Program)] {
			continue
		}
		if _, ok := info.Runtimes[r.Name]; !ok {
			problems = append(problems, fmt.Sprintf("%s registers runtime %q but the running dockerd does not have it (its runtimes: %s)", file, r.Name, listOrNone(dockerdRuntimeNames(info))))
		}
	}
	if defaultRuntime != "" && info.DefaultRuntime != "" && defaultRuntime != info.DefaultRuntime {
		problems = append(problems, fmt.Sprintf("%s sets default-runtime %q but the running dockerd's is %q", file, defaultRuntime, info.DefaultRuntime))
	}
	return problems
}

func dockerdRuntimeNames(info *dockerdInfo) []string {
	var names []string
	for n := range info.Runtimes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func baseName(p string) string { return p[strings.LastIndexByte(p, '/')+1:] }
