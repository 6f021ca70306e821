package kubeapi

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// FromEnvironment is a client configured the way kubectl and client-go
// programs are: from the kubeconfig files that KUBECONFIG names (a
// colon-separated list, merged first-wins) when it is set, else as the
// pod's service account (InCluster).
func FromEnvironment() (*Client, error) {
	return fromEnvironment(os.Getenv, ServiceAccountDir)
}

// FromEnv is FromEnvironment with the environment read through getenv.
func FromEnv(getenv func(string) string) (*Client, error) {
	return fromEnvironment(getenv, ServiceAccountDir)
}

func fromEnvironment(getenv func(string) string, saDir string) (*Client, error) {
	if kc := getenv("KUBECONFIG"); kc != "" {
		return FromKubeconfig(filepath.SplitList(kc)...)
	}
	c, err := inCluster(getenv, saDir)
	if err != nil {
		return nil, fmt.Errorf("%w; outside a pod, set KUBECONFIG to a kubeconfig file", err)
	}
	return c, nil
}

// kubeconfig is the part of a kubeconfig file (clientcmd's v1 Config) that
// FromKubeconfig reads. The *-data fields are base64 in the file, which is
// how encoding/json decodes []byte.
type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Clusters       []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server                   string `json:"server"`
			TLSServerName            string `json:"tls-server-name"`
			InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify"`
			CertificateAuthority     string `json:"certificate-authority"`
			CertificateAuthorityData []byte `json:"certificate-authority-data"`
			ProxyURL                 string `json:"proxy-url"`
		} `json:"cluster"`
	} `json:"clusters"`
	Contexts []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster string `json:"cluster"`
			User    string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			Token                 string `json:"token"`
			TokenFile             string `json:"tokenFile"`
			ClientCertificate     string `json:"client-certificate"`
			ClientCertificateData []byte `json:"client-certificate-data"`
			ClientKey             string `json:"client-key"`
			ClientKeyData         []byte `json:"client-key-data"`
			Username              string `json:"username"`
			Password              string `json:"password"`
			Exec                  any    `json:"exec"`
			AuthProvider          any    `json:"auth-provider"`
		} `json:"user"`
	} `json:"users"`

	dir string // the file's directory, against which relative paths resolve
}

