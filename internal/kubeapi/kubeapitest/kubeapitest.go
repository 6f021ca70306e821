package kubeapitest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/gantry-gpu/gantry/internal/kubeapi"
)

// Token is the bearer token the server accepts.
const Token = "kubeapitest-token"

// BasicUser and BasicPassword are the user name and password the server
// accepts (HTTP basic authentication).
const BasicUser, BasicPassword = "kubeapitest-user", "kubeapitest-password"

// ClientCertCN is the common name of the client certificate that
// ClientCertificate returns (as the kubelet's: system:node:NAME).
const ClientCertCN = "system:node:gpu-node-1"

// Server is the fake API server.
type Server struct {
	t   testing.TB
	srv *httptest.Server

	clientCert, clientKey []byte // PEM, signed by the client CA the server trusts

	mu      sync.Mutex
	nodes   map[string][]byte // name -> the Node as JSON
	events  []corev1.Event
	actions []string // "VERB path", in order
	users   []string // who each request authenticated as: "token", "basic" or "cert:CN"
}

// New starts a server holding nodes; it stops when the test ends.
func New(t testing.TB, nodes ...*corev1.Node) *Server {
	t.Helper()
	s := &Server{t: t, nodes: map[string][]byte{}}
	for _, n := range nodes {
		b, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		s.nodes[n.Name] = b
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/nodes/{name}", s.getNode)
	mux.HandleFunc("PATCH /api/v1/nodes/{name}", s.patchNode)
	mux.HandleFunc("POST /api/v1/namespaces/{ns}/events", s.createEvent)
	clientCAs := s.makeClientCert()
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user := ""
		u, p, basic := r.BasicAuth()
		switch {
		case r.Header.Get("Authorization") == "Bearer "+Token:
			user = "token"
		case basic && u == BasicUser && p == BasicPassword:
			user = "basic"
		case r.TLS != nil && len(r.TLS.VerifiedChains) > 0:
			user = "cert:" + r.TLS.VerifiedChains[0][0].Subject.CommonName
		}
		s.mu.Lock()
		s.actions = append(s.actions, r.Method+" "+r.URL.Path)
		s.users = append(s.users, user)
		s.mu.Unlock()
		if user == "" {
			status(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
			return
		}
		mux.ServeHTTP(w, r)
	}))
	// As the API server: a client certificate is checked when one is given.
	s.srv.TLS = &tls.Config{ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: clientCAs}
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are what some tests do
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	return s
}

// makeClientCert makes a client CA and a certificate it signs (CN
// ClientCertCN, an ECDSA key), keeps the certificate and key as PEM and
// returns the pool the server verifies clients with.
func (s *Server) makeClientCert() *x509.CertPool {
	s.t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		s.t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubeapitest client CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		s.t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		s.t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		s.t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: ClientCertCN, Organization: []string{"system:nodes"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		s.t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		s.t.Fatal(err)
	}
	s.clientCert = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	s.clientKey = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool
}

// ClientCertificate is a client certificate and its key (PEM) that the
// server accepts, its common name ClientCertCN.
func (s *Server) ClientCertificate() (cert, key []byte) { return s.clientCert, s.clientKey }

// CA is the PEM certificate a client must trust to reach s.
func (s *Server) CA() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
}

// Users are who the requests so far authenticated as, in order: "token",
// "basic", "cert:" and the client certificate's common name, or "" (refused).
func (s *Server) Users() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.users...)
}

// Client is a kubeapi client of s that trusts only s's certificate.
func (s *Server) Client() *kubeapi.Client {
	return kubeapi.New(s.srv.URL, s.srv.Client(), func() (string, error) { return Token, nil })
}

// HTTPClient is an HTTP client that trusts s's certificate.
func (s *Server) HTTPClient() *http.Client { return s.srv.Client() }

// URL is https://127.0.0.1:PORT.
func (s *Server) URL() string { return s.srv.URL }

// WriteServiceAccount writes what the kubelet mounts into a pod (ca.crt with
// s's certificate, token) into dir.
func (s *Server) WriteServiceAccount(dir string) {
	s.t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), s.CA(), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(Token+"\n"), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

// Node is the stored Node name, or nil.
func (s *Server) Node(name string) *corev1.Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.nodes[name]
	if !ok {
		return nil
	}
	var n corev1.Node
	if err := json.Unmarshal(b, &n); err != nil {
		s.t.Fatal(err)
	}
	return &n
}

// Events are the Events created so far.
func (s *Server) Events() []corev1.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]corev1.Event(nil), s.events...)
}

// Actions are the requests so far, as "VERB path".
func (s *Server) Actions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.actions...)
}

// ClearActions forgets the requests so far.
func (s *Server) ClearActions() {
	s.mu.Lock()
	s.actions, s.users = nil, nil
	s.mu.Unlock()
}

// status answers with a metav1.Status, as the API server does on errors.
func status(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "status": "Failure",
		"reason": reason, "message": msg, "code": code,
	})
}

func (s *Server) getNode(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	s.mu.Lock()
	b, ok := s.nodes[name]
	s.mu.Unlock()
	if !ok {
		status(w, http.StatusNotFound, "NotFound", fmt.Sprintf("nodes %q not found", name))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (s *Server) patchNode(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if ct := r.Header.Get("Content-Type"); ct != "application/strategic-merge-patch+json" {
		status(w, http.StatusUnsupportedMediaType, "UnsupportedMediaType", "the server only takes strategic merge patches here, not "+ct)
		return
	}
	patch, err := io.ReadAll(r.Body)
	if err != nil {
		status(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	orig, ok := s.nodes[name]
	if !ok {
		status(w, http.StatusNotFound, "NotFound", fmt.Sprintf("nodes %q not found", name))
		return
	}
	merged, err := strategicpatch.StrategicMergePatch(orig, patch, corev1.Node{})
	if err != nil {
		status(w, http.StatusUnprocessableEntity, "Invalid", err.Error())
		return
	}
	var n corev1.Node
	if err := json.Unmarshal(merged, &n); err != nil {
		status(w, http.StatusUnprocessableEntity, "Invalid", err.Error())
		return
	}
	b, _ := json.Marshal(&n)
	s.nodes[name] = b
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (s *Server) createEvent(w http.ResponseWriter, r *http.Request) {
	ns := r.PathValue("ns")
	var ev corev1.Event
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		status(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	switch {
	case ev.Kind != "Event" || ev.APIVersion != "v1":
		status(w, http.StatusBadRequest, "BadRequest", fmt.Sprintf("kind %q apiVersion %q, want Event v1", ev.Kind, ev.APIVersion))
		return
	case ev.Namespace != ns:
		status(w, http.StatusBadRequest, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request")
		return
	case ev.Name == "":
		status(w, http.StatusUnprocessableEntity, "Invalid", "metadata.name: Required value")
		return
	}
	s.mu.Lock()
	s.events = append(s.events, ev)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(&ev)
}
