package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// pkiMain writes the cluster's certificates, keys and kubeconfigs into DIR,
// what kubeadm's "certs" and "kubeconfig" phases write, with one CA:
//
//	gantry-k8s pki --dir DIR [--kubeconfig-dir DIR] --node NAME --ip NODEIP --service-ip 10.96.0.1 --server https://NODEIP:443
//
// Files already there are kept, so a second bring-up reuses the CA.
func pkiMain(args []string) int {
	fs := flag.NewFlagSet("pki", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory for the files (required)")
	node := fs.String("node", "", "the node's name (required)")
	nodeIP := fs.String("ip", "", "the node's IP address (required)")
	serviceIP := fs.String("service-ip", "10.96.0.1", "the kubernetes Service's cluster IP")
	server := fs.String("server", "", "the API server URL the kubeconfigs name (required)")
	confDir := fs.String("kubeconfig-dir", "", "directory for the kubeconfigs (default: --dir)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *dir == "" || *node == "" || *nodeIP == "" || *server == "" {
		fmt.Fprintln(os.Stderr, "pki: --dir, --node, --ip and --server are required")
		return 2
	}
	ip := net.ParseIP(*nodeIP)
	svc := net.ParseIP(*serviceIP)
	if ip == nil || svc == nil {
		fmt.Fprintf(os.Stderr, "pki: --ip %q / --service-ip %q: give IP addresses\n", *nodeIP, *serviceIP)
		return 2
	}
	if *confDir == "" {
		*confDir = *dir
	}
	if err := writePKI(*dir, *confDir, *node, ip, svc, *server); err != nil {
		fmt.Fprintln(os.Stderr, "pki:", err)
		return 1
	}
	return 0
}

type identity struct {
	file     string // base name of .crt/.key
	cn       string
	orgs     []string
	usage    []x509.ExtKeyUsage
	dns      []string
	ips      []net.IP
	kubeconf string // kubeconfig to write for this client, if any
}

func writePKI(dir, confDir, node string, nodeIP, serviceIP net.IP, server string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, caKey, err := loadOrMakeCA(dir)
	if err != nil {
		return err
	}
	client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	loop := net.ParseIP("127.0.0.1")
	ids := []identity{
		{file: "apiserver", cn: "kube-apiserver", usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost", node},
			ips: []net.IP{serviceIP, nodeIP, loop}},
		{file: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}, usage: client},
		{file: "kubelet-server", cn: node, usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			dns: []string{node, "localhost"}, ips: []net.IP{nodeIP, loop}},
		{file: "admin", cn: "kubernetes-admin", orgs: []string{"system:masters"}, usage: client, kubeconf: "admin.conf"},
		{file: "kubelet", cn: "system:node:" + node, orgs: []string{"system:nodes"}, usage: client, kubeconf: "kubelet.conf"},
		{file: "controller-manager", cn: "system:kube-controller-manager", usage: client, kubeconf: "controller-manager.conf"},
		{file: "scheduler", cn: "system:kube-scheduler", usage: client, kubeconf: "scheduler.conf"},
	}
	caPEM := pemCert(ca.Raw)
	for _, id := range ids {
		crtPath := filepath.Join(dir, id.file+".crt")
		if _, err := os.Stat(crtPath); err != nil {
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				return err
			}
			tmpl := &x509.Certificate{
				SerialNumber: serial(),
				Subject:      pkix.Name{CommonName: id.cn, Organization: id.orgs},
				NotBefore:    time.Now().Add(-time.Hour),
				NotAfter:     time.Now().AddDate(1, 0, 0),
				KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
				ExtKeyUsage:  id.usage,
				DNSNames:     id.dns,
				IPAddresses:  id.ips,
			}
			der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
			if err != nil {
				return fmt.Errorf("%s: %w", id.file, err)
			}
			if err := writeKey(filepath.Join(dir, id.file+".key"), key); err != nil {
				return err
			}
			if err := atomicWrite(crtPath, pemCert(der), 0o644); err != nil {
				return err
			}
		}
		if id.kubeconf == "" {
			continue
		}
		crt, err := os.ReadFile(crtPath)
		if err != nil {
			return err
		}
		key, err := os.ReadFile(filepath.Join(dir, id.file+".key"))
		if err != nil {
			return err
		}
		b64 := base64.StdEncoding.EncodeToString
		conf := strings.Join([]string{
			"apiVersion: v1",
			"kind: Config",
			"clusters:",
			"- name: gantry",
			"  cluster:",
			"    server: " + server,
			"    certificate-authority-data: " + b64(caPEM),
			"users:",
			"- name: " + id.cn,
			"  user:",
			"    client-certificate-data: " + b64(crt),
			"    client-key-data: " + b64(key),
			"contexts:",
			"- name: gantry",
			"  context: {cluster: gantry, user: \"" + id.cn + "\"}",
			"current-context: gantry",
			"",
		}, "\n")
		if err := atomicWrite(filepath.Join(confDir, id.kubeconf), []byte(conf), 0o600); err != nil {
			return err
		}
	}
	// The service-account token signing key pair.
	if _, err := os.Stat(filepath.Join(dir, "sa.key")); err != nil {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
		if err != nil {
			return err
		}
		if err := atomicWrite(filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
			return err
		}
		if err := writeKey(filepath.Join(dir, "sa.key"), key); err != nil {
			return err
		}
	}
	return nil
}

func loadOrMakeCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	crtPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if crtPEM, err := os.ReadFile(crtPath); err == nil {
		keyPEM, err := os.ReadFile(keyPath)
		if err != nil {
			return nil, nil, err
		}
		cb, _ := pem.Decode(crtPEM)
		kb, _ := pem.Decode(keyPEM)
		if cb == nil || kb == nil {
			return nil, nil, fmt.Errorf("%s or %s is not PEM: remove %s to start over", crtPath, keyPath, dir)
		}
		crt, err := x509.ParseCertificate(cb.Bytes)
		if err != nil {
			return nil, nil, err
		}
		key, err := x509.ParseECPrivateKey(kb.Bytes)
		return crt, key, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "gantry-k8s-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	if err := writeKey(keyPath, key); err != nil {
		return nil, nil, err
	}
	if err := atomicWrite(crtPath, pemCert(der), 0o644); err != nil {
		return nil, nil, err
	}
	crt, err := x509.ParseCertificate(der)
	return crt, key, err
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err)
	}
	return n
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return atomicWrite(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// atomicWrite writes a temporary file beside path and renames it over path.
func atomicWrite(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
