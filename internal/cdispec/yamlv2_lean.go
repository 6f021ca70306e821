//go:build gantrylean

package cdispec

// yamlV2 in the lean per-container binary (gantry-runtime, built with the
// gantrylean tag) does not link yaml.v2, whose package init every container
// start would pay: a spec with a value yamlWriter cannot write itself is
// ErrFullYAML, and nvidia-ctk hands the command line to gantry.
var yamlV2 = func(any) ([]byte, error) { return nil, ErrFullYAML }
