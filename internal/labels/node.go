package labels

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// OwnedAnnotation lists, on the Node, the label keys Gantry wrote last
// time, so that a later write can remove the ones it no longer produces
// without touching labels that others set under nvidia.com/ (the GPU
// operator's nvidia.com/gpu.deploy.*, a user's nvidia.com/mig.config).
const OwnedAnnotation = "gantry-gpu.github.io/labels"

// NodeWriter publishes a Set as labels of one Node.
type NodeWriter struct {
	Client   kubernetes.Interface
	NodeName string
}

// NewInClusterNodeWriter uses the pod's service account (the DaemonSet's
// RBAC must allow get and patch on nodes). nodeName is usually the
// NODE_NAME environment variable set from spec.nodeName.
func NewInClusterNodeWriter(nodeName string) (*NodeWriter, error) {
	if nodeName == "" {
		return nil, fmt.Errorf("node labels: no node name; set NODE_NAME from the downward API (fieldRef spec.nodeName)")
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("node labels: %w (outside a cluster, write a node-feature-discovery feature file instead)", err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("node labels: %w", err)
	}
	return &NodeWriter{Client: c, NodeName: nodeName}, nil
}

// Write makes the Node's Gantry labels equal to s with one strategic merge
// patch: labels in s are set, labels of ours that s lacks are removed (those
// named in OwnedAnnotation and GFD's names, left behind by GFD), others are
// kept. Nothing is sent when the Node already has them.
func (w *NodeWriter) Write(ctx context.Context, s Set) error {
	for _, k := range s.Keys() {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("node label %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(s[k]); len(errs) > 0 {
			return fmt.Errorf("node label %s=%q: %s", k, s[k], strings.Join(errs, "; "))
		}
	}
	node, err := w.Client.CoreV1().Nodes().Get(ctx, w.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node labels: reading node %s: %w", w.NodeName, err)
	}
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
	if _, err := w.Client.CoreV1().Nodes().Patch(ctx, w.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
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
