package containerhook

import (
	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/request"
)

// RequestOptions are the host's rules for reading a container's GPU request,
// from the configuration: one place for every front end that reads requests
// (gantry-runtime and gantry-hook), so that they cannot drift apart.
func RequestOptions(cfg config.Config) request.Options {
	opts := request.DefaultOptions()
	opts.AcceptEnvWhenUnprivileged = cfg.Runtime.AcceptEnvUnprivileged
	opts.AcceptVolumeMounts = cfg.Runtime.AcceptVolumeMounts
	opts.DisableRequire = cfg.Runtime.DisableRequire
	opts.SwarmResource = cfg.Runtime.SwarmResource
	if cfg.CDI.Kind != "" {
		opts.DefaultKind = cfg.CDI.Kind
	}
	if cfg.CDI.AnnotationPrefixes != nil {
		opts.AnnotationPrefixes = cfg.CDI.AnnotationPrefixes
	}
	return opts
}
