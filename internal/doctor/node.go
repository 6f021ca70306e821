package doctor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/internal/kubeletckpt"
)

// The kubelet's device manager checkpoint, in the device-plugins directory.
const checkpointFile = kubeletckpt.File

// DefaultServiceAccountDir is where a pod finds its service account's token
// and the cluster's CA certificate.
const DefaultServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// holder is a container holding a device.
type holder struct{ pod, container string }

func (h holder) String() string { return "pod " + h.pod + " container " + h.container }

// kubeletCheckpoint is the checkpoint as doctor uses it.
type kubeletCheckpoint struct {
	path       string
	registered map[string][]string // resource -> IDs (healthy when last written)
	held       map[devKey][]holder // by pod UID
	entries    int
}

// readCheckpoint reads the kubelet's device checkpoint in the
// device-plugins directory dir; nil, nil when the file does not exist.
func readCheckpoint(dir string) (*kubeletCheckpoint, error) {
	cp, err := kubeletckpt.ReadFile(filepath.Join(dir, checkpointFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	k := &kubeletCheckpoint{path: cp.Path, registered: cp.Registered, held: map[devKey][]holder{}}
	for _, e := range cp.Entries {
		k.entries++
		for _, id := range e.DeviceIDs {
			key := devKey{e.ResourceName, id}
			k.held[key] = append(k.held[key], holder{"UID " + e.PodUID, e.ContainerName})
		}
	}
	return k, nil
}

// nodeResources is a Node's status.capacity and status.allocatable,
// NVIDIA resources only, as counts.
type nodeResources struct {
	name        string
	server      string
	kubelet     string // status.nodeInfo.kubeletVersion
	capacity    map[string]int64
	allocatable map[string]int64
}

// apiAccess is how to reach the API server: in a pod, its service account.
type apiAccess struct {
	server string // https://host:port
	saDir  string
	node   string
}

// resolveAPI finds the API server, the credentials and the node's name
// from opts and the environment of a pod.
func resolveAPI(opts Options) (apiAccess, error) {
	a := apiAccess{server: opts.APIServer, saDir: opts.ServiceAccountDir, node: opts.NodeName}
	if a.saDir == "" {
		a.saDir = DefaultServiceAccountDir
	}
	if a.node == "" {
		a.node = os.Getenv("NODE_NAME")
	}
	if a.server == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" {
			return a, errors.New("not in a pod (KUBERNETES_SERVICE_HOST is not set), so no API credentials; run doctor in a pod whose service account may get nodes (the device plugin's), or compare with kubectl describe node")
		}
		if port == "" {
			port = "443"
		}
		a.server = "https://" + net.JoinHostPort(host, port)
	}
	if _, err := os.Stat(filepath.Join(a.saDir, "token")); err != nil {
		return a, fmt.Errorf("no service account token (%v); run doctor in a pod with a service account that may get nodes (automountServiceAccountToken not false)", err)
	}
	if a.node == "" {
		return a, errors.New("NODE_NAME is not set, so the Node to read is unknown; set it from the downward API (fieldRef spec.nodeName) or pass --node")
	}
	return a, nil
}

// getNode GETs the Node with the service account's token.
func getNode(a apiAccess) (*nodeResources, error) {
	token, err := os.ReadFile(filepath.Join(a.saDir, "token"))
	if err != nil {
		return nil, fmt.Errorf("reading the service account token: %v", err)
	}
	caFile := filepath.Join(a.saDir, "ca.crt")
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("reading the cluster CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
	}
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, Proxy: http.ProxyFromEnvironment},
	}
	u := strings.TrimSuffix(a.server, "/") + "/api/v1/nodes/" + url.PathEscape(a.node)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("API server %q: %v", a.server, err)
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %v", u, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized, http.StatusForbidden:
		return nil, fmt.Errorf("GET %s: %s: the service account may not get nodes; grant it (the chart's ClusterRole does)", u, resp.Status)
	case http.StatusNotFound:
		return nil, fmt.Errorf("GET %s: %s: no Node %q; is NODE_NAME (--node) this node's name?", u, resp.Status, a.node)
	default:
		return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	var node struct {
		Status struct {
			Capacity    map[string]string `json:"capacity"`
			Allocatable map[string]string `json:"allocatable"`
			NodeInfo    struct {
				KubeletVersion string `json:"kubeletVersion"`
			} `json:"nodeInfo"`
		} `json:"status"`
	}
	if err := json.Unmarshal(body, &node); err != nil {
		return nil, fmt.Errorf("GET %s: the answer is not a Node: %v", u, err)
	}
	n := &nodeResources{name: a.node, server: a.server, kubelet: node.Status.NodeInfo.KubeletVersion,
		capacity: map[string]int64{}, allocatable: map[string]int64{}}
	for _, m := range []struct {
		in  map[string]string
		out map[string]int64
	}{{node.Status.Capacity, n.capacity}, {node.Status.Allocatable, n.allocatable}} {
		for name, q := range m.in {
			if !gpuResource(name) {
				continue
			}
			// Extended resources are whole numbers; the API server refuses
			// others, and writes large ones with a suffix (1000 is "1k").
			v, err := wholeQuantity(q)
			if err != nil {
				return nil, fmt.Errorf("GET %s: %s is %q, not a whole number", u, name, q)
			}
			m.out[name] = v
		}
	}
	return n, nil
}

// wholeQuantity reads a Kubernetes quantity that is a whole number: digits
// with an optional decimal (k, M, G, T, P, E) or binary (Ki ... Ei) suffix,
// or an exponent (1e3), as the API server canonicalises them.
func wholeQuantity(q string) (int64, error) {
	mult := int64(1)
	num := q
	for _, s := range []struct {
		suffix string
		mult   int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50}, {"Ei", 1 << 60},
		{"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"E", 1e18}} {
		if rest, ok := strings.CutSuffix(q, s.suffix); ok && rest != "" {
			num, mult = rest, s.mult
			break
		}
	}
	if mant, exp, ok := strings.Cut(num, "e"); ok && mult == 1 {
		e, err := strconv.Atoi(exp)
		if err != nil || e < 0 || e > 18 {
			return 0, fmt.Errorf("quantity %q", q)
		}
		num = mant
		for ; e > 0; e-- {
			mult *= 10
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v < 0 || (v > 0 && mult > (1<<63-1)/v) {
		return 0, fmt.Errorf("quantity %q", q)
	}
	return v * mult, nil
}
