package kubeapi

import (
	"bytes"
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
	"strings"
	"time"
)

// ServiceAccountDir is where the kubelet mounts the pod's service account.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// Client calls the API server.
type Client struct {
	base  string // https://host:port
	http  *http.Client
	token func() (string, error)
	basic [2]string // user name and password (a kubeconfig's), used without a token
}

// New is a client of the API server at base (https://host:port) through hc,
// authenticating with the bearer token that token returns for each request.
// A nil hc is http.DefaultClient.
func New(base string, hc *http.Client, token func() (string, error)) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: strings.TrimSuffix(base, "/"), http: hc, token: token}
}

// InCluster is a client as the pod's service account.
func InCluster() (*Client, error) {
	return inCluster(os.Getenv, ServiceAccountDir)
}

func inCluster(getenv func(string) string, saDir string) (*Client, error) {
	host, port := getenv("KUBERNETES_SERVICE_HOST"), getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("not running in a Kubernetes pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
	}
	caFile := filepath.Join(saDir, "ca.crt")
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("reading the cluster CA: %w (is a service account mounted into the pod?)", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", caFile)
	}
	tokenFile := filepath.Join(saDir, "token")
	token := func() (string, error) {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return "", fmt.Errorf("reading the service account token: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	if _, err := token(); err != nil {
		return nil, err
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		MaxIdleConnsPerHost: 2,
	}
	return New("https://"+net.JoinHostPort(host, port), &http.Client{Transport: tr, Timeout: 30 * time.Second}, token), nil
}

// ObjectMeta is the part of an object's metadata this package reads and writes.
type ObjectMeta struct {
	Name        string            `json:"name,omitempty"`
	Namespace   string            `json:"namespace,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Node is a core/v1 Node as far as its metadata.
type Node struct {
	Metadata ObjectMeta `json:"metadata"`
}

// ObjectReference names the object an Event is about.
type ObjectReference struct {
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
	Name       string `json:"name,omitempty"`
	Namespace  string `json:"namespace,omitempty"`
}

// EventSource is the component that reports an Event.
type EventSource struct {
	Component string `json:"component,omitempty"`
	Host      string `json:"host,omitempty"`
}

// Event is a core/v1 Event.
type Event struct {
	Metadata       ObjectMeta      `json:"metadata"`
	InvolvedObject ObjectReference `json:"involvedObject"`
	Reason         string          `json:"reason,omitempty"`
	Message        string          `json:"message,omitempty"`
	Source         EventSource     `json:"source"`
	FirstTimestamp Time            `json:"firstTimestamp"`
	LastTimestamp  Time            `json:"lastTimestamp"`
	Count          int32           `json:"count,omitempty"`
	// Type is Normal or Warning.
	Type string `json:"type,omitempty"`
}

// Time is a timestamp as the API writes them (metav1.Time): RFC 3339 in UTC,
// whole seconds.
type Time struct{ time.Time }

// MarshalJSON writes t as the API does.
func (t Time) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	return json.Marshal(t.UTC().Format(time.RFC3339))
}

// UnmarshalJSON reads a timestamp the API wrote.
func (t *Time) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		t.Time = time.Time{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return err
	}
	t.Time = v
	return nil
}

// Error is an answer of the API server other than success.
type Error struct {
	Method, Path string
	Code         int    // the HTTP status
	Reason       string // the Status object's reason (NotFound, Forbidden, ...), if any
	Message      string // the Status object's message, or the body
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Code)
	}
	return fmt.Sprintf("%s %s: %d %s", e.Method, e.Path, e.Code, msg)
}

// IsNotFound reports whether err is the API server's 404.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == http.StatusNotFound
}

// GetNode reads the Node name.
func (c *Client) GetNode(ctx context.Context, name string) (*Node, error) {
	var n Node
	if err := c.do(ctx, http.MethodGet, "/api/v1/nodes/"+url.PathEscape(name), "", nil, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// Get reads the object at the API path (/apis/apps/v1/namespaces/NS/daemonsets/NAME)
// into out, for the few reads that have no method of their own.
func (c *Client) Get(ctx context.Context, path string, out any) error {
	return c.do(ctx, http.MethodGet, path, "", nil, out)
}

// Delete deletes the object at the API path with the propagation policy
// (Foreground, Background, Orphan; "" for the object's default).
func (c *Client) Delete(ctx context.Context, path, propagation string) error {
	var body []byte
	if propagation != "" {
		body = []byte(`{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"` + propagation + `"}`)
	}
	return c.do(ctx, http.MethodDelete, path, "application/json", body, nil)
}

// PatchNode applies a strategic merge patch (a JSON object; for metadata
// maps, a null value deletes the key) to the Node name.
func (c *Client) PatchNode(ctx context.Context, name string, patch []byte) error {
	return c.do(ctx, http.MethodPatch, "/api/v1/nodes/"+url.PathEscape(name), "application/strategic-merge-patch+json", patch, nil)
}

// CreateEvent posts ev in its namespace (Metadata.Namespace).
func (c *Client) CreateEvent(ctx context.Context, ev *Event) error {
	body, err := json.Marshal(struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		*Event
	}{"v1", "Event", ev})
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, "/api/v1/namespaces/"+url.PathEscape(ev.Metadata.Namespace)+"/events", "application/json", body, nil)
}

// do sends one request and decodes a successful answer into out (if not nil).
func (c *Client) do(ctx context.Context, method, path, contentType string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "gantry-device-plugin")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	token, err := c.token()
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	} else if c.basic[0] != "" {
		req.SetBasicAuth(c.basic[0], c.basic[1])
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	// A Node or a Status is a few KiB; the bound keeps a broken server from
	// filling memory.
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := &Error{Method: method, Path: path, Code: resp.StatusCode}
		var st struct {
			Kind, Reason, Message string
		}
		if json.Unmarshal(data, &st) == nil && st.Kind == "Status" {
			e.Reason, e.Message = st.Reason, st.Message
		} else {
			e.Message = strings.TrimSpace(string(data[:min(len(data), 512)]))
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
		}
	}
	return nil
}
