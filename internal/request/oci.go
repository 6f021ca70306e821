package request

import (
	"path"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// InputFromSpec takes a request's Input from an OCI runtime spec: the
// process env, the annotations, the /dev/null mounts, the bind mounts and
// the privilege.
func InputFromSpec(spec *specs.Spec) Input {
	if spec == nil {
		return Input{}
	}
	in := Input{
		Annotations:       spec.Annotations,
		MountDestinations: DeviceMountDestinations(spec.Mounts),
		Privileged:        IsPrivileged(spec),
		Binds:             BindMounts(spec.Mounts),
	}
	if spec.Process != nil {
		in.Env = spec.Process.Env
	}
	return in
}

// DeviceMountDestinations returns the destinations of mounts whose source
// is /dev/null: only those can name devices, so an image cannot request a
// GPU by a VOLUME line under the devices root.
func DeviceMountDestinations(mounts []specs.Mount) []string {
	var out []string
	for _, m := range mounts {
		if path.Clean(m.Source) == "/dev/null" {
			out = append(out, m.Destination)
		}
	}
	return out
}

// IsPrivileged reports whether CAP_SYS_ADMIN is in the bounding set of the
// spec's process, NVIDIA's test for a privileged container (it also lets
// non-root users of such containers use the privileged MIG capabilities).
func IsPrivileged(spec *specs.Spec) bool {
	if spec == nil || spec.Process == nil || spec.Process.Capabilities == nil {
		return false
	}
	return slices.Contains(spec.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
}