// FromKubeconfig is a client of the current context of the kubeconfig
// files (merged as kubectl does: the first file that sets a name or
// current-context wins; files that do not exist are skipped). The context's
// user authenticates with a bearer token (token, tokenFile, read again for
// each request), a client certificate (client-certificate/-key, as files
// read again at each TLS handshake, so a rotated kubelet certificate is
// picked up, or inline data) or a user name and password. Exec and
// auth-provider credential plugins are refused with an error.
func FromKubeconfig(paths ...string) (*Client, error) {
	var files []*kubeconfig
	var read []string
	for _, p := range paths {
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) && len(paths) > 1 {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("kubeconfig: %w", err)
		}
		var kc kubeconfig
		if err := yaml.Unmarshal(b, &kc); err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", p, err)
		}
		kc.dir = filepath.Dir(p)
		files = append(files, &kc)
		read = append(read, p)
	}
	where := "KUBECONFIG=" + strings.Join(paths, string(filepath.ListSeparator))
	if len(files) == 0 {
		return nil, fmt.Errorf("kubeconfig: none of %s exists", where)
	}
	if len(read) == 1 {
		where = read[0]
	}
	current := ""
	for _, f := range files {
		if f.CurrentContext != "" {
			current = f.CurrentContext
			break
		}
	}
	if current == "" {
		return nil, fmt.Errorf("kubeconfig %s: no current-context; set one with kubectl config use-context", where)
	}
	var clusterName, userName string
	found := false
	for _, f := range files {
		for _, c := range f.Contexts {
			if c.Name == current && !found {
				clusterName, userName, found = c.Context.Cluster, c.Context.User, true
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("kubeconfig %s: current-context %q is not among its contexts", where, current)
	}

	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     tlsConf,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		MaxIdleConnsPerHost: 2,
	}
	var server string
	found = false
	for _, f := range files {
		for _, c := range f.Clusters {
			if c.Name != clusterName || found {
				continue
			}
			found = true
			cl := c.Cluster
			server = cl.Server
			tlsConf.ServerName = cl.TLSServerName
			tlsConf.InsecureSkipVerify = cl.InsecureSkipTLSVerify
			ca := cl.CertificateAuthorityData
			if len(ca) == 0 && cl.CertificateAuthority != "" {
				b, err := os.ReadFile(resolve(f.dir, cl.CertificateAuthority))
				if err != nil {
					return nil, fmt.Errorf("kubeconfig %s: cluster %q: %w", where, clusterName, err)
				}
				ca = b
			}
			if len(ca) > 0 {
				pool := x509.NewCertPool()
				if !pool.AppendCertsFromPEM(ca) {
					return nil, fmt.Errorf("kubeconfig %s: cluster %q: no PEM certificate in its certificate authority", where, clusterName)
				}
				tlsConf.RootCAs = pool
			}
			if cl.ProxyURL != "" {
				u, err := url.Parse(cl.ProxyURL)
				if err != nil {
					return nil, fmt.Errorf("kubeconfig %s: cluster %q: proxy-url: %w", where, clusterName, err)
				}
				tr.Proxy = http.ProxyURL(u)
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("kubeconfig %s: context %q names cluster %q, which is not among its clusters", where, current, clusterName)
	}
	if u, err := url.Parse(server); err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("kubeconfig %s: cluster %q: server %q is not a URL like https://host:6443", where, clusterName, server)
	}

	token := func() (string, error) { return "", nil }
	var basic [2]string
	found = userName == "" // a context without a user: anonymous
	for _, f := range files {
		for _, u := range f.Users {
			if u.Name != userName || found {
				continue
			}
			found = true
			us := u.User
			if us.Exec != nil || us.AuthProvider != nil {
				return nil, fmt.Errorf("kubeconfig %s: user %q: exec and auth-provider credential plugins are not supported; use a token, tokenFile or client certificate (a service account token works)", where, userName)
			}
			switch {
			case us.Token != "":
				t := us.Token
				token = func() (string, error) { return t, nil }
			case us.TokenFile != "":
				file := resolve(f.dir, us.TokenFile)
				token = func() (string, error) {
					b, err := os.ReadFile(file)
					if err != nil {
						return "", fmt.Errorf("reading the kubeconfig's tokenFile: %w", err)
					}
					return strings.TrimSpace(string(b)), nil
				}
				if _, err := token(); err != nil {
					return nil, fmt.Errorf("kubeconfig %s: user %q: %w", where, userName, err)
				}
			}
			basic = [2]string{us.Username, us.Password}
			switch {
			case len(us.ClientCertificateData) > 0 || len(us.ClientKeyData) > 0:
				cert, err := tls.X509KeyPair(us.ClientCertificateData, us.ClientKeyData)
				if err != nil {
					return nil, fmt.Errorf("kubeconfig %s: user %q: client-certificate-data and client-key-data: %w", where, userName, err)
				}
				tlsConf.Certificates = []tls.Certificate{cert}
			case us.ClientCertificate != "" || us.ClientKey != "":
				certFile, keyFile := resolve(f.dir, us.ClientCertificate), resolve(f.dir, us.ClientKey)
				load := func() (*tls.Certificate, error) {
					cert, err := tls.LoadX509KeyPair(certFile, keyFile)
					if err != nil {
						return nil, fmt.Errorf("kubeconfig user %q: client-certificate %s and client-key %s: %w", userName, certFile, keyFile, err)
					}
					return &cert, nil
				}
				if _, err := load(); err != nil {
					return nil, fmt.Errorf("kubeconfig %s: %w", where, err)
				}
				tlsConf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return load() }
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("kubeconfig %s: context %q names user %q, which is not among its users", where, current, userName)
	}
	c := New(server, &http.Client{Transport: tr, Timeout: 30 * time.Second}, token)
	if basic[0] != "" {
		c.basic = basic
	}
	return c, nil
}

// resolve is p relative to dir (a kubeconfig's directory) unless absolute.
func resolve(dir, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}
