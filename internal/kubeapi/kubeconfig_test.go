package kubeapi_test

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gantry-gpu/gantry/internal/kubeapi"
	"github.com/gantry-gpu/gantry/internal/kubeapi/kubeapitest"
)

// kubeconfigFixture is a server with a Node and the files a kubeconfig may
// point at, written into dir: ca.crt, token, client.crt, client.key and
// kubelet.pem (certificate and key in one file, as the kubelet's rotated
// kubelet-client-current.pem).
type kubeconfigFixture struct {
	s   *kubeapitest.Server
	dir string
	// b64 values for the *-data fields.
	caData, certData, keyData string
}

func newKubeconfigFixture(t *testing.T) *kubeconfigFixture {
	t.Helper()
	s := kubeapitest.New(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1"}})
	dir := t.TempDir()
	cert, key := s.ClientCertificate()
	for name, data := range map[string][]byte{
		"ca.crt": s.CA(), "token": []byte(kubeapitest.Token + "\n"),
		"client.crt": cert, "client.key": key, "kubelet.pem": append(append([]byte{}, cert...), key...),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b64 := base64.StdEncoding.EncodeToString
	return &kubeconfigFixture{s: s, dir: dir, caData: b64(s.CA()), certData: b64(cert), keyData: b64(key)}
}

// write writes a kubeconfig file named name into the fixture's directory,
// with SERVER replaced by the server's URL.
func (f *kubeconfigFixture) write(t *testing.T, name, yaml string) string {
	t.Helper()
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, []byte(strings.ReplaceAll(yaml, "SERVER", f.s.URL())), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// kubeconfig is a one-context kubeconfig with the cluster and user given
// as YAML mappings (indented for their place).
func kubeconfig(cluster, user string) string {
	return `apiVersion: v1
kind: Config
current-context: ctx
contexts:
- name: other
  context: {cluster: nowhere, user: nobody}
- name: ctx
  context:
    cluster: c
    user: u
clusters:
- name: c
  cluster:
    server: SERVER
` + cluster + `
users:
- name: u
  user:
` + user + "\n"
}

// TestKubeconfig reaches the server through kubeconfig files of the forms
// kubectl, kubeadm and the kubelet write: it reads and patches the Node and
// the server saw the credential that the file names.
func TestKubeconfig(t *testing.T) {
	f := newKubeconfigFixture(t)
	for _, tc := range []struct {
		name, cluster, user, as string
	}{
		{"inline CA, token", "    certificate-authority-data: " + f.caData, "    token: " + kubeapitest.Token, "token"},
		{"CA file and tokenFile, relative to the file", "    certificate-authority: ca.crt", "    tokenFile: token", "token"},
		{"inline client certificate", "    certificate-authority-data: " + f.caData,
			"    client-certificate-data: " + f.certData + "\n    client-key-data: " + f.keyData, "cert:" + kubeapitest.ClientCertCN},
		{"client certificate files", "    certificate-authority: " + filepath.Join(f.dir, "ca.crt"),
			"    client-certificate: client.crt\n    client-key: client.key", "cert:" + kubeapitest.ClientCertCN},
		{"the kubelet's rotated pair in one file", "    certificate-authority: ca.crt",
			"    client-certificate: kubelet.pem\n    client-key: kubelet.pem", "cert:" + kubeapitest.ClientCertCN},
		{"basic authentication, server not verified", "    insecure-skip-tls-verify: true",
			"    username: " + kubeapitest.BasicUser + "\n    password: " + kubeapitest.BasicPassword, "basic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := f.write(t, "config", kubeconfig(tc.cluster, tc.user))
			c, err := kubeapi.FromKubeconfig(p)
			if err != nil {
				t.Fatal(err)
			}
			f.s.ClearActions()
			ctx := context.Background()
			if _, err := c.GetNode(ctx, "gpu-node-1"); err != nil {
				t.Fatal(err)
			}
			if err := c.PatchNode(ctx, "gpu-node-1", []byte(`{"metadata":{"labels":{"case":"`+strings.ReplaceAll(tc.name[:5], " ", "-")+`"}}}`)); err != nil {
				t.Fatal(err)
			}
			if got := f.s.Users(); len(got) != 2 || got[0] != tc.as || got[1] != tc.as {
				t.Errorf("authenticated as %q, want %q twice", got, tc.as)
			}
			if got := f.s.Node("gpu-node-1").Labels["case"]; got != strings.ReplaceAll(tc.name[:5], " ", "-") {
				t.Errorf("label after the patch: %q", got)
			}
		})
	}
}

// TestKubeconfigMerged: KUBECONFIG lists several files, as kubectl merges
// them (the first to name a thing wins; a missing file is skipped), and it
// takes precedence over the pod's service account.
func TestKubeconfigMerged(t *testing.T) {
	f := newKubeconfigFixture(t)
	first := f.write(t, "first", `current-context: ctx
contexts:
- name: ctx
  context: {cluster: c, user: u}
users:
- name: u
  user: {tokenFile: token}
`)
	second := f.write(t, "second", `current-context: elsewhere
clusters:
- name: c
  cluster: {server: SERVER, certificate-authority: ca.crt}
users:
- name: u
  user: {token: wrong}
`)
	env := map[string]string{
		"KUBECONFIG":              strings.Join([]string{filepath.Join(f.dir, "absent"), first, second}, ":"),
		"KUBERNETES_SERVICE_HOST": "192.0.2.1", "KUBERNETES_SERVICE_PORT": "443",
	}
	c, err := kubeapi.FromEnvironmentWith(func(k string) string { return env[k] }, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetNode(context.Background(), "gpu-node-1"); err != nil {
		t.Fatal(err)
	}
	if got := f.s.Users(); len(got) != 1 || got[0] != "token" {
		t.Errorf("authenticated as %q", got)
	}

	// Without KUBECONFIG, in a pod: the service account.
	sa := t.TempDir()
	f.s.WriteServiceAccount(sa)
	host, port, _ := strings.Cut(strings.TrimPrefix(f.s.URL(), "https://"), ":")
	env = map[string]string{"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
	if c, err = kubeapi.FromEnvironmentWith(func(k string) string { return env[k] }, sa); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetNode(context.Background(), "gpu-node-1"); err != nil {
		t.Fatal(err)
	}
	// Neither: the error names both ways.
	_, err = kubeapi.FromEnvironmentWith(func(string) string { return "" }, sa)
	if err == nil || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST") || !strings.Contains(err.Error(), "KUBECONFIG") {
		t.Errorf("no pod, no KUBECONFIG: %v", err)
	}
}

// TestKubeconfigRotatedCertificate: client certificate files are read at
// each TLS handshake, so the kubelet's rotation is picked up without a
// restart.
func TestKubeconfigRotatedCertificate(t *testing.T) {
	f := newKubeconfigFixture(t)
	// First a certificate that the server's client CA did not sign.
	otherCert, otherKey := kubeapitest.New(t).ClientCertificate()
	pem := filepath.Join(f.dir, "kubelet.pem")
	if err := os.WriteFile(pem, append(append([]byte{}, otherCert...), otherKey...), 0o600); err != nil {
		t.Fatal(err)
	}
	p := f.write(t, "config", kubeconfig("    certificate-authority: ca.crt", "    client-certificate: kubelet.pem\n    client-key: kubelet.pem"))
	c, err := kubeapi.FromKubeconfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetNode(context.Background(), "gpu-node-1"); err == nil {
		t.Fatal("a client certificate of another CA was accepted")
	}
	cert, key := f.s.ClientCertificate()
	if err := os.WriteFile(pem, append(append([]byte{}, cert...), key...), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetNode(context.Background(), "gpu-node-1"); err != nil {
		t.Fatalf("after rotation: %v", err)
	}
}

// TestKubeconfigErrors: what cannot work is refused when the client is
// made, naming the file and the entry.
func TestKubeconfigErrors(t *testing.T) {
	f := newKubeconfigFixture(t)
	if _, key := kubeapitest.New(t).ClientCertificate(); os.WriteFile(filepath.Join(f.dir, "other.key"), key, 0o600) != nil {
		t.Fatal("writing other.key")
	}
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"exec plugin", kubeconfig("", "    exec: {apiVersion: client.authentication.k8s.io/v1, command: aws}"), []string{`user "u"`, "exec", "not supported"}},
		{"no current context", "clusters: []\n", []string{"no current-context"}},
		{"unknown context", "current-context: gone\n", []string{`current-context "gone"`}},
		{"unknown cluster", strings.Replace(kubeconfig("", "    token: x"), "cluster: c\n", "cluster: d\n", 1), []string{`cluster "d"`}},
		{"unknown user", strings.Replace(kubeconfig("", "    token: x"), "user: u\n", "user: v\n", 1), []string{`user "v"`}},
		{"server not a URL", strings.Replace(kubeconfig("", "    token: x"), "SERVER", "10.0.0.1:6443", 1), []string{"10.0.0.1:6443", "https://"}},
		{"CA not PEM", kubeconfig("    certificate-authority: token", "    token: x"), []string{"no PEM certificate"}},
		{"missing tokenFile", kubeconfig("", "    tokenFile: /nonexistent/token"), []string{"/nonexistent/token"}},
		{"key of another certificate", kubeconfig("", "    client-certificate: client.crt\n    client-key: "+filepath.Join(f.dir, "other.key")), []string{"client-key", "other.key"}},
		{"not YAML", "current-context: [", []string{"kubeconfig"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := f.write(t, "bad", tc.yaml)
			_, err := kubeapi.FromKubeconfig(p)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range append(tc.want, p) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
	if _, err := kubeapi.FromKubeconfig(filepath.Join(f.dir, "absent")); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Errorf("missing file: %v", err)
	}
	// No certificate authority: the system's roots, which did not sign the
	// server's certificate.
	c, err := kubeapi.FromKubeconfig(f.write(t, "noca", kubeconfig("", "    token: "+kubeapitest.Token)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetNode(context.Background(), "gpu-node-1"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("unverified server: %v", err)
	}
}
