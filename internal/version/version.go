// Package version holds the build's version, set at link time:
//
//	go build -ldflags "-X github.com/gantry-gpu/gantry/internal/version.Version=v1.2.3"
//
// It is a package of its own so that every front end can print it without
// linking the others.
package version

// Version is the Gantry version; "dev" for builds without -ldflags.
var Version = "dev"
