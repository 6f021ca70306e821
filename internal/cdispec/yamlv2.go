//go:build !gantrylean

package cdispec

import "go.yaml.in/yaml/v2"

// yamlV2 is yaml.v2's Marshal, for the values yamlWriter leaves to it.
var yamlV2 = yaml.Marshal
