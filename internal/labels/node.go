package labels

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/gantry-gpu/gantry/internal/kubeapi"
)

// OwnedAnnotation lists, on the Node, the label keys Gantry wrote last
// time, so that a later write can remove the ones it no longer produces
// without touching labels that others set under nvidia.com/ (the GPU
// operator's nvidia.com/gpu.deploy.*, a user's nvidia.com/mig.config).
const OwnedAnnotation = "gantry-gpu.github.io/labels"

// NodeWriter publishes a Set as labels of one Node.
type NodeWriter struct {
	Client   *kubeapi.Client
	NodeName string
}

// NewNodeWriter reaches the API server as kubeapi.FromEnvironment does:
// through the kubeconfig files KUBECONFIG names if it is set, else as the
// pod's service account (the DaemonSet's RBAC must allow get and patch on
// nodes). nodeName is usually the NODE_NAME environment variable set from
// spec.nodeName.
func NewNodeWriter(nodeName string) (*NodeWriter, error) {
	return NewNodeWriterEnv(nodeName, os.Getenv)
}

// NewNodeWriterEnv is NewNodeWriter with the environment read through
// getenv.
func NewNodeWriterEnv(nodeName string, getenv func(string) string) (*NodeWriter, error) {
	if nodeName == "" {
		return nil, fmt.Errorf("node labels: no node name; set NODE_NAME from the downward API (fieldRef spec.nodeName)")
	}
	c, err := kubeapi.FromEnv(getenv)
	if err != nil {
		return nil, fmt.Errorf("node labels: %w (or write a node-feature-discovery feature file instead)", err)
	}
	return &NodeWriter{Client: c, NodeName: nodeName}, nil
}

// Write makes the Node's Gantry labels equal to s with one strategic merge
// patch: labels in s are set, labels of ours that s lacks are removed (those
// named in OwnedAnnotation and GFD's names, left behind by GFD), others are
// kept. Nothing is sent when the Node already has them.
func (w *NodeWriter) Write(ctx context.Context, s Set) error {
	for _, k := range s.Keys() {
		if err := checkKey(k); err != nil {
			return fmt.Errorf("node label %q: %w", k, err)
		}
		if err := checkValue(s[k]); err != nil {
			return fmt.Errorf("node label %s=%q: %w", k, s[k], err)
		}
	}
	n, err := w.Client.GetNode(ctx, w.NodeName)
	if err != nil {
		return fmt.Errorf("node labels: reading node %s: %w", w.NodeName, err)
	}
	node := &n.Metadata
	stale := map[string]bool{}
	for _, k := range strings.Split(node.Annotations[OwnedAnnotation], ",") {
		if k != "" {
			stale[k] = true
		}
	}
	for k := range node.Labels {
		if gfdLabel(k) {
			stale[k] = true
		}
	}
	labels := map[string]any{}
	for k, v := range s {
		if node.Labels[k] != v || !hasKey(node.Labels, k) {
			labels[k] = v
		}
	}
	for k := range stale {
		if _, keep := s[k]; !keep && hasKey(node.Labels, k) {
			labels[k] = nil // strategic merge patch: delete the key
		}
	}
	owned := strings.Join(s.Keys(), ",")
	if len(labels) == 0 && node.Annotations[OwnedAnnotation] == owned {
		return nil
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"labels":      labels,
			"annotations": map[string]any{OwnedAnnotation: owned},
		},
	})
	if err != nil {
		return err
	}
	if err := w.Client.PatchNode(ctx, w.NodeName, patch); err != nil {
		return fmt.Errorf("node labels: patching node %s: %w (the service account needs get and patch on nodes)", w.NodeName, err)
	}
	return nil
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

// resourceSuffixes are the per-resource label names of GFD.
var resourceSuffixes = []string{
	"product", "count", "replicas", "sharing-strategy", "memory", "family",
	"compute.major", "compute.minor", "multiprocessors", "slices.gi", "slices.ci",
	"engines.copy", "engines.decoder", "engines.encoder", "engines.jpeg", "engines.ofa",
}

var nodeLabels = map[string]bool{
	"mig.capable": true, "mig.strategy": true, "mps.capable": true, "vgpu.present": true,
	"gfd.timestamp": true, "gpu.machine": true, "gpu.mode": true,
}

// gfdLabel says whether k is one of the names GFD (and so Gantry) writes,
// other than nvidia.com/gpu.present, which administrators set by hand to
// force GPU DaemonSets onto a node.
func gfdLabel(k string) bool {
	rest, ok := strings.CutPrefix(k, Prefix)
	if !ok {
		return false
	}
	if strings.HasPrefix(rest, "cuda.") || nodeLabels[rest] {
		return true
	}
	var suffix string
	switch {
	case strings.HasPrefix(rest, "gpu."):
		suffix = strings.TrimPrefix(rest, "gpu.")
	case strings.HasPrefix(rest, "mig-"):
		// mig-<profile>.<suffix>: the profile has dots too, so try each suffix.
		for _, s := range resourceSuffixes {
			if strings.HasSuffix(rest, "."+s) {
				return true
			}
		}
		return false
	default:
		return false
	}
	return slices.Contains(resourceSuffixes, suffix)
}

// checkKey checks a label key as the API server does: an optional prefix
// that is a DNS subdomain (at most 253 characters) and a "/", then a name of
// at most 63 characters.
func checkKey(k string) error {
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if !hasPrefix {
		prefix, name = "", k
	} else if strings.Contains(name, "/") {
		return fmt.Errorf("a label key has at most one '/'")
	}
	if hasPrefix {
		if prefix == "" || len(prefix) > 253 {
			return fmt.Errorf("the prefix must be 1 to 253 characters")
		}
		for _, part := range strings.Split(prefix, ".") {
			if !dnsLabel(part) {
				return fmt.Errorf("the prefix %q must be a DNS subdomain: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit", prefix)
			}
		}
	}
	if name == "" {
		return fmt.Errorf("the name part must not be empty")
	}
	return checkName(name)
}

// checkValue checks a label value: empty, or a name of at most 63 characters.
func checkValue(v string) error {
	if v == "" {
		return nil
	}
	return checkName(v)
}

// checkName: at most 63 letters, digits, '-', '_' and '.', starting and
// ending with a letter or digit.
func checkName(s string) error {
	if len(s) > 63 {
		return fmt.Errorf("must be no more than 63 characters")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && ((i == 0 || i == len(s)-1) || (c != '-' && c != '_' && c != '.')) {
			return fmt.Errorf("must consist of letters, digits, '-', '_' or '.', and must start and end with a letter or digit")
		}
	}
	return nil
}

// dnsLabel: 1 to 63 lower-case letters, digits and '-', starting and ending
// with a letter or digit.
func dnsLabel(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := 'a' <= c && c <= 'z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || i == len(s)-1 || c != '-') {
			return false
		}
	}
	return true
}
