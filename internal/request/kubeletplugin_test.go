package request

import (
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestBindMounts(t *testing.T) {
	got := BindMounts([]specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/a", Type: "bind", Source: "/host/a", Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/b", Source: "/host/b", Options: []string{"rbind", "ro"}},
		{Destination: "/c", Type: "none", Source: "/host/c", Options: []string{"bind", "ro", "rw"}},
		// tmpfs ignores its source: it mounts no host directory.
		{Destination: "/d", Type: "tmpfs", Source: "/var/lib/kubelet/device-plugins", Options: []string{"rw"}},
	})
	want := []Bind{{"/host/a", false}, {"/host/b", true}, {"/host/c", false}}
	if len(got) != len(want) {
		t.Fatalf("BindMounts: %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("BindMounts[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestKubeletPluginKeepsItsVariable: under runtime.kubernetes-env =
// "allocated", an unprivileged Kubernetes container that binds the
// kubelet's registration directory writable (NVIDIA's static device
// plugin DaemonSet) keeps its own NVIDIA_VISIBLE_DEVICES=all with no
// allocation, and says why; the same container without that bind, with it
// read-only, with the path only in its env, or outside Kubernetes under
// another rule, gets what it got before.
func TestKubeletPluginKeepsItsVariable(t *testing.T) {
	const reg = "/var/lib/kubelet/device-plugins"
	opts := DefaultOptions()
	opts.Allocated = func(pod, ctr string) ([]string, error) { return nil, nil }
	var asked []string
	opts.KubeletPluginDir = func(src string) (string, bool) {
		asked = append(asked, src)
		return reg, src == reg || src == "/var/lib/kubelet"
	}
	env := []string{EnvVisibleDevices + "=all", "DEVICE_PLUGIN_DIR=" + reg}
	for _, tc := range []struct {
		name  string
		binds []Bind
		priv  bool
		ann   map[string]string
		want  Mode
		rule  bool
	}{
		{"binds the registration directory", []Bind{{"/etc/config", true}, {reg, false}}, false, criAnn("p", "c"), All, true},
		{"binds the kubelet's root", []Bind{{"/var/lib/kubelet", false}}, false, criAnn("p", "c"), All, true},
		{"path only in the env", nil, false, criAnn("p", "c"), Void, false},
		{"read-only bind", []Bind{{reg, true}}, false, criAnn("p", "c"), Void, false},
		{"relative source", []Bind{{"var/lib/kubelet/device-plugins", false}}, false, criAnn("p", "c"), Void, false},
		{"another directory", []Bind{{"/srv/plugins", false}}, false, criAnn("p", "c"), Void, false},
		// Privileged or not Kubernetes: trusted as before, no rule needed.
		{"privileged", []Bind{{reg, false}}, true, criAnn("p", "c"), All, false},
		{"not Kubernetes", []Bind{{reg, false}}, false, nil, All, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := Parse(Input{Env: env, Annotations: tc.ann, Privileged: tc.priv, Binds: tc.binds}, opts)
			if err != nil {
				t.Fatal(err)
			}
			if req.Devices.Mode != tc.want {
				t.Errorf("devices %v, want %v (warnings %q)", req.Devices.Mode, tc.want, req.Warnings)
			}
			if got := req.KubeletPlugin != ""; got != tc.rule {
				t.Errorf("KubeletPlugin %q, want set %v", req.KubeletPlugin, tc.rule)
			}
			if tc.rule && (!strings.Contains(req.KubeletPlugin, reg) || !strings.Contains(req.KubeletPlugin, "kubernetes-env")) {
				t.Errorf("KubeletPlugin %q should name the directory and the setting", req.KubeletPlugin)
			}
		})
	}
	for _, src := range asked {
		if src == "/etc/config" {
			t.Errorf("a read-only bind's source %s was looked up", src)
		}
	}
	// runtime.accept-env-unprivileged = false still wins: no env request
	// in an unprivileged container, plugin or not.
	strict := opts
	strict.AcceptEnvWhenUnprivileged = false
	req, err := Parse(Input{Env: env, Annotations: criAnn("p", "c"), Binds: []Bind{{reg, false}}}, strict)
	if err != nil || req.Devices.Mode != Void {
		t.Errorf("accept-env-unprivileged = false: %+v, %v; want no devices", req, err)
	}
}
