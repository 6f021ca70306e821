package doctor

// dockerCDIAdvice returns advice, the CDI way to give a Docker container
// GPUs (--device nvidia.com/gpu=...), when the running dockerd on
// opts.DockerSocket has CDI, else "". Docker reads CDI specs from 25.0
// with the cdi feature on (default from 28); its GET /info then lists
// the spec directories (CDISpecDirs), empty or absent otherwise: Debian's
// dockerd 20.10 takes --device nvidia.com/gpu=all for a host path and
// fails. No daemon answering: not said either.
func dockerCDIAdvice(opts Options, advice string) string {
	if dockerCDI(opts) {
		return advice
	}
	return ""
}

// dockerCDI reports whether the running dockerd has CDI (asked once per
// doctor run and socket).
func dockerCDI(opts Options) bool {
	if has, ok := opts.dockerCDIs[opts.DockerSocket]; ok {
		return has
	}
	info, err := askDockerd(opts.DockerSocket)
	has := err == nil && len(info.CDISpecDirs) > 0
	if opts.dockerCDIs != nil {
		opts.dockerCDIs[opts.DockerSocket] = has
	}
	return has
}
