package labels

import (
	"bytes"
	"fmt"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
)

// DefaultFeatureFile is where node-feature-discovery's local source reads
// Gantry's labels (GFD writes .../features.d/gfd).
const DefaultFeatureFile = "/etc/kubernetes/node-feature-discovery/features.d/gantry"

// FeatureFile renders a Set as a node-feature-discovery feature file: one
// key=value line per label, sorted by key.
func FeatureFile(s Set) []byte {
	var b bytes.Buffer
	for _, k := range s.Keys() {
		fmt.Fprintf(&b, "%s=%s\n", k, s[k])
	}
	return b.Bytes()
}

// WriteFeatureFile replaces path with the labels in one step: a temporary
// file in the same directory, synced, then renamed over path, so that
// node-feature-discovery never reads half a file. The directory must exist
// (it is node-feature-discovery's, usually a hostPath mount).
func WriteFeatureFile(path string, s Set) error {
	if err := atomicfile.Write(path, FeatureFile(s), atomicfile.Options{Mode: 0o644, Sync: true}); err != nil {
		return fmt.Errorf("writing labels to %s: %w (is node-feature-discovery's features.d directory mounted?)", path, err)
	}
	return nil
}
