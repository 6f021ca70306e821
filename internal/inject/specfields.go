package inject

import ocispecs "github.com/opencontainers/runtime-spec/specs-go"

// SpecFields are the parts of config.json a GPU request is read from (the
// process's env and bounding capabilities, the mounts, the annotations) and
// the root filesystem's path. The runtime and the prestart hook decode only
// them: a whole ocispecs.Spec costs several times more, and neither needs
// the rest to decide or to find the root filesystem.
type SpecFields struct {
	Root *struct {
		Path string `json:"path"`
	} `json:"root"`
	Process *struct {
		Env          []string `json:"env"`
		Capabilities *struct {
			Bounding []string `json:"bounding"`
		} `json:"capabilities"`
	} `json:"process"`
	Mounts      []ocispecs.Mount  `json:"mounts"`
	Annotations map[string]string `json:"annotations"`
}

// Spec is a spec holding only f's fields, for ReadRequest and MountPaths.
func (f *SpecFields) Spec() *ocispecs.Spec {
	s := &ocispecs.Spec{Mounts: f.Mounts, Annotations: f.Annotations}
	if f.Process != nil {
		s.Process = &ocispecs.Process{Env: f.Process.Env}
		if f.Process.Capabilities != nil {
			s.Process.Capabilities = &ocispecs.LinuxCapabilities{Bounding: f.Process.Capabilities.Bounding}
		}
	}
	return s
}

// RootPath is root.path, "" when the spec has none.
func (f *SpecFields) RootPath() string {
	if f.Root == nil {
		return ""
	}
	return f.Root.Path
}
